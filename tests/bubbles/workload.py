"""The fill trials' workload: a user TuneSpec (a digits MLP, plain torch SGD), a loss that can fail on
purpose (raise, SIGKILL or hang at its n-th call in a process), a loss that holds a fill mid-training where a test
wants it, and the same trial trained alone."""
from __future__ import annotations

import os
import pickle
import signal
import time
from dataclasses import dataclass

import torch
from torch import nn

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec, accuracy
from hydro.trial.unit import FusedTrial
from tests.digits import mlp, sgd, small_digits

CONFIGS = [("m0", {"lr": 0.1, "momentum": 0.9}), ("m1", {"lr": 0.02, "momentum": 0.0}),
           ("m2", {"lr": 0.05, "momentum": 0.9})]
_calls = [0]


@dataclass
class FaultyLoss:
    """Cross-entropy, except that its ``at``-th call in a process does ``fault``: ``"raise"``, ``"kill"``
    (SIGKILL itself, like the OOM killer), ``"hang"``, or from then on ``"slow"`` (0.2 s of CPU per call: longer
    than every bubble of the reference pipeline)."""

    fault: str | None = None
    at: int = 0

    def __call__(self, output, target):
        _calls[0] += 1
        if self.fault == "slow" and _calls[0] >= self.at:  # CPU time: what the gate times units in
            start = time.thread_time()
            while time.thread_time() - start < 0.2:
                pass
        if self.fault and _calls[0] == self.at:
            if self.fault == "raise":
                raise ZeroDivisionError("fault injected by the test's loss")
            if self.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "hang":
                time.sleep(3600)
        return nn.functional.cross_entropy(output, target)


_training_calls = [0]  # training calls of HeldLoss in this process


@dataclass
class HeldLoss:
    """Cross-entropy, except that while ``<folder>/hold`` exists and ``<folder>/release`` does not, the first
    process to make a training call after its first one (a step trained in that process) creates ``<folder>/held``
    and waits in it until ``release`` appears (at most 60 s): a fill trial held mid-training on whichever host it
    runs on once the test creates ``hold``, with no race against the fill's own speed."""

    folder: str

    def __call__(self, output, target):
        if torch.is_grad_enabled():  # a training step (evaluation runs without grad)
            _training_calls[0] += 1
            if _training_calls[0] >= 2 and self._hold_here():
                release, deadline = os.path.join(self.folder, "release"), time.monotonic() + 60.0
                while not os.path.exists(release) and time.monotonic() < deadline:
                    time.sleep(0.02)
        return nn.functional.cross_entropy(output, target)

    def _hold_here(self) -> bool:
        """Whether this call is the one held (``hold`` set, not released, ``held`` not yet created by anyone)."""
        if not os.path.exists(os.path.join(self.folder, "hold")) or os.path.exists(os.path.join(self.folder,
                                                                                                 "release")):
            return False
        try:
            os.close(os.open(os.path.join(self.folder, "held"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def spec(epochs: int = 3, fault: str | None = None, at: int = 0, **overrides) -> TuneSpec:
    fields = dict(model=mlp, data=small_digits, loss=FaultyLoss(fault, at), optimizer=sgd, metric="val_acc",
                  mode="max", metrics={"val_acc": accuracy}, epochs=epochs, batch_size=32)
    return TuneSpec(**{**fields, **overrides})


def plan(members=CONFIGS, scale: int = 1) -> TrialPlan:
    return TrialPlan(TrialKind.SURROGATE, [(m, dict(c)) for m, c in members], scale, scale > 1)


def workload(tune_spec: TuneSpec) -> bytes:
    return pickle.dumps(tune_spec)


def train_alone(tune_spec: TuneSpec, trial_plan: TrialPlan, epochs: int, member_ids=None) -> FusedTrial:
    """The trial trained alone, single-threaded like a fill process (bit-comparable kernels)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trial = FusedTrial(tune_spec, trial_plan, tune_spec.load_data(), member_ids=member_ids)
        for _ in range(epochs):
            trial.run_epoch()
        return trial
    finally:
        torch.set_num_threads(threads)


def _modules(trial_state: dict) -> list[dict]:
    """The member modules' states of a FusedTrial state, over its chunks."""
    return [module for chunk in trial_state["members"] for module in chunk["modules"]]


def same_members(state: dict, alone: FusedTrial) -> bool:
    """A fill state's member weights equal ``alone``'s (for the members the state holds) bit for bit."""
    ids = list(state["trial"]["member_ids"])
    expected = FusedTrial(alone.spec, alone.plan, alone.data, member_ids=alone.member_ids)
    expected.load_state_dict(alone.state_dict())
    expected.keep([alone.member_ids.index(m) for m in ids])
    mine, theirs = _modules(state["trial"]), _modules(expected.state_dict())
    return all(torch.equal(a, b) for m, e in zip(mine, theirs, strict=True)
               for a, b in zip(m.values(), e.values(), strict=True))
