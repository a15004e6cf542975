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

from hydro.optim import SGD, Adam


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
    agree. A parameter's state entry that some trials lack while others hold it (members without momentum beside
    members with, a parameter not stepped yet) is, for their members, the value their optimizer gives members
    without it (:meth:`hydro.optim.FusedOptimizer.absent_state`): they step exactly as they would alone."""
    shapes = [[sorted(group) for group in s["param_groups"]] for s in states]
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError(f"merge_states: the trials' optimizers differ in their parameter groups (the keys of each "
                         f"group, per trial: {shapes}); these trials cannot continue as one: keep them apart")
    groups = [[_merge_value(f"optimizer param_groups[{g}].{key}", [s["param_groups"][g][key] for s in states], counts)
               for key in states[0]["param_groups"][g]] for g in range(len(states[0]["param_groups"]))]
    param_groups = [dict(zip(states[0]["param_groups"][g], values)) for g, values in enumerate(groups)]
    group_of = {index: g for g, group in enumerate(param_groups) for index in group["params"]}
    state = {}
    for index in dict.fromkeys(index for s in states for index in s["state"]):
        entries = [s["state"].get(index, {}) for s in states]
        state[index] = {}
        for key in dict.fromkeys(key for entry in entries for key in entry):
            name = f"optimizer state[{index}].{key}"
            values = [entry.get(key) for entry in entries]
            if any(value is None for value in values):
                values = _fill_absent(name, key, values, [s["param_groups"][group_of[index]] for s in states],
                                      counts)
            state[index][key] = _merge_value(name, values, counts)
    return {"state": state, "param_groups": param_groups}


_OPTIMIZERS = (SGD, Adam)  # the fused optimizers by their state keys (AdamW keeps Adam's)


def _fill_absent(name: str, key: str, values: list, groups: list[Mapping], counts: Sequence[int]) -> list:
    """``values`` (one per chunk; ``None`` where a chunk lacks the entry) with each ``None`` replaced by the
    entry its members hold without one (``groups``: each chunk's saved parameter group)."""
    held = next((v for v, n in zip(values, counts) if isinstance(v, Tensor) and v.dim() and v.shape[0] == n), None)
    kind = next((k for k in _OPTIMIZERS if key in k.state_keys), None)
    if held is None or kind is None:
        raise ValueError(f"merge_states: {name} is held by some trials only and is no per-member state of a "
                         f"hydro.optim optimizer; these trials cannot continue as one: keep them apart")
    try:
        return [kind.absent_state(key, group, held.new_empty((n, *held.shape[1:]))) if v is None else v
                for v, group, n in zip(values, groups, counts)]
    except ValueError as error:
        raise ValueError(f"merge_states: {name} is held by some trials only: {error}; these trials cannot continue "
                         f"as one: keep them apart (or merge them once every member has stepped)") from error


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
