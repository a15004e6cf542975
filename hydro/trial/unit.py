"""The fused-trial unit: one trial's members built from a ``TuneSpec`` and trained step by step.

Everything that trains Hydro's trials runs this unit — the Ray Tune trainable, a fill trial in a pipeline's
bubbles, energy measurement — so a trial trains the same way wherever it runs and its checkpoint continues
anywhere. The members are built (shrunk to µP surrogates when ``scale > 1``), fused with one translated
optimizer (or looped, unfused, for plain trials), moved to the trial's device (``TuneSpec.device``), and
trained on batches shared by all members whose order is a function of (``spec.seed``, epoch) alone
(:mod:`hydro.trial.data`): a trial restored from a checkpoint taken after any step replays exactly what it
would have trained.

Attachments: *gates* can hold the trial between layers (the bubble squeezer's layer-boundary hooks),
*observers* see every step and epoch (energy windows, progress).
"""
from __future__ import annotations

import gc
import logging
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor

from hydro.loss import LossError, loss_on, trial_losses
from hydro.trial.backend import batch_in, check_cuda_graphs, set_backend_flags, to_memory_format
from hydro.trial.data import Batch, DataSource, as_source, batch_order, eval_batch_size, on_device
from hydro.trial.device import resolve_device
from hydro.trial.host_memory import keep_freed_memory
from hydro.trial.members import Members, build_members
from hydro.trial.memory import MemoryBudget, is_out_of_memory
from hydro.trial.plan import TrialPlan
from hydro.trial.precision import MemberLossScaler, Precision, autocast
from hydro.trial.schedule import ScheduleInterval
from hydro.trial.spec import TRAIN_LOSS, VAL_LOSS, TuneSpec

__all__ = ["FusedTrial", "Gate", "Observer", "batch_order"]

logger = logging.getLogger(__name__)


class Gate(ABC):
    """Holds a trial between layers: attached to the unit's modules, detached when it leaves."""

    @abstractmethod
    def attach(self, trial: FusedTrial) -> None:
        """Install hooks on ``trial.modules()``."""

    @abstractmethod
    def detach(self, trial: FusedTrial) -> None:
        """Remove them."""


class Observer:
    """Sees the unit train (override what you need)."""

    def on_step_end(self, trial: FusedTrial, losses: Tensor) -> None:
        """After each optimizer step; ``losses``: the members' losses of the batch ``[F]``."""

    def on_epoch_end(self, trial: FusedTrial, metrics: Mapping[str, Tensor]) -> None:
        """After each epoch's evaluation; ``metrics``: name -> per-member values ``[F]``."""


