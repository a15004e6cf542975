"""Shared fixtures: a real local Ray cluster (2 CPUs) per test module, whose workers import this checkout."""
import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()
