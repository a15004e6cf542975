"""The tuner tests' workload (the tiny digits MLP of ``tests.digits`` as a TuneSpec, its search space), a loss that
fails on purpose at a given epoch, and a custom training loop reporting through MemberSession."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import torch
from ray import tune
from torch import nn

import hydro
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.trial.data import batch_order
from hydro.tune import MemberSession, TuneSpec, accuracy
from schedulers.member_stopping import StoppingRule
from tests.digits import mlp, sgd, small_digits


def first_targets(epoch: int, batch_size: int = 32, seed: int = 0) -> torch.Tensor:
    """The targets of the first training batch of ``epoch`` on ``small_digits`` (a function of (seed, epoch))."""
    (_, y), _ = small_digits()
    return y[batch_order(seed, epoch, len(y))[:batch_size]]


@dataclass
class FaultAtEpoch:
    """Cross-entropy, except on the first training batch of ``epoch`` with ``batch_size`` samples (the same batch in
    any process, retried or not): there it appends its pid to the file ``log`` and does ``fault``: ``"raise"`` (a
    ZeroDivisionError, every time) or ``"kill_once"`` (SIGKILLs its own process, as the OOM killer would, the
    first time only)."""

    epoch: int
    log: str
    fault: str = "raise"
    batch_size: int = 32

    def __post_init__(self) -> None:
        self.targets = first_targets(self.epoch, self.batch_size).tolist()  # not inside the loss's vmap

    def __call__(self, output, target):
        if target.tolist() == self.targets:  # (torch.equal has no vmap rule)
            first = not os.path.exists(self.log)
            with open(self.log, "a") as f:
                f.write(f"{os.getpid()}\n")
            if self.fault == "raise":
                raise ZeroDivisionError(f"fault injected by the test's loss in epoch {self.epoch}")
            if first:
                os.kill(os.getpid(), signal.SIGKILL)
        return nn.functional.cross_entropy(output, target)


@dataclass
class Sleeping:
    """A metric that takes ``seconds`` per member and validation batch (0): a trial's evaluation then takes time in
    proportion to its members, whatever the machine's load."""

    seconds: float

    def __call__(self, output, target):
        time.sleep(self.seconds)
        return 0.0


def faults(log: str) -> list[int]:
    """The pids that hit a :class:`FaultAtEpoch` fault, one per hit."""
    with open(log) as f:
        return [int(line) for line in f.read().split()]


class Recoveries(tune.Callback):
    """The trials Tune retried (``recovered``: their ids, once per retry)."""

    def __init__(self):
        self.recovered = []

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.recovered.append(trial.trial_id)


class Untraceable(nn.Module):
    """Python control flow on a tensor value: torch.fx cannot trace it, so it cannot be fused."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 10)

    def forward(self, x):
        return self.linear(x) if x.sum() > 0 else -self.linear(x)


def mlp_or_untraceable(config):
    return Untraceable() if config["kind"] == "untraceable" else mlp(config)


class DeadAtFullWidth(nn.Module):
    """Zeroes its input ``[..., width]`` at the full width 64 (no signal reaches the readout, which then predicts
    one class), passes the narrower surrogates' through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (x.shape[-1] < 64)


def dead_at_full_width(config):
    """A 64-64-10 MLP whose full-size model cannot learn and its surrogates can: its target always regresses."""
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), DeadAtFullWidth(), nn.Linear(64, 10))


def spec(epochs: int = 3, **overrides) -> TuneSpec:
    fields = dict(model=mlp, data=small_digits, loss=nn.CrossEntropyLoss(), optimizer=sgd, metric="val_acc",
                  mode="max", metrics={"val_acc": accuracy}, epochs=epochs, batch_size=32)
    return TuneSpec(**{**fields, **overrides})


class StopFirstMemberAfterEpoch1(StoppingRule):
    """Stops member m00000 after its first epoch, and no other."""

    def on_result(self, member: str, epoch: int, score: float) -> bool:
        return member == "m00000" and epoch == 1


@dataclass
class StartTogether:
    """Cross-entropy whose first call in each trial process (not the test's own, ``driver_pid``) waits, up to 120 s,
    until ``trials`` trial processes have made theirs (files in ``folder``): a test's trials train at the same time
    even when their workers start seconds apart."""

    folder: str
    trials: int = 2
    driver_pid: int = field(default_factory=os.getpid)
    started: bool = False

    def __call__(self, output, target):
        if not self.started and os.getpid() != self.driver_pid:
            self.started = True
            open(os.path.join(self.folder, str(os.getpid())), "w").close()
            deadline = time.monotonic() + 120
            while len(os.listdir(self.folder)) < self.trials and time.monotonic() < deadline:
                time.sleep(0.05)
        return nn.functional.cross_entropy(output, target)


class StopOneOfEachTrial(StoppingRule):
    """Stops m00000 and m00002 (the first member of each of two fused trials of two) after their first epoch."""

    def on_result(self, member: str, epoch: int, score: float) -> bool:
        return member in ("m00000", "m00002") and epoch == 1


SPACE = {"lr": tune.loguniform(1e-3, 1.0), "momentum": tune.choice([0.0, 0.9])}


EPOCHS = 3


def custom_loop(config):
    """A user's loop: their own fused model, optimizer and metric; Hydro only reports and stops members."""
    session = MemberSession(config, metric="val_acc", mode="max")
    (x, y), (vx, vy) = small_digits()
    fused = hydro.fuse([mlp(c) for c in session.configs])
    opt = SGD(fused.parameters(), lr=[c["lr"] for c in session.configs],
                          momentum=[c["momentum"] for c in session.configs])
    for epoch in range(1, EPOCHS + 1):
        for index in torch.randperm(len(y)).split(32):
            opt.zero_grad()
            trial_losses(nn.functional.cross_entropy, fused(x[index]), y[index]).sum().backward()
            opt.step()
        with torch.no_grad():
            acc = (fused(vx).argmax(-1) == vy).float().mean(1)  # [F]
        before = len(session.member_ids)
        keep = session.step(epoch, {"val_acc": acc}, final=epoch == EPOCHS)
        if keep and len(keep) < before:
            hydro.keep_members(fused, keep, optimizer=opt)
        session.report()
        if not keep:
            return
