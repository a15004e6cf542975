"""What a plain ``tune.Tuner`` run with a ``HydroSearcher`` gets as ``hydro.tune.fit`` gives it, with nothing but
the searcher passed: :class:`RunReporter` logs member progress in place of Ray's trial reporter (whose header counts
``num_samples=-1`` as 9223372036854775807 trials and whose config columns are empty for fused trials), keeps a
retried trial's results (:class:`~hydro.tune.search.retry_logs.KeepResultsOnRetry`) and writes the member table, the best
configuration and the trained full-size model to the run directory at the end (``write_results``).

The searcher adds it to the run it is set up in (:func:`attach`, from ``HydroSearcher.set_search_properties``)
through Ray Tune's ``RAY_TUNE_CALLBACKS`` hook: Tune instantiates the callbacks named there when it makes the run's
default callbacks, right after it sets up the searcher, and puts them first, so Tune's reporter of the new output
engine is this one. ``fit`` reports itself (``HydroSearcher(run_reporter=False)``).
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING

import pandas as pd
from ray.tune import Result
from ray.tune.constants import RAY_TUNE_CALLBACKS_ENV_VAR
from ray.tune.experiment import Trial
from ray.tune.experimental.output import AirVerbosity
from ray.tune.experimental.output import ProgressReporter as AirProgressReporter
from ray.tune.utils import flatten_dict

from hydro.tune.cluster.ray_internals import tune_run_locals
from hydro.tune.search.progress import MemberProgress, show_progress
from hydro.tune.search.results import failure_summary, failures_line, write_results
from hydro.tune.search.retry_logs import RESULT_LOGS, KeepResultsOnRetry

if TYPE_CHECKING:
    from hydro.tune.search.searcher import HydroSearcher

logger = logging.getLogger(__name__)

JSON_LOG = RESULT_LOGS[0]  # Tune's JSON logger's file in a trial's folder
_pending: list[tuple[HydroSearcher, str | None]] = []  # (searcher, RAY_TUNE_CALLBACKS before attach)


def attach(searcher: HydroSearcher) -> None:
    """Make the ``ray.tune.run`` call setting up ``searcher`` add a :class:`RunReporter` of it (nothing outside
    one)."""
    if tune_run_locals() is None:
        return
    while _pending:  # left by a run that failed between its searcher's setup and its callbacks'
        _restore(_pending.pop()[1])
    previous = os.environ.get(RAY_TUNE_CALLBACKS_ENV_VAR)
    _pending.append((searcher, previous))
    os.environ[RAY_TUNE_CALLBACKS_ENV_VAR] = ",".join(filter(None, [previous, f"{__name__}.RunReporter"]))


def _logged_results(trial: Trial) -> list[dict]:
    """The results in the trial's ``result.json`` on the driver (one JSON object a line; an unfinished last line
    is left out), flattened as Tune's result tables are."""
    path = os.path.join(trial.local_path, JSON_LOG) if trial.local_path else ""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(flatten_dict(json.loads(line), delimiter="/"))
            except json.JSONDecodeError:
                break
    return rows


def _restore(previous: str | None) -> None:
    if previous is None:
        os.environ.pop(RAY_TUNE_CALLBACKS_ENV_VAR, None)
    else:
        os.environ[RAY_TUNE_CALLBACKS_ENV_VAR] = previous


