"""scale='auto': the finest surrogate scale whose fused step costs at most 2.5 times the coarsest's
(schedulers.scale_choice), measured on real fused training (hydro.trial.scale_plan)."""
import dataclasses
import logging
import math

import pytest

from hydro.trial.scale_plan import measured_scale, piloted_scale
from hydro.tune.examples import digits_mlp
from hydro.tune.search.random_search import RandomSearch
from schedulers.scale_choice import (AUTO_SCALES, PILOT_CONFIGS, CannotShrink, NoScale, Pilot, ScaleChoice,
                                     auto_scales, checked_scale, choose_scale)
from schedulers.transfer import MIN_ESCALATION_SCALE


def timed(seconds: dict[int, float], asked: list[int]):
    def step_seconds(scale: int) -> float:
        asked.append(scale)
        if seconds[scale] is None:
            raise CannotShrink(f"widths too narrow at S={scale}")
        return seconds[scale]
    return step_seconds


@pytest.mark.parametrize("seconds, chosen, asked", [
    ({8: 1.0, 4: 1.5, 2: 2.4}, 2, [8, 4, 2] * 2),    # overhead-bound: every halving nearly free
    ({8: 1.0, 4: 1.9, 2: 5.0}, 4, [8, 4, 2] * 2),    # a small model on CPU: S=4 within 2.5x, S=2 not
    ({8: 1.0, 4: 3.6, 2: 14.0}, 8, [8, 4] * 2),      # compute-bound: S=2 is not measured once S=4 is over
    ({8: 1.0, 4: 2.5, 2: 2.5001}, 4, [8, 4, 2] * 2),  # exactly 2.5x is within
])
def test_the_finest_scale_within_the_budget_of_the_coarsest_step(seconds, chosen, asked):
    seen: list[int] = []
    choice = choose_scale(timed(seconds, seen))
    assert choice.scale == chosen and seen == asked  # a second round times the first round's scales again
    assert choice.step_s == {s: seconds[s] for s in asked} and not choice.skipped
    assert f"S={8}" in choice.reason


def test_scales_the_model_cannot_be_shrunk_to_are_skipped():
    seen: list[int] = []
    choice = choose_scale(timed({8: None, 4: 1.0, 2: 2.4}, seen))
    assert (choice.scale, seen, list(choice.step_s)) == (2, [8, 4, 2, 4, 2], [4, 2])  # S=8 is not asked again
    assert "too narrow" in choice.skipped[8] and "cannot shrink to S=8" in choice.reason
    with pytest.raises(NoScale, match=r"S=8: widths too narrow at S=8; S=4: .*Fix: pass a scale"):
        choose_scale(timed({8: None, 4: None, 2: None}, []))


@pytest.mark.parametrize("first, second, chosen", [
    ({8: 1.5, 4: 1.9, 2: 3.6}, {8: 1.0, 4: 1.9, 2: 3.6}, 4),  # a slowed S=8 timing would have let S=2 in
    ({8: 1.0, 4: 2.7, 2: 9.0}, {8: 1.0, 4: 1.9, 2: 9.0}, 4),  # a slowed S=4 timing would have kept S=8
])
def test_each_scale_keeps_its_fastest_timing_of_the_rounds(first, second, chosen):
    rounds = [first, second]
    calls: list[int] = []

    def step_seconds(scale: int) -> float:
        calls.append(scale)
        return rounds[0 if calls.count(scale) == 1 else 1][scale]

    choice = choose_scale(step_seconds)
    assert choice.scale == chosen and choice.step_s == {s: min(first[s], second[s]) for s in choice.step_s}
    assert choose_scale(lambda s: first[s], rounds=1).scale != chosen  # one round would choose otherwise


def test_other_errors_of_the_measurement_are_not_swallowed():
    def broken(scale: int) -> float:
        raise ValueError("the model's forward failed")
    with pytest.raises(ValueError, match="forward failed"):
        choose_scale(broken)


@pytest.mark.parametrize("scales, max_cost, match", [
    ((), 2.0, "coarse to fine"), ((2, 4, 8), 2.0, "coarse to fine"), ((8, 8), 2.0, "distinct"),
    ((8, 4, 0), 2.0, ">= 1"), (AUTO_SCALES, 0.5, "max_cost must be >= 1"),
])
def test_bad_arguments_are_refused(scales, max_cost, match):
    with pytest.raises(ValueError, match=match):
        choose_scale(lambda s: 1.0, scales, max_cost)
    with pytest.raises(ValueError, match="rounds must be an int >= 1, got 0"):
        choose_scale(lambda s: 1.0, rounds=0)


def test_a_step_time_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match=r"S=8 measured 0.0 s"):
        choose_scale(lambda s: 0.0)


def test_measured_on_real_fused_steps_of_the_workloads_surrogates(caplog):
    spec, space = digits_mlp(epochs=1, hidden=64)
    config = RandomSearch(space, seed=0).suggest("x")
    with caplog.at_level(logging.INFO, logger="hydro.trial.scale_plan"):
        choice = measured_scale(spec, config, spec.load_data(), members=4, threads=1)
    assert choice.scale in AUTO_SCALES and list(choice.step_s)[0] == 8
    assert all(t > 0 for t in choice.step_s.values())
    assert choice.scale == choose_scale(lambda s: choice.step_s[s]).scale  # the pure rule on what was measured
    assert f"S={choice.scale} for the search on cpu (4 fused members, 1 threads)" in caplog.text


