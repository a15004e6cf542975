"""``KeepResultsOnRetry``: a retried trial keeps every result it reported before it failed.

Ray Tune logs a trial's results to its driver staging folder and copies that folder to the storage path
periodically, in the background. When a failed trial is retried from a checkpoint, Ray's JSON logger copies
the trial's ``result.json`` back from the storage path over the staging copy — which loses every result logged
since the last copy (seen here: a fused trial SIGKILLed right after its first epoch came back without that
epoch). Hydro's member table reads that file: a member that stopped in the lost window would end with no
epochs. This callback copies the trial's result logs to the storage path when Ray decides to retry the trial,
before the trial starts again, so what Ray restores is what was logged. A trial lost before Ray first copied it has
no folder at the storage path yet: the callback makes it. A Tune callback that raises ends the whole run, so this
one logs any error of its own instead (the retry then restores what Ray copied last).
"""
from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.fs
from ray import tune

logger = logging.getLogger(__name__)

RESULT_LOGS = ("result.json", "progress.csv")  # Ray's JSON and CSV loggers' files in a trial's folder


class KeepResultsOnRetry(tune.Callback):
    """Persist a trial's result logs to the storage path when it is retried (``hydro.tune.fit`` adds it; a
    ``HydroSearcher`` adds it to a plain ``tune.Tuner`` run, in :class:`~hydro.tune.search.run_reporter.RunReporter`)."""

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        try:
            _persist_result_logs(trial)
        except Exception as error:  # noqa: BLE001 - a callback's error would end Tuner.fit; the retry goes on
            logger.warning("hydro: could not copy trial %s's result logs to the storage path before its retry (%s); "
                           "it resumes with what Ray copied last", trial.trial_id, error)


def _persist_result_logs(trial) -> None:
    """Copy ``trial``'s result logs from its staging folder to its folder at the storage path (made if missing)."""
    storage = trial.storage
    try:
        storage.syncer.wait()  # a background copy of an older staging folder must not land after ours
    except Exception as error:  # Ray logs it as well; the copy below is what matters here
        logger.warning("hydro: Ray's last copy of the run to %s failed (%s); copying trial %s's results anyway",
                       storage.experiment_fs_path, error, trial.trial_id)
    logs = [name for name in RESULT_LOGS if Path(trial.local_path, name).exists()]
    if logs:
        storage.storage_filesystem.create_dir(storage.trial_fs_path, recursive=True)
    for name in logs:
        pyarrow.fs.copy_files(Path(trial.local_path, name).as_posix(), Path(storage.trial_fs_path, name).as_posix(),
                              destination_filesystem=storage.storage_filesystem)
    logger.debug("persisted the result logs of trial %s before its retry", trial.trial_id)
