"""Schedule, gate and fill runtime of the Bubble Squeezer, in plain Python (threads, no Ray)."""
import threading
import time

import pytest
import torch

from hydro.bubbles import BubbleGate, FillAborted, FillSpec, FillTrial, one_f_one_b, simulate
from hydro.bubbles.fill_process import FillProcess, FillProcessError
from hydro.bubbles.schedule import Op, bubble_fraction
from tests.bubbles.alone import train_alone

SPEC = FillSpec(configs=[{"lr": 0.1, "momentum": 0.9}, {"lr": 0.02}, {"lr": 0.05, "momentum": 0.5}])


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels as a stage process, so results are bit-comparable
    yield
    torch.set_num_threads(threads)


def test_1f1b_order_and_bubble_fraction():
    schedule = one_f_one_b(3, 4)
    assert schedule[2][:2] == [Op("F", 0), Op("B", 0)]  # the last stage alternates at once
    assert schedule[0][:3] == [Op("F", 0), Op("F", 1), Op("F", 2)]  # warm-up of S - 1 forwards
    for stages, microbatches in [(2, 4), (3, 4), (4, 8)]:
        ops, bubbles = simulate(one_f_one_b(stages, microbatches), [1.0] * stages, [2.0] * stages)
        assert bubble_fraction(ops, bubbles) == pytest.approx((stages - 1) / (microbatches + stages - 1))
        assert all(b.length > 0 for b in bubbles)


def _same(a: FillTrial, b: FillTrial) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def _alone(steps: int) -> FillTrial:
    return train_alone(SPEC, steps)


def test_fill_paused_and_resumed_across_bubbles_trains_exactly_as_alone():
    gate = BubbleGate()
    trial = FillTrial(SPEC, gate)
    trainer = threading.Thread(target=trial.train, args=(8,))
    trainer.start()
    bubbles = 0
    while trial.completed_steps < 8 and bubbles < 5000:
        # Bubbles open 1 ms, shorter than a step, so steps are split over several. The prediction is generous
        # (50 ms) so that a unit slowed by a loaded machine still fits: the test is about exact pausing, not
        # about the fit rule (tested below), and a unit that never fits would wait forever.
        gate.bubble_started(0, 0.05, 0)
        time.sleep(0.001)
        gate.bubble_ended(0)
        time.sleep(0.001)
        bubbles += 1
    if trial.completed_steps < 8:
        gate.abort()
    trainer.join(timeout=60)
    assert not trainer.is_alive()
    assert trial.completed_steps == 8 and bubbles > 8  # it really paused between layers
    assert _same(trial, _alone(8))


def test_gate_blocks_outside_bubbles_and_respects_the_predicted_length():
    gate = BubbleGate()
    passed = threading.Event()
    waiter = threading.Thread(target=lambda: (gate.wait_for(0.0), passed.set()))
    waiter.start()
    time.sleep(0.05)
    assert not passed.is_set()  # no bubble yet
    gate.bubble_started(0, 0.001, 0)
    waiter.join(timeout=5)
    assert passed.is_set()
    outcome = []

    def long_layer():
        try:
            gate.wait_for(10.0)
            outcome.append("ran")
        except FillAborted:
            outcome.append("aborted")

    waiter = threading.Thread(target=long_layer)
    waiter.start()
    gate.bubble_started(0, 0.5, 0)  # a 10 s layer does not fit a 0.5 s bubble
    time.sleep(0.05)
    assert outcome == []
    gate.abort()
    waiter.join(timeout=5)
    assert outcome == ["aborted"]
    with pytest.raises(FillAborted):
        gate.wait_for(0.0)


def _bubbles_until(gate: BubbleGate, done, tries: int = 5000) -> None:
    """Open 10 ms bubbles, one after another, until ``done()``."""
    for _ in range(tries):
        if done():
            return
        gate.bubble_started(0, 0.01, 0)
        time.sleep(0.01)
        gate.bubble_ended(0)


def test_stopping_mid_step_keeps_every_completed_step_and_resumes_exactly():
    gate = BubbleGate()
    trial = FillTrial(SPEC, gate)
    finished = []
    trainer = threading.Thread(target=lambda: finished.append(trial.train(100)))
    trainer.start()
    _bubbles_until(gate, lambda: trial.completed_steps >= 3)
    gate.abort()  # aborts the step in flight at a layer boundary
    trainer.join()
    assert finished == [False]
    checkpoint = trial.checkpoint()
    done = checkpoint["completed_steps"]
    assert done >= 3 and _same(trial, _alone(done))
    resumed = FillTrial.from_checkpoint(checkpoint)
    for _ in range(4):
        resumed.step()
    assert _same(resumed, _alone(done + 4))


def test_fill_process_trains_exactly_as_alone_and_snapshots_at_step_boundaries():
    gate = BubbleGate()
    fill = FillProcess(gate, None, spec=SPEC, steps=100, idle=False, snapshot_every=2)
    assert fill.num_members == 3
    _bubbles_until(gate, lambda: fill.completed_steps >= 4)
    status = fill.status()
    snapshot = status["snapshot"]
    assert snapshot["completed_steps"] % 2 == 0 and snapshot["completed_steps"] >= 2
    assert len(status["losses"]) == 3 and status["member_ids"] == [0, 1, 2]
    assert _same(FillTrial.from_checkpoint(snapshot), _alone(snapshot["completed_steps"]))
    assert [done for done, _ in status["snapshot_losses"]] == list(range(2, snapshot["completed_steps"] + 1, 2))
    later = fill.status(since=snapshot["completed_steps"])  # only what came after: no snapshot resent
    assert all(done > snapshot["completed_steps"] for done, _ in later["snapshot_losses"])
    assert later["snapshot"] is None or later["snapshot"]["completed_steps"] > snapshot["completed_steps"]
    assert fill.activity() and all(start <= end for start, end in fill.activity())
    checkpoint = fill.stop()
    assert checkpoint["completed_steps"] >= 4
    assert _same(FillTrial.from_checkpoint(checkpoint), _alone(checkpoint["completed_steps"]))


def test_fill_process_failure_is_raised_with_the_childs_traceback():
    with pytest.raises(FillProcessError, match="NoSuchModel"):
        FillProcess(BubbleGate(), None, spec=FillSpec(configs=[{"lr": 0.1}], model="NoSuchModel"))
