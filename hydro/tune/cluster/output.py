"""How much of Ray's own output a Hydro run shows: by default none of its trial table and log lines (Hydro's member
progress says what they would, in members), all of it with ``verbose`` (``hydro tune --verbose``)."""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

NEW_OUTPUT = "RAY_AIR_NEW_OUTPUT"
# Ray's log lines a quiet run leaves out (logger -> the lowest level it still shows): the cluster's start and token
# notices, Tune's "Removed the following hyperparameter values when logging to tensorboard" per trial and its
# "Wrote the latest version of all result files" at the end.
DRIVER_LOGGERS = {"ray._private.worker": logging.WARNING,
                  "ray._private.authentication.authentication_token_setup": logging.ERROR,
                  "ray.tune.logger.tensorboardx": logging.WARNING, "ray.tune.tune": logging.WARNING}
# In a trial's process: "Checkpoint successfully created at: ..." after every checkpoint.
TRIAL_LOGGERS = {"ray.train._internal.storage": logging.WARNING}


@contextlib.contextmanager
def ray_output(show: bool) -> Iterator[None]:
    """Ray's trial table and log lines when ``show``; else neither (Ray 2.60's default output prints its header,
    e.g. "Number of trials 9223372036854775807", at any verbosity; its legacy output obeys ``verbose=0``). The
    environment and the loggers' levels are restored on exit."""
    if show:
        yield
        return
    saved, levels = os.environ.get(NEW_OUTPUT), _raise_levels(DRIVER_LOGGERS)
    os.environ[NEW_OUTPUT] = "0"
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        if saved is None:
            os.environ.pop(NEW_OUTPUT, None)
        else:
            os.environ[NEW_OUTPUT] = saved


def quiet_trial() -> None:
    """Leave Ray's per-checkpoint log line out of this trial process's output."""
    _raise_levels(TRIAL_LOGGERS)


def _raise_levels(levels: dict[str, int]) -> dict[str, int]:
    """Set each logger to at least its level; returns the levels they had."""
    before = {}
    for name, level in levels.items():
        log = logging.getLogger(name)
        before[name] = log.level
        log.setLevel(max(level, log.getEffectiveLevel()))
    return before
