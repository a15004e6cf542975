"""Ray Tune schedulers given for per-member stopping become Hydro's rules, deciding exactly as Ray does."""
import random
from dataclasses import dataclass

import pytest
from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, MedianStoppingRule, TrialScheduler

from hydro.tune.search.member_rules import stopping_rule
from schedulers.member_stopping import ASHA, MedianStopping, MemberStopping


@dataclass(frozen=True)
class FakeTrial:
    trial_id: str


class NoController:
    @staticmethod
    def get_live_trials() -> list:
        return []


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("settings", [dict(max_t=9, grace_period=1, reduction_factor=2),
                                      dict(max_t=27, grace_period=3, reduction_factor=3),
                                      dict(max_t=8, grace_period=1, reduction_factor=2, stop_last_trials=False)])
def test_translated_asha_decides_as_rays_asha(mode, settings):
    rng = random.Random(0)
    ray_asha = ASHAScheduler(time_attr="training_iteration", **settings)
    ray_asha.set_search_properties("val", mode)
    ours = MemberStopping(stopping_rule(ASHAScheduler(**settings), "val"), mode)
    members = {f"m{i}": True for i in range(24)}
    for member in members:
        ray_asha.on_trial_add(NoController(), FakeTrial(member))
    for epoch in range(1, settings["max_t"] + 1):
        for member in rng.sample(sorted(members), len(members)):  # members report in a random order
            if not members[member]:
                continue
            value = rng.gauss(epoch, 1.0)
            expected = ray_asha.on_trial_result(NoController(), FakeTrial(member),
                                                {"training_iteration": epoch, "val": value}) == TrialScheduler.STOP
            assert ours.decide(member, epoch, value) is expected
            members[member] = not expected


def test_translated_median_rule_and_refusals():
    rule = stopping_rule(MedianStoppingRule(time_attr="training_iteration", grace_period=2, min_samples_required=4),
                         "val_acc")
    assert isinstance(rule, MedianStopping) and rule.grace_period == 2 and rule.min_samples_required == 4
    assert stopping_rule(None, "val_acc") is None
    own = ASHA(max_t=4)
    assert stopping_rule(own, "val_acc") is own
    with pytest.raises(TypeError, match="HyperBandScheduler"):
        stopping_rule(HyperBandScheduler(), "val_acc")
    with pytest.raises(ValueError, match="leave the scheduler's metric"):
        stopping_rule(ASHAScheduler(metric="loss", mode="min"), "val_acc")
    with pytest.raises(ValueError, match="time_attr='training_iteration'"):
        stopping_rule(MedianStoppingRule(), "val_acc")
    with pytest.raises(ValueError, match="hard_stop=True"):
        stopping_rule(MedianStoppingRule(time_attr="training_iteration", hard_stop=False), "val_acc")
