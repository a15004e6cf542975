"""Checks before anything trains (no Ray): the workload as a whole in the driver (``check_workload``), and each
member's configuration before its fused trial starts (``check_member``), so that a bad input fails once, early,
with one message, and a bad member cannot take its siblings down with it."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from hydro.binder import FuseError
from hydro.optim.dynamo_guard import optimizers_unguarded
from hydro.shrink.errors import ShrinkError
from hydro.trial.optimizer import UnsupportedOptimizer
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan
from hydro.trial.data import DataSource
from hydro.trial.spec import TuneSpec
from hydro.trial.unit import FusedTrial

# Errors of building or configuring members: the same configuration fails the same way every time (not retried).
CONFIG_ERRORS = (FuseError, ShrinkError, UnsupportedOptimizer, KeyError, TypeError, ValueError)


class WorkloadError(ValueError):
    """The workload cannot be tuned as given (raised in the driver, before any trial starts)."""


def describe(error: BaseException) -> str:
    """``Type: message`` of an error, as Hydro reports a member's or a trial's failure."""
    return f"{type(error).__name__}: {error}"


def check_member(spec: TuneSpec, config: Mapping) -> str | None:
    """Why ``config`` cannot train (its batch size, optimizer or model rejects it, e.g. a negative learning rate
    or a missing key), or ``None``. The model is built on the meta device (no memory, no init) and, if that
    fails, on the CPU, so a model that cannot be built on meta is not rejected for it."""
    try:
        if spec.batch_size_of(config) < 1:
            raise ValueError(f"batch_size must be >= 1, got {spec.batch_size_of(config)}")
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
    ``data``, on the CPU (a CUDA-only option, ``cuda_graphs``, is left to the trials). Raises
    :class:`WorkloadError` naming the step that failed."""
    size = spec.batch_size_of(config)
    cpu_spec = dataclasses.replace(spec, cuda_graphs=False)  # CUDA graphs: left to the trials, on their GPUs
    small = (data[0].sample(size), data[1].sample(size))
    surrogate = TrialPlan(TrialKind.SURROGATE, [("check0", dict(config)), ("check1", dict(config))], scale, scale > 1)
    target = TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, dict(config))], 1, scale > 1)
    for what, plan in [(f"two fused members at scale {scale}", surrogate), ("the full-size target", target)]:
        try:
            trial = FusedTrial(cpu_spec, plan, small, device="cpu")  # the driver's GPU is not the trials' to take
            trial.train_step()
            trial.evaluate()
        except ShrinkError as error:  # the model cannot be shrunk at this scale: its cause and fix first
            raise WorkloadError(f"{error} (building {what} of the configuration {dict(config)})") from error
        except Exception as error:
            raise WorkloadError(f"hydro: the workload fails before tuning starts, training {what} one batch with "
                                f"the configuration {dict(config)}: {describe(error)}") from error
