"""``KeepResultsOnRetry``: a retried trial keeps every result it reported before it failed.

Ray Tune logs a trial's results to its driver staging folder and copies that folder to the storage path
periodically, in the background. When a failed trial is retried from a checkpoint, Ray's JSON logger copies
the trial's ``result.json`` back from the storage path over the staging copy — which loses every result logged
since the last copy (seen here: a fused trial SIGKILLed right after its first epoch came back without that
epoch). Hydro's member table reads that file: a member that stopped in the lost window would end with no
epochs. This callback copies the trial's result logs to the storage path when Ray decides to retry the trial,
before the trial starts again, so what Ray restores is what was logged.
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
    ``HydroSearcher`` adds it to a plain ``tune.Tuner`` run, in :class:`~hydro.tune.run_reporter.RunReporter`)."""

    def on_trial_recover(self, iteration: int, trials: list, trial, **info) -> None:
        storage = trial.storage
        try:
            storage.syncer.wait()  # a background copy of an older staging folder must not land after ours
        except Exception as error:  # Ray logs it as well; the copy below is what matters here
            logger.warning("hydro: Ray's last copy of the run to %s failed (%s); copying trial %s's results anyway",
                           storage.experiment_fs_path, error, trial.trial_id)
        for name in RESULT_LOGS:
            local = Path(trial.local_path, name)
            if local.exists():
                pyarrow.fs.copy_files(local.as_posix(), Path(storage.trial_fs_path, name).as_posix(),
                                      destination_filesystem=storage.storage_filesystem)
        logger.debug("persisted the result logs of trial %s before its retry", trial.trial_id)
