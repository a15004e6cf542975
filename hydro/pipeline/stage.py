"""A reference 1F1B pipeline stage over ``torch.distributed`` point-to-point (gloo on CPU, NCCL on GPU).

Why our own schedule: ``torch.distributed.pipelining``'s schedules run a whole iteration inside one call
and wait for their peers internally, so a caller sees where a stage idles only through a private hook
(:mod:`hydro.bubbles.pipelining`, single-stage schedules only); here every wait for an activation or a
gradient is bracketed by ``BubbleListener.bubble_started/ended`` with a prediction from the simulated 1F1B
timeline. The stage is a plain
object over an initialised process group; :mod:`hydro.tune.pipeline.job` places stages in Ray actors.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from hydro.checks import check, is_count
from hydro.energy.device import EnergyDevice
from hydro.energy.frequency import FrequencyPlanned, restoring_default_clock

from .hooks import BubbleListener, announced_wait
from .schedule import Interval, one_f_one_b, simulate
from .timing import DeviceTimer, Mark


@dataclass
class PipelineSpec:
    """The main job: an MLP ``in_features -> width x depth -> classes`` split evenly into stages, trained
    with SGD on synthetic batches of ``microbatches x microbatch_size`` samples (seeded per iteration)."""

    width: int = 256
    depth: int = 8
    in_features: int = 64
    classes: int = 10
    microbatches: int = 4
    microbatch_size: int = 32
    lr: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        sizes = ("width", "depth", "in_features", "classes", "microbatches", "microbatch_size")
        check("bubbles: PipelineSpec.", *((name, getattr(self, name), is_count, "an int >= 1") for name in sizes),
              ("lr", self.lr, lambda v: v >= 0, ">= 0"))

    def full_model(self) -> nn.Sequential:
        """The unsplit model (the same initial weights as the stages')."""
        torch.manual_seed(self.seed)
        sizes = [self.in_features] + [self.width] * self.depth + [self.classes]
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    def stage_model(self, stage: int, num_stages: int) -> nn.Sequential:
        layers = list(self.full_model())
        linear_positions = [i for i, m in enumerate(layers) if isinstance(m, nn.Linear)]
        if not 0 <= stage < num_stages <= len(linear_positions):
            raise ValueError(f"bubbles: stage {stage} of {num_stages} stages; the model has {len(linear_positions)} "
                             f"linear layers (depth + 1), so use 1..{len(linear_positions)} stages.")
        # Layers per stage differ by at most one (the first stages take the remainder).
        base, extra = divmod(len(linear_positions), num_stages)
        firsts = [i * base + min(i, extra) for i in range(num_stages)]
        chunks = [linear_positions[i] for i in firsts] + [len(layers)]
        return nn.Sequential(*layers[chunks[stage]: chunks[stage + 1]])

    def batch(self, iteration: int) -> tuple[Tensor, Tensor]:
        """``x`` ``[M, mb, in_features]`` and ``y`` ``[M, mb]`` of one iteration."""
        g = torch.Generator().manual_seed(self.seed * 7919 + iteration)
        x = torch.randn(self.microbatches, self.microbatch_size, self.in_features, generator=g)
        return x, torch.randint(0, self.classes, (self.microbatches, self.microbatch_size), generator=g)


class Transport(Protocol):
    """How a stage exchanges activations and gradients with its neighbours (ranks ``0..num_stages-1``)."""

    def begin_iteration(self) -> None:
        """An iteration starts (before its receives are posted)."""

    def isend(self, tensor: Tensor, peer: int) -> dist.Work: ...

    def irecv(self, buffer: Tensor, peer: int) -> dist.Work: ...

    def share(self, values: Tensor) -> list[Tensor]:
        """Every stage's ``values`` (a 1-D float64 tensor on the stage's device), by stage."""


class ProcessGroupTransport:
    """The default :class:`Transport`: ``torch.distributed`` point-to-point in the initialised process group."""

    def begin_iteration(self) -> None:
        pass

    def isend(self, tensor: Tensor, peer: int) -> dist.Work:
        return dist.isend(tensor, peer)

    def irecv(self, buffer: Tensor, peer: int) -> dist.Work:
        return dist.irecv(buffer, peer)

    def share(self, values: Tensor) -> list[Tensor]:
        everyone = [torch.zeros_like(values) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, values)  # (on the stage's device: NCCL groups gather only CUDA tensors)
        return everyone


class PipelineStage:
    """Stage ``stage`` of ``num_stages``: runs 1F1B iterations and reports its operations and bubbles.

    Times are the device's (:class:`~hydro.pipeline.timing.DeviceTimer`: CUDA events on the stage's stream on a
    GPU, the host clock on the CPU); the host synchronises with the device once per iteration (the optimizer step)
    and where it announces a bubble (see :func:`~hydro.pipeline.hooks.announced_wait`), never per microbatch.
    ``timeline`` holds the operations (``time.time()`` seconds), ``device_bubbles`` the waits as the device saw
    them. ``transport``: the neighbours (default: the process group; see :mod:`hydro.pipeline.emulated` for
    emulated ones).
    """

    def __init__(self, spec: PipelineSpec, stage: int, num_stages: int, listener: BubbleListener,
                 device: torch.device | str = "cpu", transport: Transport | None = None) -> None:
        self.spec, self.stage, self.num_stages, self.listener = spec, stage, num_stages, listener
        self.device = torch.device(device)
        self.transport = transport if transport is not None else ProcessGroupTransport()
        self.timer = DeviceTimer(self.device)
        self.model = spec.stage_model(stage, num_stages).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=spec.lr)
        self.schedule = one_f_one_b(num_stages, spec.microbatches)[stage]
        self.predicted_wait = [0.0] * len(self.schedule)  # seconds idle before each operation
        self.iteration = 0
        self.timeline: list[Interval] = []
        self.device_bubbles: list[Interval] = []

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.num_stages - 1

    def run_iteration(self) -> float:
        """One training iteration (all microbatches, then the optimizer step); returns its loss (last stage)."""
        x, y = self.spec.batch(self.iteration)
        self.transport.begin_iteration()
        receives = self._post_receives()
        stash: dict[int, tuple[Tensor | None, Tensor]] = {}
        sends, losses = [], []
        marks: list[tuple[str, Mark, Mark]] = []
        waits: dict[int, tuple[Mark, Mark]] = {}
        for index, op in enumerate(self.schedule):
            if op.kind == "F":
                if self.first:
                    inputs = x[op.microbatch].to(self.device)
                else:
                    inputs = self._receive(*receives[index], index, waits).requires_grad_()
                start = self.timer.mark()
                out = self.model(inputs)
                if self.last:
                    out = nn.functional.cross_entropy(out, y[op.microbatch].to(self.device)) / self.spec.microbatches
                    losses.append(out.detach())
                else:
                    sends.append(self.transport.isend(out.detach().contiguous(), self.stage + 1))
                stash[op.microbatch] = (None if self.first else inputs, out)
            else:
                inputs, out = stash.pop(op.microbatch)
                grad = None if self.last else self._receive(*receives[index], index, waits)
                start = self.timer.mark()
                out.backward(grad)
                if not self.first:
                    sends.append(self.transport.isend(inputs.grad.contiguous(), self.stage - 1))
            marks.append((f"{op.kind}{op.microbatch}", start, self.timer.mark()))
        for work in sends:
            work.wait()
        self.optimizer.step()
        self.optimizer.zero_grad()
        loss = float(torch.stack(losses).sum()) if losses else 0.0  # the iteration's one synchronisation
        self._resolve(marks, waits)
        self.iteration += 1
        return loss

    def _resolve(self, marks: list[tuple[str, Mark, Mark]], waits: dict[int, tuple[Mark, Mark]]) -> None:
        """Turn the iteration's marks into the timeline and the device's bubbles; update the predicted waits from
        the measured ones (the simulated 1F1B timeline is the prior)."""
        self.timer.wait(self.timer.mark())
        for label, start, end in marks:
            self.timeline.append(Interval(self.stage, self.timer.wall(start), self.timer.wall(end), label))
        for index, (start, end) in waits.items():
            self.device_bubbles.append(Interval(self.stage, self.timer.wall(start), self.timer.wall(end), "bubble"))
            self.predicted_wait[index] = 0.5 * self.predicted_wait[index] + 0.5 * self.timer.seconds(start, end)
        self.timer.anchor()

    def _post_receives(self) -> dict[int, tuple[dist.Work, Tensor]]:
        """Post every receive of the iteration up front (by operation index): gloo and NCCL send a tensor only
        once its receive is posted, so a receive posted late makes the sender's transport thread wait for a
        core the sender's own compute occupies."""
        shape = (self.spec.microbatch_size, self.spec.width)  # activations and their gradients between stages
        receives = {}
        for index, op in enumerate(self.schedule):
            source = self.stage - 1 if op.kind == "F" else self.stage + 1
            if 0 <= source < self.num_stages:
                buffer = torch.empty(shape, device=self.device)
                receives[index] = (self.transport.irecv(buffer, source), buffer)
        return receives

    def _receive(self, work: dist.Work, buffer: Tensor, index: int, waits: dict[int, tuple[Mark, Mark]]) -> Tensor:
        """Wait for a posted receive: a bubble, announced with its predicted length; its device marks go to
        ``waits``."""
        waits[index] = announced_wait(self.listener, self.stage, self.predicted_wait[index], self.timer, work.wait)
        return buffer

    def profile(self, iterations: int = 2) -> tuple[float, float]:
        """Run ``iterations`` and share every stage's mean forward/backward time (s) with all stages; set
        the predicted idle time before each of this stage's operations from the simulated 1F1B timeline."""
        self.timeline.clear()
        for _ in range(iterations):
            self.run_iteration()
        mine = torch.tensor([_mean(self.timeline, "F"), _mean(self.timeline, "B")], dtype=torch.float64,
                            device=self.device)
        everyone = [t.cpu() for t in self.transport.share(mine)]
        forward, backward = [float(t[0]) for t in everyone], [float(t[1]) for t in everyone]
        ops, bubbles = simulate(one_f_one_b(self.num_stages, self.spec.microbatches), forward, backward)
        own = [o for o in ops if o.stage == self.stage]
        previous_end = [0.0] + [o.end for o in own[:-1]]
        self.predicted_wait = [o.start - end for o, end in zip(own, previous_end)]
        # The first wait of an iteration also covers the tail of the previous one (no barrier between them).
        self.predicted_wait[0] += sum(b.length for b in bubbles if b.stage == self.stage and b.end >= max(
            o.end for o in ops) - 1e-12)
        self.timeline.clear()
        self.device_bubbles.clear()
        return forward[self.stage], backward[self.stage]

    def run_frequency_plan(self, iterations: int, frequencies: list[int], device: EnergyDevice) -> list[float]:
        """Run ``iterations`` with ``frequencies[i]`` (MHz) set on ``device`` before this stage's i-th instruction
        of each iteration; the device's default clock is restored however the run ends. Returns the losses."""
        with self.planned_clocks(frequencies, device):
            return [self.run_iteration() for _ in range(iterations)]

    @contextmanager
    def planned_clocks(self, frequencies: list[int], device: EnergyDevice) -> Iterator[None]:
        """Iterations run in the body set ``frequencies[i]`` (MHz) on ``device`` before this stage's i-th
        instruction of each iteration; the device's default clock is restored however the body exits.

        Raises:
            ValueError: ``frequencies`` does not give one clock per instruction of an iteration.
        """
        if len(frequencies) != len(self.schedule):
            raise ValueError(f"bubbles: stage {self.stage} runs {len(self.schedule)} instructions per iteration; the "
                             f"plan gives {len(frequencies)} frequencies (one per instruction, in schedule order).")
        model = self.model
        self.model = FrequencyPlanned(model, frequencies, device)
        try:
            with restoring_default_clock(device):
                yield
        finally:
            self.model = model


def _mean(timeline: list[Interval], kind: str) -> float:
    times = [i.length for i in timeline if i.label.startswith(kind)]
    return sum(times) / len(times)
