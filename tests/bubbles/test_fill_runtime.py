"""Schedule, gate and fill runtime of the Bubble Squeezer, in plain Python (threads and processes, no Ray):
a fill process trains a user TuneSpec's fused trial exactly as alone, and its failures are contained."""
import os
import pickle
import threading
import time

import pytest
import torch

from hydro.bubbles import BubbleGate, DedicatedHost, FailureKind, FillAborted, FillFailed, FillProcess, FillTooLarge, \
    LayerGate, SlotMode, UnitNeverFits
from hydro.pipeline import one_f_one_b, simulate
from hydro.pipeline.schedule import Op, bubble_fraction
from tests.bubbles.workload import plan, same_members, spec, train_alone, workload

MEMBER_IDS = ["m0", "m1", "m2"]
DEADLINE_S = 120.0  # generous bound of every wait in these tests: a machine under load is slow, a hang is endless


def _thread(target) -> threading.Thread:
    """A started daemon thread: one blocked forever cannot keep pytest from ending."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _joined(thread: threading.Thread) -> None:
    thread.join(timeout=DEADLINE_S)
    assert not thread.is_alive(), f"the thread still waits after {DEADLINE_S:.0f} s"


def _until(condition, what: str) -> None:
    """Poll ``condition()`` until true; fail (not hang) after :data:`DEADLINE_S`."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {DEADLINE_S:.0f} s"
        time.sleep(0.01)


def test_1f1b_order_and_bubble_fraction():
    schedule = one_f_one_b(3, 4)
    assert schedule[2][:2] == [Op("F", 0), Op("B", 0)]  # the last stage alternates at once
    assert schedule[0][:3] == [Op("F", 0), Op("F", 1), Op("F", 2)]  # warm-up of S - 1 forwards
    for stages, microbatches in [(2, 4), (3, 4), (4, 8)]:
        ops, bubbles = simulate(one_f_one_b(stages, microbatches), [1.0] * stages, [2.0] * stages)
        assert bubble_fraction(ops, bubbles) == pytest.approx((stages - 1) / (microbatches + stages - 1))
        assert all(b.length > 0 for b in bubbles)


def test_gate_blocks_outside_bubbles_and_respects_the_predicted_length():
    gate = BubbleGate()
    passed = threading.Event()
    waiter = _thread(lambda: (gate.wait_for(0.0), passed.set()))
    time.sleep(0.05)
    assert not passed.is_set()  # no bubble yet
    gate.bubble_started(0, 10 * DEADLINE_S, 0)  # (open until the waiter wakes, however loaded the machine)
    _joined(waiter)
    assert passed.is_set()
    gate.bubble_ended(0)
    outcome = []

    def long_layer():
        try:
            gate.wait_for(10.0)
            outcome.append("ran")
        except FillAborted:
            outcome.append("aborted")

    waiter = _thread(long_layer)
    gate.bubble_started(0, 0.5, 0)  # a 10 s layer does not fit a 0.5 s bubble
    time.sleep(0.05)
    assert outcome == []
    gate.abort()
    _joined(waiter)
    assert outcome == ["aborted"]
    with pytest.raises(FillAborted):
        gate.wait_for(0.0)


def test_one_slow_run_of_a_unit_does_not_change_the_bubble_it_asks_for():
    """A unit's cost is the median of its recent runs: one run that included a one-off piece of work does not
    make it wait for a bubble that never comes; a unit that is slow every time does ask for more."""
    gate = LayerGate(BubbleGate(always_open=True))
    gate.timed = True

    def run(unit: str, cpu_s: float) -> None:
        gate.boundary(unit)
        start = time.thread_time()
        while time.thread_time() - start < cpu_s:
            pass
        gate.boundary(None)

    for cpu_s in (0.01, 0.01, 0.3, 0.01, 0.01):
        run("spiky", cpu_s)
    for _ in range(3):
        run("slow", 0.05)
    assert gate.layer_cost["spiky"] < 0.05 and gate.layer_cost["slow"] >= 0.05


def _open_bubbles_until_done(gate: BubbleGate, waiter: threading.Thread, predicted_s: float) -> int:
    """Start bubbles predicted ``predicted_s`` until ``waiter`` ends; returns how many. The bubble stays open, so
    the waiter sees every start it wakes for open (each start posts the doorbell once), however late it wakes."""
    bubbles, deadline = 0, time.monotonic() + DEADLINE_S
    while waiter.is_alive() and time.monotonic() < deadline:
        gate.bubble_started(0, predicted_s, 0)
        bubbles += 1
        time.sleep(0.002)
    _joined(waiter)
    return bubbles


