"""The benchmarks' stock baselines: stock Ray Tune with ASHA (the reference) and without early stopping."""
from __future__ import annotations

import argparse
import math

import pytest

from benchmarks.e2e_tuning import CNN_CHANNELS, add_speedups, workload
from benchmarks.transfer_fidelity import Trainer, hydro_run, stock_asha
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune.examples import digits_mlp
from hydro.tune.search.random_search import RandomSearch
from schedulers.member_stopping import ASHA, MemberStopping, score
from schedulers.rung_halving import RungHalving
from schedulers.transfer import TransferPolicy


def test_e2e_speedups_are_against_stock_with_asha_and_without_early_stopping():
    rows = [{"run": "(a) stock Ray Tune + ASHA, full size", "wall_s": 120.0},
            {"run": "(n) stock Ray Tune, no early stopping", "wall_s": 300.0},
            {"run": "(c) Hydro S=8 + fusion", "wall_s": 40.0}]
    assert add_speedups(rows) is rows[0]
    assert [(r["speedup_vs_a"], r["speedup_vs_n"]) for r in rows] == [(1.0, 2.5), (0.4, 1.0), (3.0, 7.5)]
    rows = [rows[0], rows[2]]  # without (n): no speed-up against it
    add_speedups(rows)
    assert [r["speedup_vs_n"] for r in rows] == [None, None]


@pytest.mark.parametrize("name", ["digits-cnn", "char-lm"])
def test_e2e_cnn_and_transformer_workloads_fuse_their_surrogates_at_s8(name):
    """The end-to-end CNN and Transformer workloads: the full-size model as stated, and N members of it fused as
    µP surrogates at S=8 (8 heads: one per member at d=8) score every member."""
    spec, space = workload(argparse.Namespace(workload=name, epochs=1))
    model = spec.model({})
    if name == "digits-cnn":
        assert (model.conv1.out_channels, model.conv2.out_channels) == CNN_CHANNELS
    else:
        assert model.embed.embedding_dim == 64 and model.encoder.layers[0].self_attn.num_heads == 8
    drawn = RandomSearch(space, seed=0)
    configs = [(str(i), drawn.suggest(str(i))) for i in range(3)]
    trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, configs, 8, mup=True), spec.load_data())
    values = trial.evaluate()[spec.metric]
    assert len(values) == 3 and all(math.isfinite(float(v)) for v in values)


def test_transfer_fidelity_stock_asha_stops_as_asha_stops_the_full_trajectories():
    """In-process stock + ASHA makes the decisions Ray Tune's rule makes on each configuration's per-epoch scores
    (training is deterministic: a configuration's first epochs score the same whether or not it goes on)."""
    spec, space = digits_mlp(epochs=4, hidden=16)
    drawn = RandomSearch(space, seed=0)
    configs = {f"c{i}": drawn.suggest(str(i)) for i in range(6)}
    trainer = Trainer(spec, spec.load_data())
    result = stock_asha(trainer, configs)
    trajectories = {}  # every configuration trained for all epochs: its score after each
    for c, config in configs.items():
        trial = FusedTrial(spec, TrialPlan(TrialKind.PLAIN, [(c, config)]), trainer.data)
        trajectories[c] = []
        for _ in range(spec.epochs):
            trial.train_epoch()
            trajectories[c].append(float(trial.evaluate()[spec.metric][0]))
    rule, epochs, last = ASHA(max_t=spec.epochs, grace_period=1, reduction_factor=2), {}, {}
    for c, values in trajectories.items():  # the rule replayed on them, in the same order
        epochs[c] = next(e for e, v in enumerate(values, 1) if rule.on_result(c, e, score(v, spec.mode)))
        last[c] = values[epochs[c] - 1]
    assert result["epochs"] == epochs and result["scores"] == last
    assert epochs["c0"] == spec.epochs and min(epochs.values()) < spec.epochs  # some stopped early
    assert result["best"] == max(last, key=last.get) and math.isfinite(result["seconds"])


