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
from hydro.tune import moved_modules
from hydro.tune.search.progress import MemberProgress
from hydro.tune.search.retry_logs import KeepResultsOnRetry
from hydro.tune.search.results import best_configuration, load_model, member_table, target_result, write_results
from hydro.tune.run import TuningFailed, fit, resume
from hydro.tune.search.searcher import HydroSearcher
from hydro.tune.search.session import MemberSession
from hydro.trial.spec import TuneSpec, accuracy
from hydro.tune.search.trainable import trainable

moved_modules.install()

__all__ = ["HydroSearcher", "KeepResultsOnRetry", "MemberProgress", "MemberSession", "TuneSpec", "TuningFailed",
           "accuracy", "best_configuration", "fit", "load_model", "member_table", "resume", "target_result", "trainable",
           "write_results"]
