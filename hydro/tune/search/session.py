"""Per-member reporting inside a trial: the path for custom training loops, and what ``trainable`` uses.

In a Ray Tune function trainable started by a ``HydroSearcher``::

    session = MemberSession(config, metric="val_acc", mode="max")
    ids, configs = session.member_ids, session.configs   # build and fuse your members from these
    for epoch in range(1, epochs + 1):
        ...                                               # train; evaluate each member: values [F]
        keep = session.step(epoch, {"val_acc": acc}, final=epoch == epochs)
        if len(keep) < len(ids):
            hydro.keep_members(fused, keep, optimizer=opt)   # early-stopped members leave, with their state
        session.report(checkpoint=...)                    # one tune.report with every member's results
        if not keep:
            break

An exception of the trial's own code (building or training its members: the user's model, loss, data) would
raise again if Tune retried the trial: ``MemberSession.failing()`` turns it into failed members (``fail``) instead;
a lost process, node or actor, or out of memory, still reaches Tune, which retries it (``FailureConfig``).
"""
from __future__ import annotations

import contextlib
import logging
import math
import traceback
from collections.abc import Iterator, Mapping, Sequence

import ray
import torch
from ray import tune

from hydro.trial.check import describe
from hydro.tune.search.member_decisions import lookup_service
from hydro.trial.plan import TrialKind, TrialPlan, plan_of
from hydro.trial.spec import TRAIN_LOSS, VAL_LOSS
from schedulers.member_stopping import score

logger = logging.getLogger(__name__)

MEMBERS_KEY = "members"
ERROR_KEY = "hydro_error"  # a trial that could not train its members: the cause, one line (its members failed)
TRACEBACK_KEY = "hydro_traceback"  # ... and the traceback of that cause
TRIAL_CPUS_KEY, TRIAL_GPUS_KEY = "trial_cpus", "trial_gpus"  # the Ray resources the trial was given (per trial)
MEMBER_ONLY = ("done", "stopped", "epoch", "training_iteration")  # per-member bookkeeping, not trial metrics


class TrialLost(RuntimeError):
    """The trial's work was lost, not failed by its own code (its process was killed, e.g. by the OOM killer, or
    hangs): a retry can succeed, so it is raised to Tune."""


class TrialFailed(RuntimeError):
    """The trial's own code raised where the exception itself cannot travel (a fill trial's process): the
    message is the cause in one line, ``details`` its traceback."""

    def __init__(self, cause: str, details: str) -> None:
        super().__init__(cause)
        self.details = details


def repeats(error: BaseException) -> bool:
    """Whether ``error`` would repeat if its trial were retried: a Python exception of the trial's own code. Not
    Ray's errors (a lost worker, actor, node or object), a :class:`TrialLost`, nor running out of memory (the
    trial already split its members down to one; what else uses the GPU varies)."""
    return isinstance(error, Exception) and not isinstance(error, (ray.exceptions.RayError, TrialLost,
                                                                   torch.OutOfMemoryError))


