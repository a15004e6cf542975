"""A pipeline-parallel job whose stages are Ray actors, each able to host a fill trial in its bubbles.

Each stage actor joins a gloo (CPU) or NCCL (GPU) process group, runs 1F1B iterations
(:class:`~hydro.bubbles.stage.PipelineStage`) and reports its operations and bubbles. ``attach_fill``
co-locates a fused fill trial with the stage, in a process of its own on the stage's core
(:class:`~hydro.bubbles.fill_process.FillProcess`): ``mode="gated"`` runs it only inside bubbles, layer by
layer, under ``SCHED_IDLE``; ``mode="naive"`` lets it run alongside at normal priority (for contrast). Stage actors are named
``hydro-bubbles/<job>/<stage>`` so a placement policy can find them.
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict

import ray
import torch

from hydro.planning import free_memory_bytes, plan_fusion

from .fill import FillSpec, FillTrial
from .fill_process import FillProcess
from .gate import BubbleGate
from .hooks import BubbleRecorder
from .stage import PipelineSpec, PipelineStage


class FillTooLarge(MemoryError):
    """A fill trial does not fit the memory a stage can spare; the message gives the numbers."""


class StageHost:
    """The body of a stage actor (plain class; Ray wraps it in :func:`stage_actor`)."""

    def __init__(self, spec: PipelineSpec, stage: int, num_stages: int, address: str, fill_memory_bytes: int | None):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        torch.distributed.init_process_group("gloo", init_method=address, rank=stage, world_size=num_stages)
        self.gate = BubbleGate()
        self.recorder = BubbleRecorder(self.gate)
        self.stage = PipelineStage(spec, stage, num_stages, self.recorder)
        cores = sorted(os.sched_getaffinity(0))
        self.cpus = {cores[stage % len(cores)]}  # one core per stage; its fill trial shares it
        self.fill_memory_bytes = fill_memory_bytes
        self.fill: FillProcess | None = None

    def profile(self, iterations: int) -> tuple[float, float]:
        return self.stage.profile(iterations)

    def run(self, iterations: int) -> dict:
        """Run ``iterations``; returns the stage's losses, operations and bubbles (wall-clock seconds)."""
        os.sched_setaffinity(0, self.cpus)
        self.stage.timeline.clear()
        self.recorder.bubbles.clear()
        fill_steps = None if self.fill is None else self.fill.completed_steps
        fill_compute = None if self.fill is None else self.fill.compute_s
        started = time.time()
        losses = [self.stage.run_iteration() for _ in range(iterations)]
        report = {"stage": self.stage.stage, "losses": losses, "wall_s": time.time() - started,
                  "ops": [asdict(i) for i in self.stage.timeline],
                  "bubbles": [{**asdict(b), "length": b.length} for b in self.recorder.bubbles]}
        if self.fill is not None:
            report["fill_steps"] = self.fill.completed_steps - fill_steps
            report["fill_compute_s"] = self.fill.compute_s - fill_compute
            report["fill_members"] = self.fill.num_members
            report["fill_activity"] = [a for a in self.fill.status()["activity"] if a[0] >= started]
        return report

    def attach_fill(self, spec: FillSpec | None = None, mode: str = "gated", steps: int = 1_000_000,
                    checkpoint: dict | None = None, snapshot_every: int = 0) -> int:
        """Start a fill trial here, new from ``spec`` or continued from ``checkpoint``; returns its fusion
        count, which follows the memory this stage can spare. Raises :class:`FillTooLarge` with the numbers if
        one member does not fit. ``snapshot_every``: steps between the snapshots :meth:`fill_status` returns."""
        if mode not in ("gated", "naive"):
            raise ValueError(f"mode must be 'gated' or 'naive', got {mode!r}")
        if self.fill is not None:
            raise RuntimeError(f"stage {self.stage.stage} already hosts a fill trial; detach_fill() it first")
        if checkpoint is None:
            spec = self._fit_to_memory(spec)
        self.gate = BubbleGate(always_open=mode == "naive")
        self.recorder.listeners = [self.gate]
        self.fill = FillProcess(self.gate, self.cpus, spec=None if checkpoint else spec, checkpoint=checkpoint,
                                steps=steps, idle=mode == "gated", snapshot_every=snapshot_every)
        return self.fill.num_members

    def fill_status(self) -> dict | None:
        """The hosted fill trial's progress (see :meth:`FillProcess.status`), or ``None`` if there is none."""
        return None if self.fill is None else self.fill.status()

    def _fit_to_memory(self, spec: FillSpec) -> FillSpec:
        budget = self.fill_memory_bytes if self.fill_memory_bytes is not None else free_memory_bytes() // 4
        trial = FillTrial(FillSpec(**{**asdict(spec), "configs": spec.configs[:1]}))

        def factory():
            return getattr(__import__("hydro.examples.models", fromlist=[spec.model]), spec.model)(**spec.model_kwargs)

        try:
            plan = plan_fusion(factory, trial.batch(0), trial.loss_fn, max_members=len(spec.configs),
                               memory_budget_bytes=budget, steps=1, tolerance=1.0)
        except MemoryError as error:
            raise FillTooLarge(f"stage {self.stage.stage}: fill trial refused: {error} "
                               f"(stage can spare {budget / 2**20:.1f} MiB)") from None
        return FillSpec(**{**asdict(spec), "configs": spec.configs[: plan.num_members]})

    def detach_fill(self) -> dict | None:
        """Stop the fill trial at its next layer boundary; returns its checkpoint (completed steps only)."""
        if self.fill is None:
            return None
        checkpoint, self.fill = self.fill.stop(), None
        self.gate = BubbleGate()
        self.recorder.listeners = [self.gate]
        return checkpoint

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.stage.model.state_dict().items()}

    def shutdown(self) -> dict | None:
        """End the stage: stop any fill trial (returning its checkpoint) and leave the process group."""
        checkpoint = self.detach_fill()
        torch.distributed.destroy_process_group()
        return checkpoint


