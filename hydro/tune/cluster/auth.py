"""Whether a Ray cluster refuses this process's credentials, asked before ``ray.init`` joins it (``ray.init`` retries
a refused join for half a minute before it fails)."""
from __future__ import annotations

import grpc

from hydro.tune.cluster.ray_internals import gcs_channel


def token_refused(address: str, timeout_s: float = 5.0) -> bool:
    """Ask the GCS at ``address`` (``host:port``) for its cluster id once, over a channel set up as Ray's own
    clients set it up (TLS from the environment; this process's Ray token when token authentication is on here).
    Returns ``True`` when the GCS answers that the token is missing or wrong; ``False`` for any other answer, no
    answer within ``timeout_s`` seconds, or an address that is not ``host:port`` (``ray.init`` reports those)."""
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    _, _, port = address.rpartition(":")
    if "://" in address or not port.isdigit():
        return False
    channel = gcs_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
    except grpc.RpcError as error:
        return error.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    return False
