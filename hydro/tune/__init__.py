"""Hydro Tuner on Ray Tune: fused, shrunk surrogate trials behind a ``Searcher``, per-member early stopping,
transfer to the full-size target, per-member results.

``TuneSpec`` (the workload in plain torch), ``trainable(spec)`` (the function trainable), ``HydroSearcher``
(the ``search_alg``), ``MemberSession`` (per-member reporting from a custom training loop),
``member_table``/``best_configuration``/``write_results`` (results), ``load_model`` (the trained full-size
model as the user's module, from a run directory or a trial's result), ``target_result`` (the returned
target's ``Result`` in a ``ResultGrid``), ``fit`` (all of it in one call),
``resume`` (go on with an interrupted ``fit`` run, on the same loopback-only local cluster), ``MemberProgress``
(progress in members) and ``KeepResultsOnRetry`` (a retried trial keeps the results it logged; ``fit`` adds it,
and a ``HydroSearcher`` to a plain ``tune.Tuner`` run).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hydro.tune import moved_modules

moved_modules.install()

# Each public name's module, imported on first use: a trial's worker imports only what its trainable needs (a
# fresh worker otherwise pays for the bubble, pipeline and placement wings' imports before its first step).
_EXPORTS = {
    "HydroSearcher": "hydro.tune.search.searcher",
    "KeepResultsOnRetry": "hydro.tune.search.retry_logs",
    "MemberProgress": "hydro.tune.search.progress",
    "MemberSession": "hydro.tune.search.session",
    "TuneSpec": "hydro.trial.spec",
    "TuningFailed": "hydro.tune.run",
    "accuracy": "hydro.trial.spec",
    "best_configuration": "hydro.tune.search.results",
    "fit": "hydro.tune.run",
    "load_model": "hydro.tune.search.results",
    "member_table": "hydro.tune.search.results",
    "resume": "hydro.tune.run",
    "target_result": "hydro.tune.search.results",
    "trainable": "hydro.tune.search.trainable",
    "write_results": "hydro.tune.search.results",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from hydro.trial.spec import TuneSpec, accuracy
    from hydro.tune.run import TuningFailed, fit, resume
    from hydro.tune.search.progress import MemberProgress
    from hydro.tune.search.results import best_configuration, load_model, member_table, target_result, write_results
    from hydro.tune.search.retry_logs import KeepResultsOnRetry
    from hydro.tune.search.searcher import HydroSearcher
    from hydro.tune.search.session import MemberSession
    from hydro.tune.search.trainable import trainable


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hydro.tune' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