class FusedTrial:
    """The members of one trial (``plan.members``, or the ``member_ids`` still training after a restore) and
    their training on ``data`` = ``(train, val)``, each a split as ``TuneSpec.data()`` may return it (tensors
    ``([N, ...], [N, ...])``, a ``Dataset``, ...) or a :class:`~hydro.trial.data.DataSource`.

    ``device``: where members, batches and targets live (default: ``TuneSpec.device`` resolved here).
    ``memory_budget_bytes``: what training may use (default ``TuneSpec.memory_budget_bytes``). ``chunks``: the
    members as fused units trained one after another on each batch: one (or units of ``fusion`` members, e.g.
    as planned on the trial's device), until training a unit runs out of memory (any allocation failure, see
    :func:`~hydro.trial.memory.is_out_of_memory`, or over the budget); the unit is then split in two and the batch
    retried for them, so every member still trains every batch exactly once. ``max_fusion``: the most members
    trained fused at once without running out of memory (``fusion`` or all the trial's members, until a split).
    ``epoch``: completed epochs; ``step``: batches done of the epoch in progress. ``fallback``: why fusion fell
    back to unfused training (``TuneSpec.fallback_unfused``), else ``None``. ``data_wait_s``/``train_s``/``eval_s``:
    seconds spent waiting for training batches / in training steps (the wait included) / evaluating;
    ``data_setup_s``/``build_s``: seconds the splits took to be ready on the device / the members to be built.
    ``member_errors``: members whose own loss or metric raised (member id -> ``Type: message``): each fails alone,
    as a diverged member does (every value of it NaN from that epoch on, no gradient from the raising loss), while
    its siblings train on; when every member of the trial has failed so, the error is raised.
    """

    def __init__(self, spec: TuneSpec, plan: TrialPlan, data: tuple, *, member_ids: Sequence[str] | None = None,
                 gates: Sequence[Gate] = (), observers: Sequence[Observer] = (),
                 device: torch.device | str | None = None, memory_budget_bytes: int | None = None,
                 fusion: int | None = None) -> None:
        configs = dict(plan.members)
        ids = list(member_ids) if member_ids is not None else list(configs)
        self.spec, self.plan = spec, plan
        self.device = resolve_device(spec.device) if device is None else torch.device(device)
        if self.device.type == "cpu":  # fused activations: large blocks that malloc would hand back every step
            keep_freed_memory()
        start = time.perf_counter()
        self.data: tuple[DataSource, DataSource] = tuple(on_device(
            [as_source(split, name, spec.data_workers) for split, name in zip(data, ("train", "val"))], self.device,
            spec.memory_budget_bytes if memory_budget_bytes is None else memory_budget_bytes))
        self.data_setup_s = time.perf_counter() - start
        check_cuda_graphs(spec.cuda_graphs, self.device)
        set_backend_flags(self.device, spec.tf32, spec.cudnn_benchmark)
        members, self.fallback = build_members(spec, [configs[m] for m in ids], ids, plan.scale, fuse=plan.fused,
                                               mup=plan.mup, device=self.device)
        to_memory_format(members.modules(), spec.memory_format)
        self.build_s = time.perf_counter() - start - self.data_setup_s
        self.max_fusion = min(len(ids), fusion or len(ids))  # the most members trained fused at once (that fit)
        self.chunks: list[Members] = [members]  # trained one after another on each batch; an OOM splits one
        if self.max_fusion < len(ids):
            whole, rest = divmod(len(ids), self.max_fusion)
            self.chunks = members.split([self.max_fusion] * whole + ([rest] if rest else []))
        self.loss = loss_on(spec.loss, self.device)  # a loss module's tensors (class weights) on the device
        self.budget = MemoryBudget(spec.memory_budget_bytes if memory_budget_bytes is None else memory_budget_bytes,
                                   self.device)
        self.batch_size = spec.batch_size_of(configs[ids[0]])
        self.scaler = MemberLossScaler(len(ids), self.device) if spec.precision is Precision.FP16 else None
        self.epoch, self.step = 0, 0
        self._metric_due, self._train_loss = False, None  # an epoch ended whose metric no schedule has seen yet
        self._loss_sum: Tensor | None = None  # [F], the epoch in progress
        self._seen = 0
        self._batches: Iterator[Batch] | None = None  # the rest of the epoch in progress
        self.data_wait_s = self.train_s = self.eval_s = 0.0
        self.member_errors: dict[str, str] = {}
        self.loss_by_member: str | None = None  # why the loss is computed member by member (not fused), if it is
        self.gates, self.observers = list(gates), list(observers)
        for gate in self.gates:
            gate.attach(self)

    @property
    def members(self) -> Members:
        """The members as one unit (only while they are one chunk)."""
        if len(self.chunks) > 1:
            raise RuntimeError(f"FusedTrial.members: the members were split into {len(self.chunks)} chunks after "
                               f"running out of memory; use FusedTrial.chunks")
        return self.chunks[0]

    @property
    def member_ids(self) -> list[str]:
        return [m for chunk in self.chunks for m in chunk.member_ids]

    @property
    def fused(self) -> bool:
        return self.chunks[0].fused

    @property
    def steps_per_epoch(self) -> int | None:
        """Training batches per epoch (``None`` for an iterable dataset, known only once read)."""
        return self.data[0].num_batches(self.batch_size)

    def modules(self) -> list[torch.nn.Module]:
        """The modules that train (a fused model per chunk, or one model per member when unfused)."""
        return [module for chunk in self.chunks for module in chunk.modules()]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers that step the members (one per chunk, or one per member when unfused)."""
        return [optimizer for chunk in self.chunks for optimizer in chunk.optimizers()]

    def train_step(self) -> Tensor | None:
        """Train the next batch of the epoch in progress; returns the members' losses ``[F]``, or ``None`` when
        the epoch has no batch left (``train_epoch`` then closes it)."""
        start = time.perf_counter()
        if self._batches is None:
            self._batches = self.data[0].train_batches(self.batch_size, self.spec.seed, self.epoch + 1, self.step,
                                                       self.device)
        batch = next(self._batches, None)
        self.data_wait_s += time.perf_counter() - start
        if batch is None:
            return None
        x, y = batch
        x = batch_in(x, self.spec.memory_format)
        parts, overflowed, index, offset = [], [], 0, 0
        while index < len(self.chunks):
            chunk = self.chunks[index]
            members = slice(offset, offset + len(chunk.member_ids))  # its members' positions in the trial
            if self.step == 0:
                chunk.train(True)
            try:
                losses = self._backward(chunk, x, y, members)
            except RuntimeError as error:  # torch.OutOfMemoryError, or cuDNN/cuBLAS failing to allocate
                if not is_out_of_memory(error):
                    raise
                traceback.clear_frames(error.__traceback__)  # the failed step's graph goes with its frames' locals
                self._split(index, str(error).splitlines()[0])
                continue
            if self.scaler is None:
                chunk.step()
            else:
                overflowed.append(chunk.unscale_(self.scaler.scale[members]))
                chunk.step(skip=overflowed[-1])
            if self.spec.lr_scheduler_interval is ScheduleInterval.BATCH:
                chunk.lr_step()
            parts.append(losses)
            index, offset = index + 1, members.stop
        if self.scaler is not None:
            self.scaler.update(torch.cat(overflowed))
        losses = torch.cat(parts)
        total = losses * len(y)
        self._loss_sum = total if self._loss_sum is None else self._loss_sum + total
        self._seen += len(y)
        self.step += 1
        self.train_s += time.perf_counter() - start
        for observer in self.observers:
            observer.on_step_end(self, losses)
        return losses

    def _backward(self, chunk: Members, x: Tensor, y: Tensor, members: slice) -> Tensor:
        """Forward and backward of one chunk on the batch; its members' losses ``[n]`` (detached, float)."""
        chunk.zero_grad()
        with self.budget.watch(chunk.modules(), chunk.optimizers()):
            with autocast(self.device, self.spec.precision):
                losses = self._losses(chunk, chunk(x), y)  # [n]
            if self.scaler is None:
                losses.sum().backward()  # member i's gradient is exactly that of its own loss
            else:
                self.scaler.scaled(losses, members).backward()
        return losses.detach().float()

    def _split(self, index: int, failure: str) -> None:
        """Split chunk ``index`` in two after it ran out of memory (``failure``; one member alone: raise)."""
        chunk = self.chunks[index]
        chunk.zero_grad()
        gc.collect()  # the failed step's graph may sit in reference cycles (traceback frames)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        count = len(chunk.member_ids)
        if count == 1:
            raise torch.OutOfMemoryError(f"hydro.trial.unit: one member alone does not fit in memory ({failure}); "
                                         f"use a smaller batch size or model (TuneSpec.batch_size, scale), or a "
                                         f"larger TuneSpec.memory_budget_bytes")
        logger.warning("training %d members fused ran out of memory (%s); continuing with %d and %d",
                       count, failure, count // 2, count - count // 2)
        for gate in self.gates:  # the gates' hooks move to the new chunks' modules
            gate.detach(self)
        try:
            if self.device.type == "cuda":  # the copies are made in host memory: the card holds the members once
                keys = _move(chunk, torch.device("cpu"))
                parts = chunk.split([count // 2, count - count // 2])
                for part in parts:
                    _move(part, self.device, keys)
            else:
                parts = chunk.split([count // 2, count - count // 2])
        except RuntimeError as error:
            for gate in self.gates:
                gate.attach(self)
            if not is_out_of_memory(error):
                raise
            raise torch.OutOfMemoryError(f"hydro.trial.unit: {count} members ran out of memory ({failure}) and "
                                         f"splitting them does not fit either ({str(error).splitlines()[0]}); use "
                                         f"a smaller fusion count or batch size, or a larger "
                                         f"TuneSpec.memory_budget_bytes") from None
        self.chunks[index:index + 1] = parts
        for gate in self.gates:
            gate.attach(self)
        self.max_fusion = min(self.max_fusion, count - count // 2)

    def train_epoch(self) -> Tensor:
        """Finish the epoch in progress; the members' mean training loss over it ``[F]``."""
        while self.train_step() is not None:
            pass
        if not self._seen:
            raise ValueError(f"hydro.trial.unit: the training split gave no batch in epoch {self.epoch + 1}; "
                             f"TuneSpec.data() must return a non-empty train split")
        mean = self._loss_sum / self._seen
        self.epoch, self.step, self._loss_sum, self._seen, self._batches = self.epoch + 1, 0, None, 0, None
        if self.spec.lr_scheduler_interval is ScheduleInterval.EPOCH:
            for chunk in self.chunks:
                if not chunk.follows_metric:
                    chunk.lr_step()
        self._train_loss = mean  # what ReduceLROnPlateau follows when TuneSpec.metric is train_loss
        self._metric_due = True  # ReduceLROnPlateau steps on this epoch's evaluation
        return mean

    @torch.no_grad()
    def evaluate(self) -> dict[str, Tensor]:
        """``val_loss`` and every metric of ``spec.metrics`` per member, each ``[F]``: means over the
        validation split in chunks (weighted by chunk size, so exact for metrics that are means over samples).
        Training's random streams (torch's CPU RNG and the device's) are left as they were: whether an epoch is
        evaluated never changes what training draws (a model's randomness in eval mode, random validation
        transforms)."""
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            return self._evaluate()

    def _evaluate(self) -> dict[str, Tensor]:
        start = time.perf_counter()
        for chunk in self.chunks:
            chunk.train(False)
        sums: dict[str, Tensor] = {}
        count = 0
        for x, target in self.data[1].eval_batches(eval_batch_size(self.batch_size, self.device), self.device):
            x = batch_in(x, self.spec.memory_format)
            parts = [self._chunk_metrics(chunk, x, target) for chunk in self.chunks]
            for name in parts[0]:
                sums[name] = sums.get(name, 0) + torch.cat([p[name] for p in parts]) * len(target)
            count += len(target)
        if not count:
            raise ValueError("hydro.trial.unit: the validation split gave no batch; TuneSpec.data() must return "
                             "a non-empty val split")
        metrics = {name: total / count for name, total in sums.items()}
        self.eval_s += time.perf_counter() - start
        if self._metric_due:
            self._step_on_metric(metrics[self.spec.metric] if self.spec.metric in metrics else self._train_loss)
        return metrics

    def _step_on_metric(self, values: Tensor) -> None:
        """Step the schedules that follow each member's ``TuneSpec.metric`` (``values`` ``[F]``), once per epoch."""
        self._metric_due = False
        offset = 0
        for chunk in self.chunks:
            count = len(chunk.member_ids)
            if chunk.follows_metric:
                chunk.lr_step(values[offset:offset + count])
            offset += count

    def _chunk_metrics(self, chunk: Members, x: Tensor, target: Tensor) -> dict[str, Tensor]:
        """``val_loss`` and ``spec.metrics`` of one chunk's members on one batch, each ``[n]`` float64."""
        with autocast(self.device, self.spec.precision):
            output = chunk(x)  # [n, N, ...]
            values = {VAL_LOSS: self._losses(chunk, output, target).double()}
        for name, fn in self.spec.metrics.items():
            values[name] = torch.stack([torch.as_tensor(torch.nan if value is None else value, dtype=torch.float64,
                                                        device=output.device)
                                        for value in self._member_values(chunk, name, fn, output, target)])
        return values

    def _losses(self, chunk: Members, output: Tensor, target: Tensor) -> Tensor:
        """The chunk's members' losses ``[n]``: ``trial_losses``; when that raises (not out of memory), each
        member's own ``spec.loss``, a member whose loss raises failing alone (NaN, no gradient from it). A loss
        that ``torch.vmap`` refuses (e.g. data-dependent control flow) but every member computes alone is computed
        member by member from then on (logged once). A :class:`~hydro.loss.LossError` (arguments no member can
        compute a loss of), a loss that does not reduce to a scalar per member, and any other error of the fused
        loss that no member's own loss repeats (the loss's own fault, not a member's), raise."""
        if self.loss_by_member is None:
            try:
                return trial_losses(self.loss, output, target)
            except (torch.OutOfMemoryError, LossError):
                raise
            except Exception as error:  # noqa: BLE001 - which member's own loss raises decides
                fused_error = error
        losses = self._member_values(chunk, "loss", self.loss, output, target)
        computed = [loss for loss in losses if loss is not None]
        if self.loss_by_member is None:
            if any(not isinstance(loss, Tensor) or loss.dim() for loss in computed):
                raise fused_error
            if len(computed) == len(losses):
                if not _vmap_refused(fused_error):
                    raise fused_error
                self.loss_by_member = f"{type(fused_error).__name__}: {str(fused_error).splitlines()[0]}"
                logger.warning("the loss cannot be computed over fused members (%s); computing it member by member",
                               self.loss_by_member)
        return torch.stack([(out.sum() * 0).to(computed[0].dtype) + torch.nan if loss is None else loss
                            for loss, out in zip(losses, output)])

    def _member_values(self, chunk: Members, what: str, fn, output: Tensor, target: Tensor) -> list:
        """``fn(output[i], target)`` of each of the chunk's members, ``None`` where it raised (not out of memory):
        that member fails (:attr:`member_errors`, logged once). Raises the error when every member of the trial
        has failed."""
        values = []
        for member, out in zip(chunk.member_ids, output):
            try:
                values.append(fn(out, target))
            except torch.OutOfMemoryError:
                raise
            except Exception as error:  # noqa: BLE001 - the member's own error fails it alone
                if member not in self.member_errors:
                    self.member_errors[member] = f"{type(error).__name__}: {error}"
                    logger.warning("member %s failed: its %s raised %s; it goes on as a diverged member (NaN), its "
                                   "siblings train on", member, what, self.member_errors[member])
                if all(m in self.member_errors for m in self.member_ids):
                    raise
                values.append(None)
        return values

    @property
    def evaluation_steers_training(self) -> bool:
        """Whether training reads each epoch's evaluation: a schedule follows the members' metric
        (``ReduceLROnPlateau``)."""
        return any(chunk.follows_metric for chunk in self.chunks)

    def run_epoch(self, evaluate: bool = True) -> dict[str, Tensor]:
        """Train the rest of the epoch and evaluate: ``train_loss`` and the validation metrics, each ``[F]``.
        ``evaluate=False`` (only a later epoch's scores are read): the validation metrics are NaN, not computed,
        unless :attr:`evaluation_steers_training`; training is the same either way (see :meth:`evaluate`)."""
        train_loss = self.train_epoch()
        if evaluate or self.evaluation_steers_training:
            metrics = {TRAIN_LOSS: train_loss, **self.evaluate()}
        else:
            unread = torch.full_like(train_loss, torch.nan, dtype=torch.float64)
            metrics = {TRAIN_LOSS: train_loss, **dict.fromkeys([VAL_LOSS, *self.spec.metrics], unread)}
        failed = [i for i, member in enumerate(self.member_ids) if member in self.member_errors]
        for values in metrics.values():
            values[failed] = torch.nan
        for observer in self.observers:
            observer.on_epoch_end(self, metrics)
        return metrics

    def keep(self, positions: Sequence[int]) -> None:
        """Go on with the members at ``positions`` only (early-stopped members leave with their state)."""
        positions, start, chunks = list(positions), 0, []
        for chunk in self.chunks:
            count = len(chunk.member_ids)
            local = [p - start for p in positions if start <= p < start + count]
            if local:
                chunk.keep(local)
                chunks.append(chunk)
            start += count
        self.chunks = chunks
        if self.scaler is not None:
            self.scaler.keep(positions)
        if self._loss_sum is not None:
            self._loss_sum = self._loss_sum[list(positions)]

    def state_dict(self) -> dict:
        """Everything to continue elsewhere (any device): members (weights, optimizer state), progress, torch's
        RNG states."""
        cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return {"member_ids": self.member_ids, "chunks": [len(chunk.member_ids) for chunk in self.chunks],
                "max_fusion": self.max_fusion,
                "members": [chunk.state_dict() for chunk in self.chunks], "epoch": self.epoch,
                "step": self.step, "loss_sum": self._loss_sum, "seen": self._seen, "torch_rng": torch.get_rng_state(),
                "cuda_rng": cuda_rng, "scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: Mapping) -> None:
        if list(state["member_ids"]) != self.member_ids:
            raise ValueError(f"FusedTrial.load_state_dict: the checkpoint holds members {list(state['member_ids'])}, "
                             f"this trial {self.member_ids}; build it with member_ids=checkpoint['member_ids']")
        if len(self.chunks) == 1 and len(state["chunks"]) > 1:  # the checkpointed trial had split after an OOM
            self.chunks = self.chunks[0].split(state["chunks"])
        if [len(chunk.member_ids) for chunk in self.chunks] != state["chunks"]:
            raise ValueError(f"FusedTrial.load_state_dict: the checkpoint holds chunks of {state['chunks']} members, "
                             f"this trial chunks of {[len(c.member_ids) for c in self.chunks]}; load it into a new trial")
        for chunk, saved in zip(self.chunks, state["members"], strict=True):
            chunk.load_state_dict(saved)
        self.max_fusion = state["max_fusion"]
        loss_sum = state["loss_sum"]
        self.epoch, self.step, self._seen = state["epoch"], state["step"], state["seen"]
        self._loss_sum = None if loss_sum is None else loss_sum.to(self.device)
        self._batches = None
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)

    def close(self) -> None:
        """Detach the gates."""
        for gate in self.gates:
            gate.detach(self)
        self.gates = []


def _move(members: Members, target: torch.device, keys: set[str] | None = None) -> set[str]:
    """Move ``members``' modules to ``target`` in place, with the optimizer state entries named in ``keys``
    (``None``: those on the modules' device); returns the names moved. State kept elsewhere on purpose (e.g.
    per-member step counts on the CPU) stays where it is."""
    device = next((p.device for m in members.modules() for p in m.parameters()), None)
    moved = set()
    for module in members.modules():
        module.to(target)
    for optimizer in members.optimizers():
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor) and (value.device == device if keys is None else key in keys):
                    state[key] = value.to(target)
                    moved.add(key)
    return moved


def _vmap_refused(error: BaseException) -> bool:
    """Whether ``error`` is ``torch.vmap`` refusing a function (no batching rule, data-dependent control flow,
    ``.item()``), which the function computed per member would not raise."""
    return isinstance(error, RuntimeError) and ("vmap" in str(error) or "Batching rule" in str(error))
