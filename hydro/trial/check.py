"""Checks before anything trains (no Ray): the workload as a whole in the driver (``check_workload``), and each
member's configuration before its fused trial starts (``check_member``), so that a bad input fails once, early,
with one message, and a bad member cannot take its siblings down with it."""
from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Mapping, Sequence

import torch

from hydro.binder import FuseError
from hydro.checks import is_whole
from hydro.optim.dynamo_guard import optimizers_unguarded
from hydro.shrink.errors import ShrinkError
from hydro.trial.data import DataSource, TensorSource
from hydro.trial.members import build_members
from hydro.trial.optimizer import UnsupportedOptimizer
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.trial.unit import FusedTrial

# Errors of building or configuring members: the same configuration fails the same way every time (not retried).
CONFIG_ERRORS = (FuseError, ShrinkError, UnsupportedOptimizer, KeyError, TypeError, ValueError)


# What a numeric failure of one configuration says (its training overflowed, its outputs are NaN or inf): another
# configuration of the same space may train.
NUMERIC = re.compile(r"\b(nan|inf|infinity|infinite|finite|overflow)\b", re.IGNORECASE)


class WorkloadError(ValueError):
    """The workload cannot be tuned as given (raised in the driver, before any trial starts). ``numeric``: the
    configuration it was checked with failed numerically (another one may train)."""

    def __init__(self, message: str, numeric: bool = False) -> None:
        super().__init__(message)
        self.numeric = numeric


def describe(error: BaseException) -> str:
    """``Type: message`` of an error, as Hydro reports a member's or a trial's failure."""
    return f"{type(error).__name__}: {error}"


def check_member(spec: TuneSpec, config: Mapping) -> str | None:
    """Why ``config`` cannot train (its batch size, optimizer or model rejects it, e.g. a negative learning rate
    or a missing key), or ``None``. The model is built on the meta device (no memory, no init) and, if that
    fails, on the CPU, so a model that cannot be built on meta is not rejected for it."""
    try:
        size = config.get("batch_size", spec.batch_size)
        if not is_whole(size) or size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {size!r}")
        with optimizers_unguarded():  # a probe, as hydro.trial.optimizer's
            spec.optimizer([torch.nn.Parameter(torch.zeros(1))], config)
        try:
            with torch.device("meta"):
                spec.model(config)
        except Exception:  # noqa: BLE001 - only a CPU build decides
            spec.model(config)
    except CONFIG_ERRORS as error:
        return describe(error)
    return None


def check_workload(spec: TuneSpec, config: Mapping, scale: int, data: tuple[DataSource, DataSource]) -> None:
    """Build two fused members of ``config`` as a run at ``scale`` trains them (shrunk when ``scale > 1``, the
    optimizer translated) and the full-size target, and train each one batch and evaluate it on one batch of
    ``data``, on the CPU (a CUDA-only option, ``cuda_graphs``, is left to the trials); torch's warning that a loss
    broadcasts its input and target of different shapes is an error here. Raises :class:`WorkloadError` naming the
    step that failed (``numeric`` when it failed on NaN or inf values or an overflow)."""
    check_finite(data)
    size = spec.batch_size_of(config)
    cpu_spec = dataclasses.replace(spec, cuda_graphs=False)  # CUDA graphs: left to the trials, on their GPUs
    small = (data[0].sample(size), data[1].sample(size))
    surrogate = TrialPlan(TrialKind.SURROGATE, [("check0", dict(config)), ("check1", dict(config))], scale, scale > 1)
    target = TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, dict(config))], 1, scale > 1)
    for what, plan in [(f"two fused members at scale {scale}", surrogate), ("the full-size target", target)]:
        losses = None
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message="Using a target size", category=UserWarning)
                trial = FusedTrial(cpu_spec, plan, small, device="cpu")  # the driver's GPU is not the trials' to take
                losses = trial.train_step()
                trial.evaluate()
        except ShrinkError as error:  # the model cannot be shrunk at this scale: its cause and fix first
            raise WorkloadError(f"{error} (building {what} of the configuration {dict(config)})") from error
        except Exception as error:
            numeric = bool(NUMERIC.search(str(error))) or isinstance(error, (FloatingPointError, OverflowError)) \
                or (losses is not None and not bool(torch.isfinite(losses).all()))
            raise WorkloadError(f"hydro: the workload fails before tuning starts, training {what} one batch with "
                                f"the configuration {dict(config)}: {describe(error)}", numeric) from error


