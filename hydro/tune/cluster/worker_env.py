"""The environment of the worker processes of a cluster Hydro starts: the Hydro and user modules they import, and
how their OpenMP threads wait."""
from __future__ import annotations

import os
from collections.abc import Mapping

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

OPENMP_WAIT = "OMP_WAIT_POLICY"


def worker_pythonpath(root: str = PACKAGE_ROOT, environ: Mapping[str, str] = os.environ) -> str:
    """``PYTHONPATH`` for the workers of an embedded cluster: ``root`` (so they import this Hydro), then the
    driver's own entries. A runtime env's ``env_vars`` replace a variable rather than extend it, so passing
    ``root`` alone would hide the user's modules (and any packages installed there) from the trials."""
    return os.pathsep.join([root, *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p)])


def worker_env_vars(root: str = PACKAGE_ROOT, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The runtime env ``env_vars`` of an embedded cluster's workers: ``PYTHONPATH`` (:func:`worker_pythonpath`)
    and ``OMP_WAIT_POLICY`` (the driver's own, else ``PASSIVE``). OpenMP's default, active waiting, keeps a trial's
    idle torch threads spinning on their cores: a trial with as many threads as its node has cores then runs each
    step several times slower whenever any other process (Ray's own, the driver, another trial) wants a core.
    Passive waits cost a one-thread trial nothing and let a lone trial use every core (see
    ``HydroSearcher``'s widened stages)."""
    return {"PYTHONPATH": worker_pythonpath(root, environ), OPENMP_WAIT: environ.get(OPENMP_WAIT, "PASSIVE")}


def passive_openmp(env_vars: Mapping[str, str]) -> bool:
    """Whether workers started with ``env_vars`` (a runtime env's) run OpenMP with passive waits."""
    return env_vars.get(OPENMP_WAIT, "").strip().lower() == "passive"
