"""A real local Ray cluster (2 CPUs) per test module; workers import this checkout."""
import os
from pathlib import Path

import pytest
import ray

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()
