"""A fill trial in its own process beside a pipeline stage, on the stage's cores, under ``SCHED_IDLE``.

A process of its own rather than a thread of the stage: a thread shares the stage's GIL, and a fill thread
preempted while holding it delays the stage each time a wait ends (measured: +9% main-job iteration time
in ``benchmarks/bubble_squeeze.py`` with a ``SCHED_IDLE`` thread). It is also what makes the fill untrusted
but harmless: whatever the user's code does in it (raises, is SIGKILLed, hangs), the stage only ever writes
to the shared :class:`~hydro.bubbles.gate.BubbleGate`, and every request to the child has a deadline.

The child trains a :class:`~hydro.trial.unit.FusedTrial` (the user's ``TuneSpec``, the trial's plan) with a
:class:`~hydro.bubbles.layer_gate.LayerGate` epoch by epoch; after each epoch it posts the members' metrics
and waits for the caller's decision (the members that go on), then keeps a snapshot of its state. Progress
counters are in shared memory (read without waking the child); results and states travel over a pipe on
request, answered by a control thread in the child, as plain pickles (torch's multiprocessing pickler would
pass tensors as shared-memory handles that die with the child).

Children are forked from a *fill server* (multiprocessing's ``forkserver``) that imported torch and this module
once: a fill starts in milliseconds, and none of its start-up runs at normal priority beside the stage (a
``spawn`` child imported torch for seconds before it could lower its priority).
"""
from __future__ import annotations

import copy
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from hydro.trial.plan import TrialPlan
from hydro.trial.spec import TRAIN_LOSS
from hydro.trial.unit import FusedTrial

from .fit import member_bytes, members_that_fit
from .gate import BubbleGate, FillAborted
from .layer_gate import LayerGate

_STEPS, _COMPUTE_S, _UNIT_STARTED, _RAISED, _TRAINER_TID = range(5)  # slots of the progress array the child writes
START_TIMEOUT_S = 300.0  # loading the data, measuring what fits and fusing
ANSWER_TIMEOUT_S = 30.0
UNIT_TIMEOUT_S = 120.0


_server_preload: list[str] = []  # what this process's fill server imports, once set


def start_fill_server(preload: Sequence[str] = ()) -> None:
    """Start this process's fill server, the process fill processes are forked from, unless it runs. It imports
    torch (and ``torch._dynamo``), this module and ``preload`` once; the first call chooses ``preload``. ``preload``: modules every child
    would import anyway, e.g. those of the parent's ``__main__`` (multiprocessing runs a script's ``__main__``
    again in each child, so a Ray worker's children would each import Ray). Call it when the host starts,
    before the main job runs."""
    if not _server_preload:
        # torch._dynamo: what torch's optimizers import on first use, a second or more of every fill's start
        _server_preload.extend([__name__, "torch._dynamo", *preload])
        multiprocessing.get_context("forkserver").set_forkserver_preload(_server_preload)
    multiprocessing.forkserver.ensure_running()


class FillTooLarge(MemoryError):
    """Not even one member of the fill trial fits the memory its host can spare; the message gives the numbers."""


RAISED = "the fill trial raised in its process"


class FailureKind(Enum):
    """How a fill trial failed."""

    RAISED = "raised"  # its own code raised an exception (in the child: it would raise again)
    DIED = "died"      # its process was killed (e.g. by the OOM killer) or exited
    HUNG = "hung"      # no answer, or one unit of work running too long


@dataclass(frozen=True)
class FillFailure:
    """Why a fill trial failed: ``cause`` in words (with the child's traceback when it raised); when it raised,
    ``exception`` (``Type: message``) and ``exception_types`` (the qualified names of the exception's classes,
    most derived first) say what."""

    kind: FailureKind
    cause: str
    exception: str = ""
    exception_types: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.cause


class FillFailed(RuntimeError):
    """The fill trial's process failed: an exception (the message carries the child's traceback), a crash (the
    signal or exit code) or a hang (no answer, or one unit running too long). The process is gone. ``failure``:
    the :class:`FillFailure`."""

    def __init__(self, failure: FillFailure) -> None:
        super().__init__(failure)  # the one argument: pickles (e.g. through Ray) back to itself; str() is the cause
        self.failure = failure


@dataclass(frozen=True)
class EpochResult:
    """The members' metrics after ``epoch`` (1-based): name -> values in ``member_ids`` order."""

    epoch: int
    member_ids: list[str]
    metrics: dict[str, list[float]]


