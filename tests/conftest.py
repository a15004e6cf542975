import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster (2 CPUs, no dashboard) whose workers import this checkout."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield ray
    ray.shutdown()


@pytest.fixture
def workload_file(tmp_path):
    """A user's workload file that imports a module beside it (see ``tests/tune/user_project.py``)."""
    from tests.tune.user_project import write_project

    return write_project(tmp_path / "project")
