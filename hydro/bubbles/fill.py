"""Fill trials: fused tuning trials that train layer by layer inside a pipeline stage's bubbles.

Hooks before every layer's forward and backward (and before the loss and the optimizer step) of a
:class:`FillTrial` wait on a :class:`BubbleGate`, so the trial pauses at a layer boundary when the bubble
ends and resumes in the next one with nothing lost. :mod:`hydro.bubbles.fill_process` runs it beside a stage.
Its batches depend only on (seed, step), so a trial moved elsewhere from its checkpoint continues
exactly as it would have run alone.
"""
from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from hydro.binder import fuse
from hydro.examples import models
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.planning import measure_training_step, plan_fusion, training_tensors

from .gate import BubbleGate, FillAborted


class FillTooLarge(MemoryError):
    """A fill trial does not fit the memory its host can spare; the message gives the numbers."""


@dataclass
class FillSpec:
    """A fused trial of a bundled example model (``hydro.examples.models``) with per-member SGD
    configurations (``lr``, ``momentum``), trained on synthetic batches ``[batch_size, *input_shape]``."""

    configs: list[dict]
    model: str = "MLP"
    model_kwargs: dict = field(default_factory=lambda: {"sizes": (64, 128, 128, 10)})
    input_shape: tuple[int, ...] = (64,)
    num_classes: int = 10
    batch_size: int = 32
    seed: int = 0


class FillTrial:
    """One fused fill trial; ``step()`` trains one step, gated by ``gate`` between layers (runs anywhere:
    a thread, a process beside a stage, a dedicated worker)."""

    def __init__(self, spec: FillSpec, gate: BubbleGate | None = None) -> None:
        self.spec, self.gate = spec, gate
        with torch.random.fork_rng():
            torch.manual_seed(spec.seed)
            members = [getattr(models, spec.model)(**spec.model_kwargs) for _ in spec.configs]
        self.model = fuse(members)
        self.optimizer = SGD(self.model.parameters(), lr=[c["lr"] for c in spec.configs],
                             momentum=[c.get("momentum", 0.0) for c in spec.configs])
        self.loss_fn = nn.CrossEntropyLoss()
        self.completed_steps = 0
        self.compute_s = 0.0  # CPU seconds spent computing (inside bubbles when gated)
        self.activity: deque[tuple[float, float]] = deque(maxlen=4096)  # recent (start, end) wall-clock units
        self.layer_cost: dict[str, float] = {}
        self._current: tuple[str, float, float] | None = None  # unit, CPU and wall-clock start
        self.last_losses: list[float] = []  # per member, of the last completed step
        for name, module in self.model.named_modules():
            if not list(module.children()):
                module.register_forward_pre_hook(lambda m, a, name=name: self._boundary("F:" + name))
                module.register_forward_hook(lambda m, a, out, name=name: self._hook_backward(out, "B:" + name))

    @property
    def num_members(self) -> int:
        return self.model.num_members

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.spec.seed * 1_000_003 + step)
        x = torch.randn(self.spec.batch_size, *self.spec.input_shape, generator=g)
        return x, torch.randint(0, self.spec.num_classes, (self.spec.batch_size,), generator=g)

    def step(self) -> None:
        x, y = self.batch(self.completed_steps)
        self.optimizer.zero_grad(set_to_none=False)
        output = self.model(x)
        self._boundary("loss")
        losses = trial_losses(self.loss_fn, output, y)
        losses.sum().backward()
        self._boundary("optimizer")
        self.optimizer.step()
        self._boundary(None)
        self.last_losses = losses.detach().tolist()
        self.completed_steps += 1

    def _hook_backward(self, output, unit: str) -> None:
        """Mark a boundary just before this layer's backward: when the gradient of its output arrives."""
        first = output[0] if isinstance(output, tuple) else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(lambda grad: self._boundary(unit))

    def _boundary(self, unit: str | None) -> None:
        """Close the timing of the unit that just ran; wait for room in a bubble for ``unit``.

        Units are timed in this thread's CPU time: wall time would count the preemptions of this idle-policy
        thread as layer cost. (Stage processes run single-threaded kernels, so CPU time is the compute time.)
        """
        now, wall = time.thread_time(), time.time()
        if self._current is not None:
            name, start, wall_start = self._current
            self.compute_s += now - start
            self.activity.append((wall_start, wall))
            if self.completed_steps > 0:  # the first step's times include one-off set-up: not representative
                previous = self.layer_cost.get(name)
                self.layer_cost[name] = now - start if previous is None else 0.7 * previous + 0.3 * (now - start)
            self._current = None
        if unit is None:
            return
        if self.gate is not None:
            self.gate.wait_for(self.layer_cost.get(unit, 0.0))
        self._current = (unit, time.thread_time(), time.time())

    def train(self, steps: int) -> bool:
        """Train up to ``steps`` more steps; ``False`` if the gate aborted (the step in flight is dropped)."""
        try:
            for _ in range(steps):
                self.step()
        except FillAborted:
            self._current = None
            return False
        except RuntimeError as error:  # an abort raised inside a backward hook arrives wrapped
            if not isinstance(error.__cause__, FillAborted) and "FillAborted" not in str(error):
                raise
            self._current = None
            return False
        return True

    def checkpoint(self) -> dict:
        """Everything needed to continue elsewhere (a copy): spec, completed steps, last per-member losses, weights,
        optimizer state."""
        return copy.deepcopy({"spec": self.spec, "completed_steps": self.completed_steps,
                              "member_ids": self.model.member_ids, "losses": self.last_losses,
                              "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    @classmethod
    def from_checkpoint(cls, checkpoint: dict, gate: BubbleGate | None = None) -> "FillTrial":
        trial = cls(checkpoint["spec"], gate)
        trial.model.load_state_dict(checkpoint["model"])
        trial.optimizer.load_state_dict(checkpoint["optimizer"])
        trial.completed_steps, trial.last_losses = checkpoint["completed_steps"], checkpoint["losses"]
        return trial


def fill_memory_bytes(spec: FillSpec) -> int:
    """Peak memory (bytes) of one training step of ``spec``'s fused trial (see
    :func:`hydro.planning.measure_training_step`), measured on a throwaway copy."""
    trial = FillTrial(spec)
    return measure_training_step(trial.step, lambda: training_tensors(trial.model, trial.optimizer), steps=1)[1]


def fit_to_memory(spec: FillSpec, budget_bytes: int) -> FillSpec:
    """``spec`` with as many of its members as fit ``budget_bytes`` (and run fastest, see
    :func:`hydro.planning.plan_fusion`); raises :class:`FillTooLarge` with the numbers if one does not fit."""
    trial = FillTrial(replace(spec, configs=spec.configs[:1]))
    try:
        plan = plan_fusion(lambda: getattr(models, spec.model)(**spec.model_kwargs), trial.batch(0), trial.loss_fn,
                           max_members=len(spec.configs), memory_budget_bytes=budget_bytes, steps=1, tolerance=1.0)
    except MemoryError as error:
        raise FillTooLarge(f"fill trial refused: {error} (it can spare {budget_bytes / 2**20:.1f} MiB)") from None
    return replace(spec, configs=spec.configs[: plan.num_members])