class RunReporter(MemberProgress, KeepResultsOnRetry, AirProgressReporter):
    """Member progress (logger ``hydro.tune.search.progress``) and the result files of a ``HydroSearcher`` run; made by
    Tune from ``RAY_TUNE_CALLBACKS`` (see :func:`attach`), for the searcher that attached it."""

    def __init__(self) -> None:
        self.searcher, previous = _pending.pop() if _pending else (None, None)
        _restore(previous)
        spec = self.searcher.spec if self.searcher is not None else None
        MemberProgress.__init__(self, spec.metric if spec else "", spec.mode if spec else "max",
                                self.searcher.driver.state.pool.num_samples if spec else 0)
        AirProgressReporter.__init__(self, AirVerbosity.SILENT)
        self.histories: dict[str, list[dict]] = {}  # trial id -> its results, flattened as Tune's logs flatten them
        if self.searcher is not None:
            show_progress()

    def setup(self, start_time: float | None = None, **info) -> None:
        """Tune sets up its callbacks and its reporter (with the run's ``start_time``) alike; this is both."""
        self._start_time = start_time or self._start_time or time.time()

    def experiment_started(self, experiment_name: str, experiment_path: str, **info) -> None:
        """Instead of Ray's header: where the results go; Ray's own reporter of the run prints no trial table."""
        for callback in (tune_run_locals() or {}).get("callbacks", ()):
            if isinstance(callback, AirProgressReporter) and callback is not self:
                callback._start_time = self._start_time  # Tune sets up only the reporter it prints with
                if self.searcher is not None:
                    callback._verbosity = AirVerbosity.SILENT  # its errors still print
        if self.searcher is None:
            return
        logger.info("tuning %d member configurations with %s; results in %s", self.num_samples,
                    type(self.searcher.inner).__name__, experiment_path)

    def print_heartbeat(self, trials: list[Trial], *args, force: bool = False) -> None:
        """Progress is logged each step (:meth:`MemberProgress.on_step_end`), with either output engine."""

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info) -> None:
        if self.searcher is None:
            return
        MemberProgress.on_trial_result(self, iteration, trials, trial, result, **info)
        self.histories.setdefault(trial.trial_id, []).append(flatten_dict(result, delimiter="/"))

    def on_step_end(self, iteration: int, trials: list[Trial], **info) -> None:
        if self.searcher is not None:
            MemberProgress.on_step_end(self, iteration, trials, **info)

    def on_trial_start(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        """Nothing: the member progress says it."""

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        """Nothing: the member progress says it."""

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial, **info) -> None:
        """Nothing: Ray's reporter prints the error, the member progress counts its members as failed."""

    def on_checkpoint(self, iteration: int, trials: list[Trial], trial: Trial, checkpoint, **info) -> None:
        """Nothing: the trained model's checkpoint is in the best configuration's file."""

    def on_experiment_end(self, trials: list[Trial], **info) -> None:
        if self.searcher is None or not trials:
            return
        MemberProgress.on_experiment_end(self, trials, **info)
        storage = trials[0].storage
        if storage.storage_filesystem.type_name != "local":
            logger.warning("the run is stored in %s (%s): write its member table with hydro.tune.write_results("
                           "results, spec, directory) after Tuner.fit()", storage.experiment_fs_path,
                           storage.storage_filesystem.type_name)
            return
        results = [self._result(trial) for trial in trials if trial.last_result]
        try:
            table, best = write_results(results, self.searcher.spec, storage.experiment_fs_path)
        except Exception as error:  # noqa: BLE001 - the run itself is done: Tuner.fit() returns its results
            logger.error("writing the member table to %s failed (%s: %s); write it with hydro.tune.write_results("
                         "results, spec) after Tuner.fit()", storage.experiment_fs_path, type(error).__name__, error)
            return
        rejected = self.searcher.rejected_members()
        if best is None:
            logger.error("%s; written: %s", failure_summary(results, rejected), table)
            return
        line = failures_line(results, rejected)
        if line:
            logger.warning(line)
        logger.info("written: %s, %s", table, best)

    def _result(self, trial: Trial) -> Result:
        """``trial``'s result as Tune's ``ResultGrid`` gives it; its history: what Tune's JSON logger holds (a
        restored run's earlier results too), then the results this callback saw (the last report of a member
        counts, so a result in both is harmless)."""
        history = [*_logged_results(trial), *self.histories.get(trial.trial_id, [])]
        error = None
        if trial.status == Trial.ERROR:
            error = trial.get_pickled_error() or RuntimeError(trial.get_error() or f"trial {trial} failed")
        return Result(metrics=dict(trial.last_result), checkpoint=trial.checkpoint, error=error, path=trial.path,
                      metrics_dataframe=pd.DataFrame(history) if history else None)