def stage_actor(num_cpus: float = 1):
    """The Ray actor class of a stage (threaded, so fill control calls run while an iteration runs)."""
    return ray.remote(num_cpus=num_cpus, max_concurrency=4)(StageHost)


class PipelineJob:
    """Driver of a pipeline job of ``num_stages`` Ray actors on the current Ray cluster."""

    def __init__(self, spec: PipelineSpec, num_stages: int = 2, name: str = "main",
                 fill_memory_bytes: int | None = None, num_cpus_per_stage: float = 1) -> None:
        self.spec, self.num_stages, self.name = spec, num_stages, name
        address = f"tcp://127.0.0.1:{_free_port()}"
        actor = stage_actor(num_cpus_per_stage)
        self.stages = [actor.options(name=f"hydro-bubbles/{name}/{s}").remote(spec, s, num_stages, address,
                                                                               fill_memory_bytes)
                       for s in range(num_stages)]

    def profile(self, iterations: int = 2) -> list[tuple[float, float]]:
        return ray.get([s.profile.remote(iterations) for s in self.stages])

    def run(self, iterations: int) -> list[dict]:
        return ray.get([s.run.remote(iterations) for s in self.stages])

    def attach_fill(self, stage: int, spec: FillSpec | None = None, mode: str = "gated",
                    checkpoint: dict | None = None) -> int:
        return ray.get(self.stages[stage].attach_fill.remote(spec, mode, checkpoint=checkpoint))

    def fill_status(self, stage: int) -> dict | None:
        return ray.get(self.stages[stage].fill_status.remote())

    def detach_fill(self, stage: int) -> dict | None:
        return ray.get(self.stages[stage].detach_fill.remote())

    def shutdown(self) -> list[dict | None]:
        """End the job; returns each stage's fill checkpoint (or ``None``) so fill trials continue elsewhere."""
        checkpoints = ray.get([s.shutdown.remote() for s in self.stages])
        for actor in self.stages:
            ray.kill(actor)
        return checkpoints


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
