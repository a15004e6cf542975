"""The workers of the local cluster ``hydro tune`` starts import what the user's driver imports: this Hydro
(its checkout first) and the modules on the user's ``PYTHONPATH``. Ray's runtime-env ``env_vars`` replace a
variable, so setting ``PYTHONPATH`` to the checkout alone hid the user's modules from every trial."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from hydro.tune.cluster.worker_env import PACKAGE_ROOT, passive_openmp, worker_env_vars, worker_pythonpath
from tests.conftest import REPO

DRIVER = textwrap.dedent('''
    import ray
    from hydro.tune.cli import connect
    from hydro.tune.search.searcher import _RayCluster

    connect(None)
    print(ray.get(ray.remote(lambda: __import__("os").environ.get("OMP_WAIT_POLICY")).remote()))
    print(_RayCluster(None).lone_trial_cpus() == ray.cluster_resources()["CPU"])
    print(ray.get(ray.remote(lambda: __import__("user_helpers").VALUE).remote()))
    ray.shutdown()
''')


def test_worker_pythonpath_puts_the_checkout_before_the_users_entries():
    assert worker_pythonpath("/hydro", {}) == "/hydro"
    assert worker_pythonpath("/hydro", {"PYTHONPATH": "/a::/b"}) == os.pathsep.join(["/hydro", "/a", "/b"])
    assert worker_pythonpath(environ={"PYTHONPATH": ""}) == PACKAGE_ROOT


def test_workers_wait_passively_in_openmp_unless_the_driver_says_otherwise():
    assert worker_env_vars("/hydro", {}) == {"PYTHONPATH": "/hydro", "OMP_WAIT_POLICY": "PASSIVE"}
    assert worker_env_vars("/hydro", {"OMP_WAIT_POLICY": "active"})["OMP_WAIT_POLICY"] == "active"
    assert passive_openmp(worker_env_vars("/hydro", {})) and passive_openmp({"OMP_WAIT_POLICY": " passive"})
    assert not passive_openmp({}) and not passive_openmp({"OMP_WAIT_POLICY": "ACTIVE"})


def test_a_module_on_the_drivers_pythonpath_imports_in_the_embedded_clusters_workers(tmp_path):
    """... and its workers wait passively in OpenMP, so a lone trial may train on every CPU of the node."""
    (tmp_path / "user_helpers.py").write_text("VALUE = 'imported in the worker'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)]), "RAY_USAGE_STATS_ENABLED": "0"}
    run = subprocess.run([sys.executable, "-c", DRIVER], env=env, cwd=tmp_path.parent, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-3:] == ["PASSIVE", "True", "imported in the worker"]