def check_any_workload(spec: TuneSpec, configs: Sequence[Mapping], scale: int,
                       data: tuple[DataSource, DataSource]) -> Mapping:
    """:func:`check_workload` with the first of ``configs`` (configurations of the space to tune) that passes: a
    configuration that fails numerically (it diverges at once: its members will fail alone in the run) is
    followed by the next one. Returns the configuration that passed; raises the first :class:`WorkloadError` when
    none does, or at once when the failure is not numeric (the workload itself fails)."""
    first = None
    for config in configs:
        try:
            check_workload(spec, config, scale, data)
            return config
        except WorkloadError as error:
            if not error.numeric:
                raise
            first = first or error
    raise first


def check_finite(data: tuple[DataSource, DataSource]) -> None:
    """Raise :class:`WorkloadError` when the in-memory (tensor) training or validation data holds NaN or inf: every
    member trained on it would diverge (other sources are not read whole here)."""
    for name, split in zip(("training", "validation"), data):
        if not isinstance(split, TensorSource):
            continue
        for part, values in (("inputs", split.x), ("targets", split.y)):
            if values.is_floating_point() or values.is_complex():
                bad = int((~torch.isfinite(values)).sum())
                if bad:
                    raise WorkloadError(f"hydro: the {name} data's {part} hold {bad} NaN or inf value(s) "
                                        f"(TuneSpec.data()): every member trained on them diverges; clean or drop "
                                        f"them (e.g. torch.nan_to_num, or a mask on torch.isfinite)")


def check_group_by(spec: TuneSpec, config: Mapping, values: Mapping, mup: bool) -> None:
    """Raise :class:`WorkloadError` when a key outside ``TuneSpec.group_by`` changes the model or the optimizer's
    kind: ``values`` holds, per key, another value the param space samples for it (``config`` is a member's
    configuration); the configuration with it and ``config`` are built as two fused full-size members (µP when
    ``mup``, as a shrunk run's members), and each key that alone makes them unfusable is named."""
    def fusable(configs: list[Mapping]) -> bool:
        try:
            build_members(spec, configs, ["check0", "check1"], 1, fuse=True, mup=mup)
        except (FuseError, UnsupportedOptimizer):
            return False
        except Exception:  # noqa: BLE001 - the configuration itself fails: check_member rejects it when drawn
            return True
        return True

    free = {k: v for k, v in values.items() if k not in spec.group_by and k != "batch_size" and v != config.get(k)}
    if not free or fusable([config, {**config, **free}]):
        return
    keys = [k for k, v in free.items() if fusable([{**config, k: v}] * 2) and not fusable([config, {**config, k: v}])]
    if not keys:
        return  # only a combination of keys fails: the members' trials report it
    shown = "; ".join(f"{k}={config.get(k)!r} vs {k}={free[k]!r}" for k in keys)
    fix = [*spec.group_by, *keys]
    raise WorkloadError(f"hydro: TuneSpec.group_by misses {', '.join(map(repr, keys))}: configurations that differ "
                        f"only in {'it' if len(keys) == 1 else 'them'} build models (or optimizers) that cannot share "
                        f"a fused trial ({shown}). Fix: TuneSpec(group_by={fix!r}), so that members with different "
                        f"values train in separate fused trials (group_by is now {list(spec.group_by)})")