def test_a_unit_longer_than_every_bubble_is_reported_instead_of_waiting_forever():
    gate = BubbleGate(max_skipped=20)
    errors = []
    waiter = _thread(lambda: _catch(lambda: gate.wait_for(0.5, "B:layers.0"), errors))
    assert _open_bubbles_until_done(gate, waiter, 0.01) >= 20  # 20 bubbles predicted 10 ms: 500 ms fits none
    assert len(errors) == 1 and isinstance(errors[0], UnitNeverFits)
    assert "'B:layers.0' takes 500.00 ms" in str(errors[0]) and "at most 10.00 ms" in str(errors[0])


def test_a_unit_a_little_longer_than_every_bubble_runs_in_one_after_waiting_its_turn():
    """15 ms of work against 10 ms bubbles: after ``max_skipped`` bubbles it overruns the next one, rather than
    never running (the stage preempts it under SCHED_IDLE)."""
    gate = BubbleGate(max_skipped=20)
    errors, started = [], []
    waiter = _thread(lambda: _catch(lambda: (gate.wait_for(0.015, "F:layers.0"), started.append(True)), errors))
    bubbles = _open_bubbles_until_done(gate, waiter, 0.01)
    assert errors == [] and started == [True] and bubbles >= 21


def _catch(fn, errors: list) -> None:
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - the test inspects it
        errors.append(error)


class Bubbles:
    """Opens bubbles (``length_s`` each, predicted generously) in a thread until stopped; ``pause()`` waits for
    the open bubble to end and opens no more until ``resume()``."""

    def __init__(self, gate: BubbleGate, length_s: float = 0.004, predicted_s: float = 0.05) -> None:
        self.gate, self.stop = gate, threading.Event()
        self.count, self.paused = 0, False
        self.lock = threading.Lock()  # held while a bubble is open, and while paused
        self.thread = threading.Thread(target=self._run, args=(length_s, predicted_s), daemon=True)
        self.thread.start()

    def _run(self, length_s: float, predicted_s: float) -> None:
        while not self.stop.is_set():
            with self.lock:
                self.gate.bubble_started(0, predicted_s, 0)
                time.sleep(length_s)
                self.gate.bubble_ended(0)
            time.sleep(0.001)
            self.count += 1

    def pause(self) -> None:
        self.lock.acquire()
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self.lock.release()

    def end(self) -> None:
        if self.paused:  # by a test that failed before resuming (the lock may be the open bubble's otherwise)
            self.resume()
        self.stop.set()
        _joined(self.thread)


def _decide_all(fill: FillProcess, epochs: int, keep=lambda result: result.member_ids) -> list:
    """Decide every epoch result until ``epochs``: returns the (result, state) of each."""
    decided = []
    deadline = time.monotonic() + DEADLINE_S
    while len(decided) < epochs:
        assert time.monotonic() < deadline, f"{len(decided)} of {epochs} epochs after {DEADLINE_S:.0f} s"
        result = fill.poll()["result"]
        if result is None:
            time.sleep(0.01)
            continue
        decided.append((result, fill.decide(keep(result))))
    return decided


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fill_process_trains_a_tunespec_trial_in_bubbles_exactly_as_alone_and_continues_from_its_state():
    tune_spec, trial_plan = spec(epochs=3), plan()
    gate = BubbleGate()
    bubbles = Bubbles(gate)
    try:
        fill = FillProcess(gate, None, workload=workload(tune_spec), plan=trial_plan, member_ids=MEMBER_IDS)
        assert fill.member_ids == MEMBER_IDS
        # Epoch 1: every member goes on; epoch 2: m1 stops (as a per-member stopping rule would say).
        decided = _decide_all(fill, 2, keep=lambda r: [m for m in r.member_ids if r.epoch < 2 or m != "m1"])
        assert [r.epoch for r, _ in decided] == [1, 2]
        assert decided[1][1]["trial"]["member_ids"] == ["m0", "m2"]
        _until(lambda: fill.completed_steps >= 23, "3 steps into epoch 3")  # (10 steps per epoch): stop mid-epoch
        state = fill.stop()
    finally:
        bubbles.end()
    assert bubbles.count > fill.completed_steps  # it really waited for bubbles between layers
    alone = train_alone(tune_spec, trial_plan, 2)
    first, second = (r for r, _ in decided)
    expected = [alone_metrics for alone_metrics in _alone_epoch_metrics(tune_spec, trial_plan, 2)]
    assert first.metrics == expected[0] and second.metrics == expected[1]  # every metric, bit for bit
    assert same_members(decided[1][1], alone)
    assert state["trial"]["epoch"] == 2 and state["trial"]["step"] >= 3 and state["pending"] is None
    # Continue from the mid-epoch state in a new process, ungated: ends exactly as alone with m1 stopped.
    fill = FillProcess(BubbleGate(always_open=True), None, workload=workload(tune_spec), plan=trial_plan, state=state,
                       idle=False)
    (last, final), = _decide_all(fill, 1)
    alone.keep([0, 2])
    alone.run_epoch()
    assert last.epoch == 3 and last.member_ids == ["m0", "m2"] and same_members(final, alone)
    assert fill.poll()["finished"]
    assert fill.stop()["trial"]["epoch"] == 3