class FillProcess:
    """Runs a fused trial of ``plan``'s members in a child process until ``epochs`` (default: the spec's).

    ``workload``: the pickled ``TuneSpec`` (a cloudpickle, so the child needs no import of the user's file).
    ``state``: a state from :meth:`decide` or :meth:`stop` to continue from (else new ``member_ids``, as many
    of them as fit ``memory_budget_bytes``: :attr:`member_ids` says which; ``one_member_bytes``: one member's
    step peak if the caller measured it, see :func:`~hydro.bubbles.fit.members_that_fit`). ``idle=True`` (gated fill): the
    child runs under Linux's ``SCHED_IDLE``, so the stage preempts it the moment its wait ends.
    A unit running longer than ``unit_timeout_s``, or a request unanswered within ``answer_timeout_s`` (neither
    counting the time the child waited for a core: starved is not hung), is a hang: the child is killed and
    :class:`FillFailed` raised, as for an exception or a crash.
    """

    def __init__(self, gate: BubbleGate, cpus: set[int] | None, *, workload: bytes, plan: TrialPlan,
                 member_ids: Sequence[str] | None = None, state: dict | None = None, idle: bool = True,
                 memory_budget_bytes: int | None = None, one_member_bytes: int | None = None,
                 epochs: int | None = None,
                 answer_timeout_s: float = ANSWER_TIMEOUT_S, unit_timeout_s: float = UNIT_TIMEOUT_S) -> None:
        if (member_ids is None) == (state is None):
            raise ValueError("FillProcess: give exactly one of member_ids (a new fill trial) or state (one to "
                             "continue)")
        start_fill_server()  # (already running: nothing to do)
        context = multiprocessing.get_context("forkserver")
        self._conn, child_conn = context.Pipe()
        self._news, child_news = context.Pipe(duplex=False)  # the child says it posted an epoch, ended or raised
        self._progress = context.RawArray("d", 5)
        self._lock = threading.Lock()  # one request/answer on the pipe at a time
        self._news_lock = threading.Lock()
        self._reap_lock = threading.Lock()  # the child's exit status is read by one thread at a time (_alive/_join)
        self.gate, self.answer_timeout_s, self.unit_timeout_s = gate, answer_timeout_s, unit_timeout_s
        self.failure: FillFailure | None = None
        self._unit_seen: tuple[float, _LiveClock | None] = (0.0, None)  # the unit in flight (its start), its clock
        self._process = context.Process(
            target=_child_main, name="hydro-fill", daemon=True,
            args=(workload, plan, None if member_ids is None else list(member_ids), pickle.dumps(state),
                  memory_budget_bytes, one_member_bytes, gate, cpus, idle, epochs, child_conn, child_news,
                  self._progress))
        self._process.start()
        child_news.close()
        with self._lock:
            self.member_ids: list[str] = self._answer(START_TIMEOUT_S)

    @property
    def completed_steps(self) -> int:
        """Training steps done in this process."""
        return int(self._progress[_STEPS])

    @property
    def compute_s(self) -> float:
        """Seconds the trial has spent in its units (CPU time on the CPU, device time on a GPU; inside bubbles when
        gated)."""
        return self._progress[_COMPUTE_S]

    def check(self) -> None:
        """Raise :class:`FillFailed` if the child has died, hangs in a unit or its training raised (the watchdog:
        it never waits for a request in flight, which reports any failure itself)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._check()
        finally:
            self._lock.release()

    def _check(self) -> None:
        """:meth:`check` with ``_lock`` held."""
        if self.failure is not None:
            raise FillFailed(self.failure)
        if not self._alive():
            self._fail(self._exit_cause())
        if self._progress[_RAISED]:  # the child answers any request with the error and its traceback
            self._send("poll")
            self._answer(self.answer_timeout_s)
        if self._unit_running_s() > self.unit_timeout_s:
            self._fail(FillFailure(FailureKind.HUNG, f"one unit of work (a layer, the loss or an optimizer step) has "
                                                     f"run for more than {self.unit_timeout_s:.0f} s: the fill trial "
                                                     f"hangs"))

    def _unit_running_s(self) -> float:
        """Seconds the unit in flight has run since the watchdog first saw it (0 when none), on a
        :class:`_LiveClock` of the training thread: a fill under ``SCHED_IDLE`` that the stage and a busy machine
        starve is not a hung one. A hang is found at most one watchdog call later than ``unit_timeout_s``."""
        started = self._progress[_UNIT_STARTED]
        if not started:
            return 0.0
        if self._unit_seen[0] != started:
            self._unit_seen = (started, _LiveClock(self._process.pid, int(self._progress[_TRAINER_TID])))
        return self._unit_seen[1].read()

    def poll(self) -> dict:
        """``{"result": EpochResult | None (awaiting a decision), "finished": bool}``."""
        return self._request("poll")

    def wait_news(self, timeout_s: float) -> None:
        """Wait, at most ``timeout_s`` and without using the CPU, until the child posts an epoch result, ends its
        training or raises, or its process ends (then :meth:`poll` tells what happened): a caller that waits here
        before each poll learns of an epoch's end at once without asking the host many times a second."""
        with self._news_lock:
            multiprocessing.connection.wait([self._news, self._process.sentinel], timeout_s)
            try:
                while self._news.poll():
                    self._news.recv_bytes()
            except (EOFError, OSError):  # the child has ended: poll() reports how
                pass

    def decide(self, keep: Sequence[str]) -> dict:
        """The members of the posted epoch result that go on (none: the trial ends); returns the trial's state
        after dropping the others (to continue from, anywhere)."""
        return self._request("decide", list(keep))

    def activity(self) -> list[tuple[float, float]]:
        """Wall-clock ``(start, end)`` of the trial's recent units of work (layers, loss, optimizer step)."""
        return self._request("activity")

    def stop(self) -> dict:
        """Stop at the next layer boundary (the step in flight is dropped); returns the state to continue from
        (completed steps, and an epoch result still awaiting its decision)."""
        self.gate.abort()
        state = self._request("stop")
        self._join(self.answer_timeout_s)
        return state

    def kill(self) -> None:
        """End the child now (it is untrusted: no clean-up is waited for)."""
        if self._alive():
            os.kill(self._process.pid, signal.SIGKILL)
        self._join()

    def _alive(self) -> bool:
        with self._reap_lock:
            return self._process.is_alive()

    def _join(self, timeout_s: float | None = None) -> int | None:
        """Wait for the child's end (at most ``timeout_s``); its exit code, ``None`` while it runs. Only one thread
        reads the exit status at a time: a forkserver child's comes once through its sentinel, and a second
        thread reading it at the same moment would record exit code 255 instead of, e.g., SIGKILL's -9."""
        multiprocessing.connection.wait([self._process.sentinel], timeout_s)  # (waiting reads nothing)
        with self._reap_lock:
            self._process.join(0)
            return self._process.exitcode

    def _request(self, command: str, argument=None):
        with self._lock:
            self._check()
            self._send(command, argument)
            return self._answer(self.answer_timeout_s)

    def _send(self, command: str, argument=None) -> None:
        try:
            self._conn.send((command, argument))
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self._fail(self._exit_cause())

    def _answer(self, timeout_s: float):
        """The child's answer; it hangs if it has not answered within ``timeout_s``, not counting the time it was
        ready but waited for a core (a starved ``SCHED_IDLE`` child is slow, not hung)."""
        clock = _LiveClock(self._process.pid, None)
        while not self._conn.poll(0.05):
            if not self._alive() and not self._conn.poll(0):
                self._fail(self._exit_cause())
            if clock.read() > timeout_s:
                self._fail(FillFailure(FailureKind.HUNG, f"the fill trial's process did not answer within "
                                                         f"{timeout_s:.0f} s: it hangs"))
        try:
            kind, payload = pickle.loads(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._fail(self._exit_cause())
        if kind == "too_large":
            self._join()
            raise FillTooLarge(payload)
        if kind == "error":
            self._fail(FillFailure(FailureKind.RAISED, f"{RAISED}:\n{payload['traceback']}", payload["exception"],
                                   payload["types"]))
        return payload

    def _exit_cause(self) -> FillFailure:
        code = self._join(5)
        if code is not None and code < 0:
            return FillFailure(FailureKind.DIED, f"the fill trial's process was killed by "
                                                 f"{signal.Signals(-code).name} (e.g. the OOM killer)")
        return FillFailure(FailureKind.DIED, f"the fill trial's process exited unexpectedly (exit code {code})")

    def _fail(self, failure: FillFailure):
        """Record ``failure``, kill the child, raise :class:`FillFailed`."""
        self.failure = failure
        self.kill()
        raise FillFailed(failure)


def _thread_sample(pid: int, tid: int | None) -> tuple[bool, float] | None:
    """Whether thread ``tid`` of process ``pid`` (``None``: any of its threads) is runnable (running or waiting for
    a core), and its (their) CPU seconds; ``None`` where ``/proc`` does not say."""
    runnable, cpu = False, 0.0
    try:
        for thread in [tid] if tid is not None else os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/stat") as stat, \
                    open(f"/proc/{pid}/task/{thread}/schedstat") as schedstat:
                runnable |= stat.read().rpartition(")")[2].split()[0] == "R"
                cpu += int(schedstat.read().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return None
    return runnable, cpu


class _LiveClock:
    """Seconds a thread (``tid``; ``None``: the whole process) has been running or blocked since the clock's start,
    not those it was ready but waited for a core. Between two reads it counts its CPU time if it is runnable at the
    later read, the whole interval if it sleeps or blocks; where ``/proc`` says nothing, wall time. (The kernel's runqueue-wait
    counter would be exact, but it is updated only when the thread gets a core, so a starved thread's is stale.)"""

    def __init__(self, pid: int, tid: int | None) -> None:
        self.pid, self.tid = pid, tid
        self.then, self.sample, self.counted = time.monotonic(), _thread_sample(pid, tid), 0.0

    def read(self) -> float:
        now, sample = time.monotonic(), _thread_sample(self.pid, self.tid)
        if sample is None or self.sample is None or not sample[0]:
            self.counted += now - self.then
        else:
            self.counted += sample[1] - self.sample[1]
        self.then, self.sample = now, sample
        return self.counted


class _Runner:
    """The child's training thread: epochs of the trial, each ending in a posted result and a decision."""

    def __init__(self, trial: FusedTrial, gate: LayerGate, state: dict | None, epochs: int, progress, news) -> None:
        self.trial, self.gate, self.epochs, self.progress, self.news = trial, gate, epochs, progress, news
        self.pending: EpochResult | None = state["pending"] if state else None
        self.train_loss: torch.Tensor | None = state["train_loss"] if state else None  # epoch awaiting evaluation
        self.keep: list[str] | None = None
        self.snapshot: dict | None = None
        self.finished, self.stopping = False, False
        self.failure: dict | None = None  # the error payload (see _error) of the training thread
        self.changed = threading.Condition()
        self._rng = torch.get_rng_state()  # at the start of the step in flight (an aborted step consumed some)

    def state(self) -> dict:
        """A copy (the trial trains on while the copy is sent) of everything to continue from."""
        state = self.trial.state_dict()
        state["torch_rng"] = self._rng
        return copy.deepcopy({"trial": state, "pending": self.pending, "train_loss": self.train_loss})

    def run(self) -> None:
        self.progress[_TRAINER_TID] = threading.get_native_id()  # the host's watchdog reads its scheduling stats
        try:
            while self._epoch():
                pass
        except FillAborted:
            return
        except RuntimeError as error:  # an abort raised inside a backward hook arrives wrapped
            if not isinstance(error.__cause__, FillAborted) and "FillAborted" not in str(error):
                self._raised()
        except BaseException:  # noqa: BLE001 - reported on the next request
            self._raised()
        finally:
            self.progress[_UNIT_STARTED] = 0.0  # no unit in flight: an error is not taken for a hang
            with self.changed:
                self.changed.notify_all()
            self._tell()

    def _tell(self) -> None:
        """Wake a host waiting in :meth:`FillProcess.wait_news`."""
        try:
            self.news.send_bytes(b"")
        except OSError:  # the host has gone: nobody waits
            pass

    def _raised(self) -> None:
        """Keep the training thread's error for the next request and tell the host's watchdog."""
        self.failure = _error()
        self.progress[_RAISED] = 1.0

    def _epoch(self) -> bool:
        """Train, evaluate and post one epoch, wait for its decision; ``False`` when the trial is done."""
        trial = self.trial
        if self.pending is None:
            if self.train_loss is None:
                if trial.epoch >= self.epochs:
                    self.finished = True
                    self._tell()
                    return False
                while True:
                    self._rng = torch.get_rng_state()
                    if trial.train_step() is None:  # the epoch has no batch left
                        break
                    self.progress[_STEPS] += 1
                    self.progress[_COMPUTE_S] = self.gate.compute_s
                self._rng = torch.get_rng_state()
                self.train_loss = trial.train_epoch()  # the epoch's mean (its steps are done)
            metrics = {TRAIN_LOSS: self.train_loss, **trial.evaluate()}
            self.gate.step_done()
            self._rng = torch.get_rng_state()
            self.pending = EpochResult(trial.epoch, list(trial.member_ids),
                                       {k: [float(v) for v in values] for k, values in metrics.items()})
            self.train_loss = None
        self._tell()
        with self.changed:
            self.changed.notify_all()
            while self.keep is None and not self.stopping:
                self.changed.wait()
            if self.keep is None:
                raise FillAborted
            keep, self.keep = set(self.keep), None
        positions = [i for i, m in enumerate(trial.member_ids) if m in keep]
        if positions and len(positions) < len(trial.member_ids):  # none: the trial ends with every member's state
            trial.keep(positions)
        self.pending = None
        done = not positions or trial.epoch >= self.epochs
        with self.changed:
            self.snapshot, self.finished = self.state(), done
            self.changed.notify_all()
        return not done


def _error() -> dict:
    """The exception being handled, for the host: ``Type: message``, its classes' qualified names and the
    traceback."""
    error = sys.exc_info()[1]
    types = tuple(f"{c.__module__}.{c.__qualname__}" for c in type(error).__mro__ if issubclass(c, BaseException))
    return {"exception": traceback.format_exception_only(error)[-1].strip(), "types": types,
            "traceback": traceback.format_exc()}


def _child_main(workload, plan, member_ids, state, memory_budget_bytes, one_member_bytes, gate, cpus, idle, epochs,
                conn, news, progress) -> None:
    def send(kind: str, payload) -> None:
        conn.send_bytes(pickle.dumps((kind, payload)))

    try:
        if idle:  # before anything of the workload runs (unpickling imports the user's modules)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # threads started below inherit it
        if cpus:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(1)
        spec, state = pickle.loads(workload), pickle.loads(state)
        data = spec.load_data()
        configs = dict(plan.members)
        ids = list(state["trial"]["member_ids"]) if state else list(member_ids)
        if state is None and memory_budget_bytes is not None:
            if one_member_bytes is None:
                one_member_bytes = member_bytes(spec, configs[ids[0]], plan.scale, plan.mup, data)
            fit = members_that_fit(one_member_bytes, len(ids), memory_budget_bytes)
            if fit == 0:
                send("too_large", f"fill trial refused: one member's training step needs more than the "
                                  f"{memory_budget_bytes / 2**20:.1f} MiB its host can spare")
                return
            ids = ids[:fit]
        gate = LayerGate(gate, on_unit=lambda when: progress.__setitem__(_UNIT_STARTED, when))
        trial = FusedTrial(spec, plan, data, member_ids=ids, gates=[gate])
        if state:
            trial.load_state_dict(state["trial"])
        runner = _Runner(trial, gate, state, epochs or spec.epochs, progress, news)
    except BaseException:  # noqa: BLE001 - reported to the host, which raises it
        send("error", _error())
        return
    trainer = threading.Thread(target=runner.run, name="hydro-fill-train", daemon=True)
    trainer.start()
    send("ok", ids)
    while True:
        try:
            command, argument = conn.recv()
        except EOFError:  # the host process died: nothing can use this trial any more
            os._exit(0)
        if command == "stop":
            with runner.changed:
                runner.stopping = True
                runner.changed.notify_all()
            trainer.join()
        if runner.failure is not None:
            send("error", runner.failure)
            return
        if command == "stop":
            send("ok", runner.state())
            return
        if command == "activity":
            send("ok", list(gate.activity))
        elif command == "poll":
            send("ok", {"result": runner.pending if runner.keep is None else None, "finished": runner.finished})
        elif command == "decide":
            with runner.changed:
                if runner.pending is None:
                    send("error", {"exception": "RuntimeError: decide() without an epoch result awaiting its "
                                                "decision", "types": ("builtins.RuntimeError",), "traceback": ""})
                    return
                runner.snapshot, runner.keep = None, list(argument)
                runner.changed.notify_all()
                while runner.snapshot is None and runner.failure is None:
                    runner.changed.wait()
                snapshot = runner.snapshot
            if snapshot is None:  # it failed before the decision took effect
                send("error", runner.failure)
                return
            send("ok", snapshot)  # a failure after it: reported on the next request
