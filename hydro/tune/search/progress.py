"""Progress of a Hydro run in members, not fused trials: a Ray Tune ``Callback`` that logs one line every
``interval_s`` seconds (and at the end) — members running/stopped/finished/failed/to start, the best member so
far and the full-size target's status. ``hydro.tune.run.fit`` uses it instead of Ray's trial table (whose
header counts ``num_samples=-1`` as 9223372036854775807 trials). A plain ``tune.Tuner`` with a ``HydroSearcher``
gets it without asking (:class:`~hydro.tune.search.run_reporter.RunReporter`)."""
from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ray.tune import Callback
from ray.tune.experiment import Trial

from hydro.trial.plan import TrialKind, plan_of
from hydro.tune.search.session import ERROR_KEY, MEMBERS_KEY

logger = logging.getLogger(__name__)


@dataclass
class MemberCounts:
    """Members by state; ``best``: (member id, objective) of the best member so far; ``target``: its status."""

    running: int = 0
    stopped: int = 0
    finished: int = 0
    failed: int = 0
    to_start: int = 0
    best: tuple[str, float] | None = None
    target: str = "not started"

    def line(self, metric: str) -> str:
        best = "none yet" if self.best is None else f"{self.best[0]} {metric}={self.best[1]:.4g}"
        return (f"members: {self.running} running, {self.stopped} stopped early, {self.finished} finished, "
                f"{self.failed} failed, {self.to_start} to start | best member: {best} | target: {self.target}")


def count_members(trials: Sequence[Trial], latest: Mapping[str, Mapping], metric: str, mode: str,
                  num_samples: int) -> MemberCounts:
    """The members of ``trials`` (Ray trials of a ``HydroSearcher`` run of ``num_samples`` members) by state;
    ``latest``: each member's latest own result (member id -> its metrics, ``done``, ``stopped``)."""
    counts, states = MemberCounts(), Counter()
    for trial in trials:
        plan = plan_of(trial.config)
        result = trial.last_result or {}
        if plan.kind == TrialKind.TARGET:
            counts.target = _target_status(trial, result, metric)
            continue
        if plan.kind != TrialKind.SURROGATE:
            continue
        for member in plan.member_ids:
            values = latest.get(member, {})
            states[_member_state(trial, values, bool(result.get(ERROR_KEY)))] += 1
            value = values.get(metric, math.nan)
            if math.isfinite(value) and (counts.best is None or
                                         (value > counts.best[1] if mode == "max" else value < counts.best[1])):
                counts.best = (member, value)
    counts.running, counts.stopped = states["running"], states["stopped"]
    counts.finished, counts.failed = states["finished"], states["failed"]
    counts.to_start = max(0, num_samples - sum(states.values()))
    return counts


def _member_state(trial: Trial, values: dict, failed: bool) -> str:
    if values.get("stopped") is True:
        return "stopped"
    if values.get("done") is True:
        return "finished"
    if failed or trial.status == Trial.ERROR:
        return "failed"
    return "finished" if trial.status == Trial.TERMINATED else "running"


def _target_status(trial: Trial, result: dict, metric: str) -> str:
    if trial.status == Trial.ERROR or result.get(ERROR_KEY):
        return "failed"
    value = result.get(metric)
    progress = f"epoch {result['epoch']}, {metric}={value:.4g}" if "epoch" in result else "starting"
    return f"finished ({progress})" if trial.status == Trial.TERMINATED else f"training ({progress})"


def show_progress() -> None:
    """Make the progress lines visible where logging is not configured (a handler on stderr, INFO)."""
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("hydro: %(message)s"))
        logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)


class MemberProgress(Callback):
    """Logs :func:`count_members` (logger ``hydro.tune.search.progress``, INFO) every ``interval_s`` seconds."""

    def __init__(self, metric: str, mode: str, num_samples: int, interval_s: float = 10.0) -> None:
        self.metric, self.mode, self.num_samples, self.interval_s = metric, mode, num_samples, interval_s
        self.latest: dict[str, dict] = {}
        self._last = 0.0

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info) -> None:
        for member, values in result.get(MEMBERS_KEY, {}).items():
            if math.isfinite(values.get("epoch", math.nan)):  # not the placeholder of a member that left
                self.latest[member] = values

    def on_step_end(self, iteration: int, trials: list[Trial], **info) -> None:
        if time.monotonic() - self._last >= self.interval_s:
            self._log(trials)

    def on_experiment_end(self, trials: list[Trial], **info) -> None:
        self._log(trials)

    def _log(self, trials: list[Trial]) -> None:
        self._last = time.monotonic()
        counts = count_members(trials, self.latest, self.metric, self.mode, self.num_samples)
        logger.info(counts.line(self.metric))
