"""The GPU types of a Ray cluster's nodes and the resources a trial asks for to run on one of them.

A node's GPUs are of the types it declares as custom resources ``hydro_gpu:<type>`` (``ray start --resources
'{"hydro_gpu:A100": 8}'``; a test declares them on CPU nodes the same way). Where no node declares any, they are
the types Ray detects on each node's devices (its ``accelerator_type:<type>`` resource, one per GPU the node has).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import ray

from schedulers.placement.cluster import A100, H100, V100, GpuType

RESOURCE_PREFIX = "hydro_gpu:"
DETECTED_PREFIX = "accelerator_type:"
PLACEMENT_KEY = "hydro_gpu"  # a trial config's entry: the TypeRequest its placement chose
KNOWN = {g.name: g for g in (V100, A100, H100)}


@dataclass(frozen=True)
class TypeRequest:
    """Where a trial runs: GPU type ``gpu``, asked of Ray as the extra ``resources`` (name, amount) of its
    bundle."""

    gpu: str
    resources: tuple[tuple[str, float], ...]


def cluster_gpu_types(nodes: list[dict] | None = None) -> dict[str, tuple[int, TypeRequest]]:
    """Per GPU type of the alive ``nodes`` (default: ``ray.nodes()``), its GPU count and the request of a trial
    that runs on one: declared types (``{"hydro_gpu:<type>": 1}``), else detected ones (``{"GPU": 1,
    "accelerator_type:<type>": 0.001}``); empty when there are neither."""
    resources = [node["Resources"] for node in (ray.nodes() if nodes is None else nodes) if node["Alive"]]
    declared = _count(resources, RESOURCE_PREFIX, lambda node, name: node[name])
    if declared:
        return {gpu: (n, TypeRequest(gpu, ((RESOURCE_PREFIX + gpu, 1.0),))) for gpu, n in declared.items()}
    detected = _count(resources, DETECTED_PREFIX, lambda node, name: node.get("GPU", 0.0))
    return {gpu: (n, TypeRequest(gpu, (("GPU", 1.0), (DETECTED_PREFIX + gpu, 0.001)))) for gpu, n in detected.items()}


def require_gpu_types() -> dict[str, tuple[int, TypeRequest]]:
    """:func:`cluster_gpu_types` of the connected cluster; raises ``ValueError`` when it has none."""
    types = cluster_gpu_types()
    if not types:
        raise ValueError("hydro.tune.placement: placement='elastic' needs nodes with GPU types, but no node declares "
                         "one (start nodes with resources {'hydro_gpu:<type>': <count>}, e.g. ray start --resources "
                         "'{\"hydro_gpu:A100\": 8}') and Ray detected no GPU type on any node")
    return types


def prior_type(name: str) -> GpuType:
    """The assumed speed of GPU type ``name`` before trials measure it: the round published relative
    throughputs of :mod:`schedulers.placement.cluster` for the types listed there, the reference rate 1 for
    others; no overhead of its own (a trial's predicted step, overheads included, is its work)."""
    known = KNOWN.get(name.upper())
    if known is not None:
        return GpuType(name, known.rate, 0.0, known.source)
    return GpuType(name, 1.0, 0.0, "assumed: an unlisted type, the reference rate until trials measure it")


def _count(nodes: list[Mapping[str, float]], prefix: str, amount) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        for name in node:
            if name.startswith(prefix) and int(amount(node, name)) > 0:
                gpu = name[len(prefix):]
                counts[gpu] = counts.get(gpu, 0) + int(amount(node, name))
    return dict(sorted(counts.items()))
