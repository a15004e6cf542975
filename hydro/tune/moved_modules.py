"""Old import paths of the Ray package's modules, for run folders saved before they moved into feature wings.

Ray Tune pickles a run's searcher, trial scheduler and callbacks into its folder (``tuner.pkl``, searcher
checkpoints) under their modules' import paths; a run saved by an earlier Hydro names the old paths.
:func:`install` (done on ``import hydro.tune``) makes importing an old path give the module that now holds its
classes, so such a run resumes (``hydro tune --resume``, ``hydro.tune.resume``, ``tune.Tuner.restore``)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {f"hydro.tune.{old}": f"hydro.tune.{new}" for old, new in {
    "searcher": "search.searcher", "trainable": "search.trainable", "session": "search.session",
    "member_decisions": "search.member_decisions", "member_rules": "search.member_rules",
    "random_search": "search.random_search", "space_check": "search.space_check", "results": "search.results",
    "progress": "search.progress", "run_reporter": "search.run_reporter", "retry_logs": "search.retry_logs",
    "bubble_scheduler": "bubbles.scheduler", "bubble_service": "bubbles.service",
    "fill_trainable": "bubbles.fill_trainable", "energy_scheduler": "energy.scheduler",
    "pipeline_job": "pipeline.job"}.items()}  # hydro.tune.placement is the placement wing's package now


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module at its new path (the same module object)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """The module at the new path ran when it was imported."""


def install() -> None:
    """Let the old paths of :data:`MOVED` import (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