def _alone_epoch_metrics(tune_spec, trial_plan, epochs: int) -> list[dict]:
    torch.set_num_threads(1)
    from hydro.trial.unit import FusedTrial

    trial = FusedTrial(tune_spec, trial_plan, tune_spec.load_data())
    return [{k: [float(v) for v in values] for k, values in trial.run_epoch().items()} for _ in range(epochs)]


@pytest.mark.parametrize("fault, cause, kind", [("raise", "ZeroDivisionError: fault injected", FailureKind.RAISED),
                                                ("kill", "SIGKILL", FailureKind.DIED),
                                                ("hang", "has run for more than 2 s: the fill trial hangs",
                                                 FailureKind.HUNG)])
def test_a_failing_fill_process_is_contained_and_reported_with_its_cause(fault, cause, kind):
    gate = BubbleGate()
    bubbles = Bubbles(gate)
    try:
        fill = FillProcess(gate, None, workload=workload(spec(fault=fault, at=15)), plan=plan(),
                           member_ids=MEMBER_IDS, idle=False, unit_timeout_s=2)
        _until(lambda: fill.poll()["result"] is not None, "epoch 1")  # (10 loss calls + evaluation) is fine
        bubbles.pause()  # the fault (in epoch 2) waits for bubbles: the decision's answer arrives first
        state = fill.decide(MEMBER_IDS)
        bubbles.resume()
        assert same_members(state, train_alone(spec(), plan(), 1))  # the last state to move on from
        with pytest.raises(FillFailed, match=cause) as failed:
            _until(lambda: fill.poll() is None, "the fault")  # (poll returns a dict until it raises)
        assert failed.value.failure.kind is kind and not fill._process.is_alive()
        assert pickle.loads(pickle.dumps(failed.value)).failure == failed.value.failure  # crosses Ray intact
        with pytest.raises(FillFailed, match=cause):  # every later request says the same, at once
            fill.stop()
    finally:
        bubbles.end()
    gate.bubble_started(0, 1.0, 0)  # the stage's side of the gate still works (never blocks)
    gate.bubble_ended(0)


def test_a_fill_that_does_not_fit_at_all_is_refused_and_a_partial_fit_trains_fewer_members():
    with pytest.raises(FillTooLarge, match=r"more than the 0.0 MiB its host can spare"):
        FillProcess(BubbleGate(), None, workload=workload(spec()), plan=plan(), member_ids=MEMBER_IDS,
                    memory_budget_bytes=1000)
    from hydro.bubbles.fit import member_bytes, members_that_fit

    tune_spec = spec()
    data = tune_spec.load_data()
    one = member_bytes(tune_spec, plan().members[0][1], 1, False, data)
    assert members_that_fit(one, 3, one) == 1  # two need more
    assert members_that_fit(one, 3, 2 * one + 1) == 2
    assert members_that_fit(one, 3, one * 100) == 3
    assert members_that_fit(one, 3, one - 1) == 0


@pytest.mark.parametrize("found_by", ["status", "watchdog"])
def test_a_failed_fill_is_reported_once_whoever_finds_it_and_the_slot_is_free_again(found_by):
    """Whether ``fill_status`` or the watchdog (``check_fill``) finds the failure first, the cause is reported
    exactly once and the host can take the next fill."""
    host = DedicatedHost("worker", timeouts={"unit_timeout_s": 2})
    host.attach_fill(workload(spec(fault="raise", at=12)), plan(), SlotMode.DEDICATED, member_ids=MEMBER_IDS)
    found = []

    def failure_found() -> bool:
        if found_by == "watchdog":
            host.check_fill()
            if host.fill is None:
                found.append(host.fill_status())
        else:
            status = host.fill_status()
            if status is not None and "failed" in status:
                found.append(status)
        return bool(found)

    _until(failure_found, f"the failure found by the {found_by}")
    status, = found
    assert set(status) == {"failed", "failure"} and "ZeroDivisionError: fault injected" in status["failed"]
    failure = status["failure"]
    assert failure.kind is FailureKind.RAISED and failure.cause == status["failed"]
    assert failure.exception == "ZeroDivisionError: fault injected by the test's loss"
    assert failure.exception_types[:2] == ("builtins.ZeroDivisionError", "builtins.ArithmeticError")
    assert host.fill_status() is None  # reported once
    assert host.attach_fill(workload(spec()), plan(), SlotMode.DEDICATED, member_ids=MEMBER_IDS) == MEMBER_IDS
    assert host.detach_fill()["state"] is not None


