"""Hydro Tuner on Ray Tune: fused, shrunk surrogate trials behind a ``Searcher``, per-member early stopping,
transfer to the full-size target, per-member results.

``TuneSpec`` (the workload in plain torch), ``trainable(spec)`` (the function trainable), ``HydroSearcher``
(the ``search_alg``), ``MemberSession`` (per-member reporting from a custom training loop),
``member_table``/``best_configuration``/``write_results`` (results).
"""
from hydro.tune.results import best_configuration, member_table, write_results
from hydro.tune.searcher import HydroSearcher
from hydro.tune.session import MemberSession
from hydro.trial.spec import TuneSpec, accuracy
from hydro.tune.trainable import trainable

__all__ = ["HydroSearcher", "MemberSession", "TuneSpec", "accuracy", "best_configuration", "member_table",
           "trainable", "write_results"]
