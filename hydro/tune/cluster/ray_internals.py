"""The Ray internals Hydro uses where Ray has no public API, all in this one module. Tested with Ray 2.60.0 only
(``pyproject.toml`` pins ``ray>=2.60,<2.61``): a Ray upgrade is checked here first.

* Token authentication on the driver side, as ``ray start`` sets it up (a token on this machine and
  ``RAY_AUTH_MODE`` unset -> token authentication), and whether it is on: Ray exposes no public call for either.
* A gRPC channel to the GCS set up as Ray's own clients set it up (TLS, the token), to ask whether the cluster
  refuses this machine's token before ``ray.init`` (which retries a refused join for half a minute).
* A local cluster bound to 127.0.0.1: ``ray.init(_node_ip_address=...)`` binds every interface, so the driver's
  copy of the constant Ray reads must be set as its processes read the environment variable.
* The ``ray.tune.run`` call a searcher is set up in: Tune hands a ``Searcher`` neither the run's trial scheduler
  (which a ``HydroSearcher`` must refuse before trials start), nor its trainable's resource request (the trial
  slots the search is fused for), nor its callbacks (whose reporter the run's ``RunReporter`` replaces).
* The search algorithm of a restored ``tune.Tuner``: ``Tuner.restore`` unpickles it but keeps it private.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def enable_token_auth_if_token_available() -> None:
    """Turn token authentication on in this process when this machine has a Ray token and ``RAY_AUTH_MODE`` is
    unset, as ``ray start`` does."""
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def token_auth_enabled() -> bool:
    """Whether this process uses token authentication."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    return is_token_auth_enabled()


def has_token() -> bool:
    """Whether this process found a Ray token (``~/.ray/auth_token`` or ``$RAY_AUTH_TOKEN``)."""
    from ray._raylet import AuthenticationTokenLoader

    return AuthenticationTokenLoader.instance().has_token()


def gcs_channel(address: str):
    """A gRPC channel to the GCS at ``address`` (``host:port``), with Ray's TLS and token settings."""
    from ray._private.grpc_utils import init_grpc_channel

    return init_grpc_channel(address)


def bind_local_cluster_to_loopback() -> None:
    """Make the local cluster this process starts listen on 127.0.0.1 only (GCS, raylet, workers, agents), as Ray
    does when it is not to form a multi-node cluster: its processes read the environment variable, this one the
    constant."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def tune_run_locals() -> Mapping | None:
    """The local variables of the ``ray.tune.run`` call (``tune.Tuner.fit`` calls it) this is called in (``None``
    outside one): Tune hands a searcher nothing else about the run (its scheduler, trainable, callbacks)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "run" and frame.f_globals.get("__name__") == "ray.tune.tune":
            return frame.f_locals
        frame = frame.f_back
    return None


def restored_search_alg(tuner):
    """The search algorithm (the user's ``Searcher``) ``tune.Tuner.restore`` restored into ``tuner``."""
    return tuner._local_tuner._tune_config.search_alg