def test_a_status_request_is_answered_at_the_fills_news_not_at_its_time_limit():
    """``fill_status(wait_s)`` returns when the fill posts an epoch or its process ends, without the caller
    polling the host (the stage's process) many times a second; with no news it returns after ``wait_s``."""
    host = DedicatedHost("worker")
    host.attach_fill(workload(spec(epochs=2)), plan(), SlotMode.DEDICATED, member_ids=MEMBER_IDS)
    for epoch in (1, 2):
        start = time.monotonic()
        status = host.fill_status(wait_s=DEADLINE_S)
        assert status["result"].epoch == epoch and time.monotonic() - start < DEADLINE_S
        assert host.fill_decide(MEMBER_IDS)["state"]["trial"]["epoch"] == epoch
    assert host.fill_status(wait_s=0.5) == {"result": None, "finished": True}  # (its end was news)
    start = time.monotonic()
    assert host.fill_status(wait_s=0.5) == {"result": None, "finished": True}  # nothing new: after wait_s
    assert time.monotonic() - start >= 0.5
    host.detach_fill()
    host.attach_fill(workload(spec(fault="hang", at=5)), plan(), SlotMode.DEDICATED, member_ids=MEMBER_IDS)
    fill = host.fill
    killer = threading.Timer(1.0, fill.kill)  # as the OOM killer would, while the caller waits
    killer.daemon = True
    killer.start()
    start = time.monotonic()
    status = host.fill_status(wait_s=DEADLINE_S)
    _joined(killer)
    assert "failed" in status and "SIGKILL" in status["failed"] and time.monotonic() - start < DEADLINE_S


def test_a_starved_idle_fill_is_not_taken_for_a_hung_one():
    """A fill under ``SCHED_IDLE`` on a core a normal-priority process keeps busy barely runs: its unit in flight (its
    loss, which burns 0.2 s of CPU) stays in flight for six times its unit time limit, and the watchdog, which does
    not count the time it waited for the core, finds it slow, not hung. (It starts at normal priority, so that its
    first steps do not wait for an idle core on a loaded machine, and is set to ``SCHED_IDLE``, every thread, as a
    gated fill runs, once it is inside its loss. Should it be starved between two units instead, it reaches its next
    loss with a few ms of CPU and is starved inside that: the test never depends on where the starvation caught it.)"""
    import subprocess
    import sys

    from hydro.bubbles.fill_process import _UNIT_STARTED

    core = min(os.sched_getaffinity(0))
    fill = FillProcess(BubbleGate(always_open=True), {core}, workload=workload(spec(epochs=50, fault="slow", at=1)),
                       plan=plan(), member_ids=MEMBER_IDS, idle=False, unit_timeout_s=0.5)
    starved_for = 6 * fill.unit_timeout_s
    try:
        seen = [0.0, 0.0]  # the unit in flight and when this test first saw it

        def in_its_loss() -> bool:  # one unit in flight for 50 ms: the loss (0.2 s of CPU), not a layer (~1 ms)
            started, now = fill._progress[_UNIT_STARTED], time.monotonic()
            if started != seen[0]:
                seen[:] = [started, now]
            return bool(started) and now - seen[1] > 0.05

        _until(in_its_loss, "a unit in flight for 50 ms")
        for thread in os.listdir(f"/proc/{fill._process.pid}/task"):
            os.sched_setscheduler(int(thread), os.SCHED_IDLE, os.sched_param(0))
        busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\n"
                                                       f"print(flush=True)\nwhile True:\n    pass"],
                                stdout=subprocess.PIPE)
        longest, unit, since = 0.0, None, 0.0  # the longest wall time one unit was seen in flight
        try:
            busy.stdout.readline()
            deadline = time.monotonic() + DEADLINE_S
            while longest <= starved_for:
                assert time.monotonic() < deadline, f"no unit in flight for {starved_for} s in {DEADLINE_S:.0f} s"
                fill.check()  # the watchdog, as a host runs it
                started, now = fill._progress[_UNIT_STARTED], time.monotonic()
                if started != unit:
                    unit, since = started, now
                if started:
                    longest = max(longest, now - since)
                time.sleep(0.05)
            fill.check()
        finally:
            busy.kill()
            busy.wait()
            busy.stdout.close()
    finally:
        fill.kill()
    assert fill.failure is None and longest > starved_for