def test_transfer_fidelity_halving_rung_stops_as_the_rule_stops_the_full_trajectories():
    """The benchmark's in-process halving rung keeps the members ``RungHalving`` keeps on the members' full
    trajectories (fused members train independently: stopping some leaves the others' scores as they were)."""
    spec, space = digits_mlp(epochs=4, hidden=64)
    drawn = RandomSearch(space, seed=0)
    configs = {f"c{i}": drawn.suggest(str(i)) for i in range(6)}
    trainer = Trainer(spec, spec.load_data())
    halving = RungHalving.plan(6, 2, spec.epochs, eta=2)
    scores, member_epochs = trainer.halved(configs, 2, halving)
    trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, list(configs.items()), 2, mup=True), trainer.data)
    trajectories = []
    for _ in range(spec.epochs):
        trial.train_epoch()
        trajectories.append(dict(zip(trial.member_ids, trial.evaluate()[spec.metric].tolist())))
    live, reached = list(configs), {}
    for epoch, values in enumerate(trajectories, 1):  # the rule replayed on them
        stop = halving.stops(epoch, {m: score(values[m], spec.mode) for m in live}) if epoch < spec.epochs else set()
        reached.update({m: epoch for m in stop})
        live = [m for m in live if m not in stop]
    reached.update(dict.fromkeys(live, spec.epochs))
    assert {c: s.reached for c, s in scores.items()} == reached and len(live) == 2
    assert {c: s.mean for c, s in scores.items()} == pytest.approx(
        {c: trajectories[e - 1][c] for c, e in reached.items()}, abs=1e-6)
    assert member_epochs == halving.member_epochs(6, spec.epochs) < 6 * spec.epochs


def test_transfer_fidelity_search_stopped_by_asha_stops_as_the_rule_stops_the_full_trajectories():
    """The benchmark's in-process search with the user's ASHA (``Trainer.stopped``) stops the members the rule stops
    on their full fused trajectories, member by member in order, scores each after the epoch it stopped at, and
    counts only the member-epochs it trained."""
    spec, space = digits_mlp(epochs=4, hidden=64)
    drawn = RandomSearch(space, seed=0)
    configs = {f"c{i}": drawn.suggest(str(i)) for i in range(6)}
    trainer = Trainer(spec, spec.load_data())
    scores, curves, member_epochs = trainer.stopped(
        configs, 2, MemberStopping(ASHA(max_t=spec.epochs, grace_period=1, reduction_factor=2), spec.mode))
    trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, list(configs.items()), 2, mup=True), trainer.data)
    trajectories = []
    for _ in range(spec.epochs):
        trial.train_epoch()
        trajectories.append(dict(zip(trial.member_ids, trial.evaluate()[spec.metric].tolist())))
    rule, reached = ASHA(max_t=spec.epochs, grace_period=1, reduction_factor=2), {}
    for epoch, values in enumerate(trajectories, 1):  # the rule replayed on them, member by member
        for m in configs:
            if m not in reached and (epoch == spec.epochs or rule.on_result(m, epoch, score(values[m], spec.mode))):
                reached[m] = epoch
    assert {c: s.reached for c, s in scores.items()} == reached
    assert min(reached.values()) < spec.epochs == max(reached.values())  # some stopped early, some went on
    assert {c: s.mean for c, s in scores.items()} == pytest.approx(
        {c: trajectories[e - 1][c] for c, e in reached.items()}, abs=1e-6)
    for c, curve in curves.items():  # after every epoch it trained, but the last
        assert curve == pytest.approx({e: trajectories[e - 1][c] for e in range(1, min(reached[c], spec.epochs - 1) + 1)},
                                      abs=1e-6)
    assert member_epochs == sum(reached.values())
    # hydro_run's search with ASHA ranks the configurations by their last value, whatever epoch a stopped one
    # reached, as the search driver ranks its search: a stopped configuration can lead the search
    policy = TransferPolicy(1.0, len(configs), spec.metric, spec.mode, scale=2, epochs=spec.epochs, ladder=False)
    run = hydro_run(trainer, configs, policy, {}, search_asha=True)
    assert run["search_scores"] == pytest.approx({c: s.mean for c, s in scores.items()}, abs=1e-6)
    assert run["trail"][0][1]["reached"] == 0
    assert run["returned"] == max(run["search_scores"], key=run["search_scores"].get)