def test_strict_shrinking_skips_the_scales_it_refuses():
    spec, space = digits_mlp(epochs=1, hidden=32)  # hidden 32: S=8 would leave 4 < min_width 8
    spec = dataclasses.replace(spec, shrink_strict=True)
    choice = measured_scale(spec, RandomSearch(space, seed=0).suggest("x"), spec.load_data(), members=2, threads=1)
    assert 8 in choice.skipped and "min_width" in choice.skipped[8] and 8 not in choice.step_s
    assert choice.scale in (4, 2)


def test_auto_with_early_stopping_chooses_only_among_scales_whose_transfer_check_can_escalate():
    assert auto_scales(early_stopping=False) == AUTO_SCALES
    assert auto_scales(early_stopping=True) == tuple(s for s in AUTO_SCALES if s // 2 >= MIN_ESCALATION_SCALE) == (8,)


def test_a_search_is_checked_at_its_scale_or_with_auto_at_the_coarsest_candidate():
    assert [checked_scale(s) for s in ("auto", 1, 4)] == [AUTO_SCALES[0], 1, 4]


# --- the pilot -----------------------------------------------------------------------------------------------

def test_a_pilot_checks_a_choice_of_s8_or_coarser_on_a_share_of_the_epochs():
    pilot = Pilot.plan(8, num_samples=24, epochs=8)
    assert (pilot.coarse, pilot.fine, pilot.configs, pilot.epochs, pilot.search_epochs) == (8, 4, PILOT_CONFIGS, 2, 8)
    assert pilot.cost() == pytest.approx(PILOT_CONFIGS * (1 / 64 + 1 / 16) * 2 / 8)
    assert "6 configurations at S=8 and S=4 for 2 of 8 epochs, about 0.12 full-size trainings" in pilot.describe()
    assert Pilot.plan(8, 24, epochs=2).epochs == 1  # at least one epoch
    assert Pilot.plan(16, 24, 9, configs=8, epoch_share=1) == Pilot(16, 8, 8, 9, 9)
    assert Pilot.plan(4, 24, 8) is None  # S=2 is already a fine scale (escalation does not go there either)
    assert Pilot.plan(8, PILOT_CONFIGS - 1, 8) is None  # a search smaller than the pilot


CHOICE = ScaleChoice(8, {8: 1.0, 4: 3.5}, reason="from step times")


@pytest.mark.parametrize("fine, mode, chosen", [
    ([6, 5, 4, 3, 2, 1], "max", 4),  # S=4 ranks the six in reverse: S=8 cannot rank them
    ([1, 2, 3, 4, 5, 6], "max", 8),
    ([6, 5, 4, 3, 2, 1], "min", 4),  # the same rankings compared, whatever the direction
    ([2, 1, 4, 3, 6, 5], "max", 8),  # noise among close ones: not a confident disagreement
    ([3, 6, 5, 2, 1, 4], "max", 8),  # rho -0.37 over 6: its upper bound is above 0.5
])
def test_the_pilot_moves_the_search_to_s_half_only_on_a_confident_disagreement(fine, mode, chosen):
    pilot = Pilot.plan(8, 16, 6)
    coarse = {f"c{i}": float(i + 1) for i in range(6)}
    decided = pilot.decide(CHOICE, coarse, {f"c{i}": float(v) for i, v in enumerate(fine)}, mode)
    assert decided.scale == chosen and decided.step_s == CHOICE.step_s
    assert decided.reason.startswith("from step times; pilot: 6 configurations at S=8 and S=4")
    assert ("too narrow to rank, the search trains at S=4" in decided.reason) == (chosen == 4)


def test_the_pilot_ranks_a_diverged_configuration_last_and_compares_those_scored_at_both():
    pilot = Pilot.plan(8, 16, 6)
    coarse = {"a": math.nan, "b": 0.5, "c": 0.6, "d": 0.7, "e": 0.8, "f": 0.9, "only_coarse": 1.0}
    fine = {"a": 0.95, "b": 0.9, "c": 0.8, "d": 0.7, "e": 0.6, "f": 0.5}  # S=4 reverses them; NaN at S=8 is last
    decided = pilot.decide(CHOICE, coarse, fine, "max")
    assert decided.scale == 4 and "Spearman -1.00 over 6" in decided.reason


def test_the_pilot_trains_real_surrogates_and_states_its_cost_before(caplog):
    spec, space = digits_mlp(epochs=3, hidden=128)
    drawn = RandomSearch(space, seed=0)
    configs = [drawn.suggest(str(i)) for i in range(PILOT_CONFIGS)]
    with caplog.at_level(logging.INFO, logger="hydro.trial.scale_plan"):
        choice = piloted_scale(spec, CHOICE, configs, spec.load_data(), members=16, threads=1)
    first, second = [r.getMessage() for r in caplog.records]
    assert first == "scale='auto': S=8 from step times; " + Pilot.plan(8, 16, 3).describe()
    assert choice.scale in (8, 4) and "Spearman" in second and choice.reason.startswith("from step times; pilot")
    with caplog.at_level(logging.INFO, logger="hydro.trial.scale_plan"):  # nothing to check at S=4
        assert piloted_scale(spec, dataclasses.replace(CHOICE, scale=4), configs, None, 16, 1).scale == 4
        assert piloted_scale(spec, CHOICE, configs[:2], None, 16, 1) == CHOICE  # too few: step times alone
    assert "the pilot needs 6 configurations, got 2" in caplog.text
