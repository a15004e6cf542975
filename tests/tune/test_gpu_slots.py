"""Trial slots counted per GPU card on a Ray cluster that declares 8 GPUs (this machine has none: Ray counts
declared resources, which is all the searcher reads): trials given fractions of a GPU pack per card, so an
8-GPU node gives the search 8 slots, not 1."""
from __future__ import annotations

import pytest
import ray

from hydro.tune import HydroSearcher
from hydro.tune.search.random_search import RandomSearch
from tests.conftest import REPO
from tests.tune.workload import SPACE, spec


@pytest.fixture(scope="module")
def eight_gpu_node():
    ray.init(address="local", num_cpus=2, num_gpus=8, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()


@pytest.mark.parametrize("request_, slots", [
    ({"cpu": 0.25, "gpu": 0.5}, 8),   # two trials per card, one slot per card
    ({"cpu": 0.125, "gpu": 0.25}, 8),
    ({"cpu": 0.25, "gpu": 1}, 8),     # a whole card each
    ({"cpu": 1, "gpu": 0.5}, 2),      # the node's 2 CPUs fit 2 trials: 2 cards busy
])
def test_the_searcher_counts_a_slot_per_gpu_card(eight_gpu_node, request_, slots):
    searcher = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=16, fusion=2, trial_resources=request_)
    assert searcher._cluster.trial_slots() == slots
