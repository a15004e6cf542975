"""Merging fused trials: the survivors of several fused trials of one ``TuneSpec`` continue as one trial.

A fused trial's state (:meth:`hydro.trial.unit.FusedTrial.state_dict`) holds every member's slice of the
stacked weights, buffers and optimizer state on dimension 0 (what ``hydro.keep_members`` slices); merging
concatenates those slices in the order the states are given. Batches depend on (seed, epoch) only, so the
members train on exactly what they would have trained on. Their arithmetic is bit-identical where the fused
kernels compute each member on its own (per-member batched matmuls); two things change last bits: the bias
gradient of a layer fed the shared batch (the first layer) is a column sum over all ``F·out`` outputs, whose
reduction order on CPU depends on ``F`` (measured: 4e-9 after an epoch), and random layers (dropout) draw from
the merged trial's generator.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor


def merge_states(states: Sequence[Mapping]) -> dict:
    """One :class:`FusedTrial` state of all members of ``states`` (fused trials of one spec, each after
    ``keep`` of its survivors, all at the same epoch boundary). Load it into
    ``FusedTrial(spec, plan, data, member_ids=merged["member_ids"])`` whose plan holds their configurations."""
    if not states:
        raise ValueError("merge_states: no trial states to merge")
    epochs = {(s["epoch"], s["step"]) for s in states}
    if len(epochs) != 1 or any(s["step"] for s in states):
        raise ValueError(f"merge_states: trials merge only at the same epoch boundary (step 0); got (epoch, step) "
                         f"{sorted(epochs)}; merge after run_epoch()")
    ids = [m for s in states for m in s["member_ids"]]
    if len(set(ids)) != len(ids):
        raise ValueError(f"merge_states: a member is in more than one trial: {ids}")
    members = [chunk for s in states for chunk in s["members"]]  # every fused chunk of every trial
    if any(len(m["modules"]) != 1 or len(m["optimizers"]) != 1 for m in members):
        raise ValueError("merge_states: only fused trials (one model, one hydro.optim optimizer) merge; plain "
                         "trials' members are separate models already")
    if any(s.get("scaler") is not None for s in states):
        raise ValueError("merge_states: fp16 trials (per-member loss scales) do not merge yet; use fp32 or bf16")
    counts = [count for s in states for count in s["chunks"]]
    modules = {key: torch.cat([m["modules"][0][key] for m in members]) for key in members[0]["modules"][0]}
    optimizer = _merge_optimizer([m["optimizers"][0] for m in members], counts)
    schedulers = _merge_value("schedulers", [m.get("schedulers", []) for m in members], counts)
    first = states[0]
    return {"member_ids": ids, "chunks": [len(ids)], "max_fusion": len(ids),
            "members": [{"modules": [modules], "optimizers": [optimizer], "schedulers": schedulers}],
            "epoch": first["epoch"], "step": 0,
            "loss_sum": None, "seen": 0, "torch_rng": first["torch_rng"], "cuda_rng": first.get("cuda_rng"),
            "scaler": None}


def _merge_optimizer(states: Sequence[Mapping], counts: Sequence[int]) -> dict:
    """Per-member optimizer tensors (first dimension = the trial's member count) concatenated; the rest must
    agree."""
    groups = [[_merge_value(f"optimizer param_groups[{g}].{key}", [s["param_groups"][g][key] for s in states], counts)
               for key in states[0]["param_groups"][g]] for g in range(len(states[0]["param_groups"]))]
    param_groups = [dict(zip(states[0]["param_groups"][g], values)) for g, values in enumerate(groups)]
    state = {}
    for index in states[0]["state"]:
        entries = [s["state"][index] for s in states]
        state[index] = {key: _merge_value(f"optimizer state[{index}].{key}", [e[key] for e in entries], counts)
                        for key in entries[0]}
    return {"state": state, "param_groups": param_groups}


def _merge_value(name: str, values: list, counts: Sequence[int]):
    if all(isinstance(v, Tensor) and v.dim() and v.shape[0] == n for v, n in zip(values, counts)):
        return torch.cat(values)
    if all(isinstance(v, Mapping) for v in values) and all(v.keys() == values[0].keys() for v in values):
        return {key: _merge_value(f"{name}.{key}", [v[key] for v in values], counts) for key in values[0]}
    if all(isinstance(v, list) for v in values) and all(len(v) == len(values[0]) for v in values):
        return [_merge_value(f"{name}[{i}]", [v[i] for v in values], counts) for i in range(len(values[0]))]
    first = values[0]
    same = all(torch.equal(v, first) if isinstance(v, Tensor) else v == first for v in values[1:])
    if not same:
        raise ValueError(f"merge_states: {name} differs between the trials and is not per-member; "
                         f"these trials cannot continue as one")
    return first
