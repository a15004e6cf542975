"""The fidelity benchmarks run ``halving="auto"`` as the product does: the search's fused trial records each member's
metric at the rungs' milestones without changing its training, the benchmark resolves the policy with the search
driver's own decision on those curves, and the halving benchmark's auto pair replays full rungs or halving ones as
that decision says."""
from __future__ import annotations

import dataclasses
import logging
import math

import pytest

from benchmarks import halving_fidelity
from benchmarks.transfer_fidelity import Trainer, Workload, hydro_run
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.trial.unit import FusedTrial
from hydro.tune.examples import digits_mlp
from hydro.tune.search.random_search import RandomSearch
from schedulers.member_pool import MemberPool, Suggestion
from schedulers.rung_halving import milestones
from schedulers.search_driver import SearchDriver
from schedulers.transfer import AUTO, TransferPolicy
from tests.digits import small_digits
from tests.test_search_driver import Cluster  # one trial slot

CONFIGS = 8


def tiny_mlp(hidden: int) -> tuple[TuneSpec, dict]:
    """The digits MLP with ``hidden`` units on a few hundred digits, 3 epochs (one milestone, after epoch 1)."""
    spec, space = digits_mlp(epochs=3, hidden=hidden)
    return dataclasses.replace(spec, data=small_digits), space


def tiny() -> tuple[Trainer, dict[str, dict]]:
    spec, space = tiny_mlp(32)
    drawn = RandomSearch(space, seed=0)
    return Trainer(spec, spec.load_data()), {f"c{i:02d}": drawn.suggest(str(i)) for i in range(CONFIGS)}


def test_recording_the_milestones_does_not_change_the_search():
    trainer, configs = tiny()
    plain, none = trainer.surrogates(configs, 4, 1)
    scores, curves = trainer.surrogates(configs, 4, 1, at=(1, 2, 3))
    assert {c: s.mean for c, s in scores.items()} == {c: s.mean for c, s in plain.items()}  # exactly
    assert none == {c: {} for c in configs}
    assert all(set(curve) == {1, 2} and all(math.isfinite(v) for v in curve.values()) for curve in curves.values())
    repeated, means = trainer.surrogates(configs, 4, 2, at=(1,))  # seed repeats: their mean
    assert set(means) == set(configs) and all(s.count == 2 for s in repeated.values())


def driver_choice(spec, configs: dict[str, dict], policy: TransferPolicy, caplog) -> tuple[bool, str]:
    """The search driver's decision on the same search, trained here again with every epoch evaluated and reported
    to the driver as the search trial reports it; (its halving, the reason it logged)."""
    plan = TrialPlan(TrialKind.SURROGATE, [(f"{c}#0", config) for c, config in configs.items()], policy.scale,
                     mup=True)
    trial = FusedTrial(spec, plan, spec.load_data())
    curves = []
    for _ in range(spec.epochs):
        trial.train_epoch()
        curves.append(dict(zip((m.split("#")[0] for m in trial.member_ids), trial.evaluate()[spec.metric].tolist())))
    driver = SearchDriver(policy, MemberPool(CONFIGS, CONFIGS), spec.metric, spec.epochs, lambda config: 0,
                          log=logging.getLogger("driver-under-test"))
    queue, cluster = list(configs.values()), Cluster()
    draw = lambda member: queue.pop(0) if queue else Suggestion.FINISHED  # noqa: E731
    search = driver.next_trial("s0", draw, lambda key, config: CONFIGS, cluster)
    config_id = {m: next(c for c, cfg in configs.items() if cfg == config) for m, config in search.members}
    for epoch, values in enumerate(curves, 1):
        driver.on_result("s0", {m: {spec.metric: values[c], "epoch": epoch, "done": epoch == spec.epochs}
                                for m, c in config_id.items()}, cluster, seconds=1.0 if epoch == spec.epochs else None)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="driver-under-test"):
        driver.next_trial("r0", draw, lambda key, config: CONFIGS, cluster)  # the stages start: the choice
    (reason,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rung halving")]
    return driver.policy.halving, reason


@pytest.mark.parametrize("min_agreement", [-1.0, 1.0])
def test_the_benchmark_resolves_auto_halving_as_the_search_driver_does(min_agreement, caplog):
    trainer, configs = tiny()
    spec = trainer.spec
    policy = TransferPolicy(1.0, CONFIGS, spec.metric, spec.mode, epochs=spec.epochs, scale=4, halving=AUTO,
                            escalate=False, fallback_targets=0, min_agreement=min_agreement)
    assert milestones(spec.epochs, policy.eta) == (1,)
    run = hydro_run(trainer, configs, policy, {})
    choice = run["halving_choice"]
    halving, reason = driver_choice(spec, configs, policy, caplog)
    assert choice["halving"] is halving and reason == f"rung halving {'on' if halving else 'off'}: {choice['reason']}"
    assert [a["epoch"] for a in choice["agreements"]] == [1] and choice["agreements"][0]["members"] == CONFIGS
    assert halving is (min_agreement == -1.0)  # a bound is always at least -1 and below 1
    resolved = TransferPolicy(1.0, CONFIGS, spec.metric, spec.mode, epochs=spec.epochs, scale=4, halving=halving,
                              escalate=False, fallback_targets=0, min_agreement=min_agreement)
    assert run["plan_cost"] == resolved.cost(CONFIGS) and run["cost_up_front"] == resolved.describe(CONFIGS)


def test_a_policy_that_set_its_halving_or_repeats_seeds_is_not_resolved():
    trainer, configs = tiny()
    spec = trainer.spec
    for options in ({"halving": False}, {"halving": AUTO, "seeds": 2}):
        policy = TransferPolicy(1.0, CONFIGS, spec.metric, spec.mode, epochs=spec.epochs, scale=4, escalate=False,
                                fallback_targets=0, **options)
        choice = hydro_run(trainer, configs, policy, {})["halving_choice"]
        assert (choice is None) if options["halving"] is False else (not choice["halving"] and not choice["agreements"])


def test_the_halving_benchmarks_auto_pair_replays_the_full_or_the_halving_rungs_as_chosen(monkeypatch):
    workload = Workload("tiny", "digits MLP (64)", lambda quick: tiny_mlp(64))  # S=8 leaves 8
    monkeypatch.setitem(halving_fidelity.WORKLOADS, "tiny", workload)
    result = halving_fidelity.paired("tiny", 0, CONFIGS, ["S=8 default", "S=8 default+halving-auto"])
    forced, auto = result["pairs"]["S=8 default"], result["pairs"]["S=8 default+halving-auto"]
    full = forced["runs"][halving_fidelity.FULL]
    assert auto["runs"][halving_fidelity.FULL] is full  # one run serves both pairs
    halved = auto["runs"][f"{halving_fidelity.FULL}+halving-auto"]
    on = halved["halving_choice"]["halving"]
    same_as = forced["runs"][f"{halving_fidelity.FULL}+halving"] if on else full
    for key in ("returned", "target", "plan_cost", "trained_cost"):
        assert halved[key] == same_as[key], key
    assert auto["loss"] == (forced["loss"] if on else None)
    assert not on and halving_fidelity.chosen(halved) == "auto: off"  # a search at S=8 is not read: no check