class MemberSession:
    """The members of this trial (``member_ids``/``configs``, in fused order; ``scale``, ``mup`` from the
    trial's plan), their early-stopping decisions and their per-member reports. A restored trial passes its
    surviving ``member_ids`` and the ``epoch`` it resumes after."""

    def __init__(self, config: Mapping, metric: str, mode: str, member_ids: Sequence[str] | None = None,
                 epoch: int = 0) -> None:
        self.plan: TrialPlan = plan_of(config)
        self.metric, self.mode = metric, mode
        self._configs = dict(self.plan.members)
        self.member_ids = list(member_ids) if member_ids is not None else list(self._configs)
        self._service = lookup_service(self.plan.decisions) if self.plan.decisions else None
        self._pending: dict | None = None
        self.epoch = epoch  # the last epoch stepped

    @property
    def configs(self) -> list[dict]:
        return [self._configs[m] for m in self.member_ids]

    @property
    def scale(self) -> int:
        return self.plan.scale

    @property
    def mup(self) -> bool:
        return self.plan.mup

    def step(self, epoch: int, metrics: Mapping[str, Sequence[float] | torch.Tensor], final: bool = False,
             extra: Mapping | None = None, evaluated: bool = True) -> list[int]:
        """Record each member's ``metrics`` (name -> ``[F]`` values in ``member_ids`` order) for ``epoch``, ask
        which members stop, and return the positions of those that go on (none after the ``final`` epoch). A
        member whose ``train_loss`` or ``val_loss`` is NaN or inf diverged: all its metrics are NaN, the worst
        value for stopping and ranking whatever the tuned metric. ``evaluated=False``: the epoch's validation
        metrics were not computed (NaN); only ``train_loss`` says whether a member diverged."""
        if self.metric not in metrics:
            raise KeyError(f"the tuned metric {self.metric!r} is not among the reported metrics {sorted(metrics)}")
        results = {m: {k: float(v[i]) for k, v in metrics.items()} for i, m in enumerate(self.member_ids)}
        checked = (TRAIN_LOSS, VAL_LOSS) if evaluated else (TRAIN_LOSS,)
        for result in results.values():
            if not all(math.isfinite(result[k]) for k in checked if k in result):
                result.update(dict.fromkeys(metrics, math.nan))  # diverged: e.g. the accuracy of NaN logits is noise
            result.update(epoch=epoch, training_iteration=epoch)
        self._names = [*metrics, "epoch", "training_iteration"]
        self.epoch = epoch
        objective = {m: r[self.metric] for m, r in results.items()}
        if self.plan.halving is not None:  # a rung trial's halving: decided here, from all its live members
            stop = set() if final else self.plan.halving.stops(
                epoch, {m: score(v, self.mode) for m, v in objective.items()})
        else:
            stop = set(ray.get(self._service.decide.remote(epoch, objective, final))) if self._service else set()
        for member, result in results.items():
            result.update(done=final or member in stop, stopped=member in stop)
        keep = [] if final else [i for i, m in enumerate(self.member_ids) if m not in stop]
        self._pending = self._trial_result(results, epoch, len(keep), dict(extra or {}))
        self.member_ids = [self.member_ids[i] for i in keep]
        return keep

    def report(self, checkpoint: tune.Checkpoint | None = None) -> None:
        """``tune.report`` the last ``step``'s results (with ``checkpoint``, taken after slicing)."""
        if self._pending is None:
            raise RuntimeError("MemberSession.report() needs a step() first")
        tune.report(self._pending, checkpoint=checkpoint)
        self._pending = None

    @contextlib.contextmanager
    def failing(self) -> Iterator[None]:
        """Run the trial's code: an exception that would :func:`repeat <repeats>` ends the trial with its live
        members failed (:meth:`fail`) instead of reaching Tune; any other error is raised (Tune retries it)."""
        try:
            yield
        except Exception as error:
            if not repeats(error):
                raise
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """Report that this trial's live members cannot train on (a deterministic error, when building them or at
        any epoch): the trial ends with ``hydro_error`` (the cause, one line) and ``hydro_traceback`` set instead of
        raising, so Tune's ``FailureConfig`` does not retry what would fail the same way again; the searcher
        counts these members as failed, with the results they reported before. A plain trial raises ``error``."""
        if self.plan.kind == TrialKind.PLAIN:
            raise error
        cause = str(error) if isinstance(error, TrialFailed) else describe(error)
        details = error.details if isinstance(error, TrialFailed) else "".join(traceback.format_exception(error))
        logger.error("hydro: members %s failed after epoch %d, not retried (their trial's own code raised; the "
                     "traceback is the trial's %s): %s", ", ".join(self.member_ids), self.epoch, TRACEBACK_KEY, cause)
        tune.report({"epoch": self.epoch, "hydro_kind": self.plan.kind.value, "live_members": 0,
                     self.metric: math.nan, ERROR_KEY: cause, TRACEBACK_KEY: details})

    def _trial_result(self, results: dict[str, dict], epoch: int, live: int, extra: dict) -> dict:
        """Surrogates: per-member results under ``members/<id>/...``, the best member's objective as
        ``best_member_<metric>``, and the objective itself only if the run has no target (else NaN, so
        the run's best result is the target's). Target and plain trials: their metrics at the top level."""
        report = {"epoch": epoch, "hydro_kind": self.plan.kind.value, "live_members": live, **extra}
        if self.plan.kind != TrialKind.SURROGATE:
            (result,) = results.values()
            return {**report, **{k: v for k, v in result.items() if k not in MEMBER_ONLY}}
        values = [r[self.metric] for r in results.values() if math.isfinite(r[self.metric])]
        best = (max(values) if self.mode == "max" else min(values)) if values else math.nan
        # Every member of the plan, every time: members that left earlier as NaN placeholders. Ray's CSV logger
        # writes the rows of a restored trial in the key order of its first new result under the old header, so a
        # trial whose key set shrank (stopped members) would have its columns misaligned after a restore.
        gone = dict.fromkeys([*self._names, "done", "stopped"], math.nan)
        results = {m: results.get(m, gone) for m in self._configs}
        return {**report, MEMBERS_KEY: results, f"best_member_{self.metric}": best,
                self.metric: best if self.plan.reports_objective else math.nan}
