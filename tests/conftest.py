import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
REPO = Path(__file__).resolve().parents[1]


_SHARED = {"ray": None, "modules": set()}  # the shared local cluster (its ray module once started), modules using it


def _uses_shared_cluster(item) -> bool:
    return "ray_cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config, items):
    """The tests of the modules that use the shared cluster (``ray_cluster``), from each module's first test that
    uses it on, run last, one module after another in their collected order (each module's tests keep theirs), so
    the cluster starts once for all of them; a module's tests before that one run earlier, without it."""
    first_users: dict = {}
    for index, item in enumerate(items):
        if _uses_shared_cluster(item):
            first_users.setdefault(item.module, index)
    last = [index >= first_users.get(getattr(item, "module", None), len(items)) for index, item in enumerate(items)]
    items[:] = [item for item, at_end in zip(items, last) if not at_end] + [item for item, at_end in zip(items, last)
                                                                            if at_end]


def pytest_runtest_setup(item):
    """A test that does not use the shared cluster sees Ray as a module-scoped cluster would leave it: stopped,
    unless an earlier test of its own module used it (a test that starts Ray itself, or checks that nothing
    started it, runs without the shared cluster)."""
    if _uses_shared_cluster(item):
        _SHARED["modules"].add(item.module)
    elif _SHARED["ray"] is not None and getattr(item, "module", None) not in _SHARED["modules"]:
        _stop_shared_cluster()


def pytest_sessionfinish(session, exitstatus):
    _stop_shared_cluster()


def _stop_shared_cluster() -> None:
    if _SHARED["ray"] is not None:
        _SHARED["ray"].shutdown()
        _SHARED["ray"] = None


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster (2 CPUs, no dashboard) whose workers import this checkout, shared by the test modules
    that use it (started when a test needs it and Ray is not running; stopped at the end of the session or before a
    test that must not see it, see :func:`pytest_runtest_setup`). A test may shut Ray down; the next module that
    uses the fixture starts it again."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        _SHARED["ray"] = ray
    yield ray


@pytest.fixture
def workload_file(tmp_path):
    """A user's workload file that imports a module beside it (see ``tests/tune/user_project.py``)."""
    from tests.tune.user_project import write_project

    return write_project(tmp_path / "project")
