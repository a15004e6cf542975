"""Ray Tune's basic variant generation (random sampling and ``grid_search``) as a seeded ``Searcher``: the
inner searcher of a ``HydroSearcher`` built without one."""
from __future__ import annotations

import pickle

import numpy as np
from ray.tune.search import Searcher
from ray.tune.search.variant_generator import generate_variants


class RandomSearch(Searcher):
    """Configurations drawn as Ray's ``BasicVariantGenerator`` draws them: every ``grid_search`` combination
    of each random draw of the other domains. ``space`` may also come from ``Tuner(param_space=...)``."""

    def __init__(self, space: dict | None = None, metric: str | None = None, mode: str | None = None,
                 seed: int | None = None) -> None:
        super().__init__(metric=metric, mode=mode)
        self._space = space
        self._rng = np.random.default_rng(seed)
        self._pending: list[dict] = []

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if self._space and config:
            return False
        self._space = config or self._space
        self._metric, self._mode = metric or self._metric, mode or self._mode
        return True

    def suggest(self, trial_id: str) -> dict | None:
        if not self._space:
            raise ValueError("RandomSearch has no search space: pass param_space to tune.Tuner (or space=)")
        if not self._pending:
            self._pending = [config["config"] for _, config in
                             generate_variants({"config": self._space}, random_state=self._rng)]
        return self._pending.pop(0)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Random search learns nothing from results."""

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
