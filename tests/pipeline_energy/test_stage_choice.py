"""Per-stage decision from measured values: which stages host fills, which follow the clock plan, and why."""
import pytest

from schedulers.pipeline_energy import FillValue, SlackUse, decide_stages
from tests.pipeline_energy.plans import solve, two_stage_profile


def test_the_stage_whose_bubbles_are_worth_more_hosts_fills_the_other_follows_the_plan():
    profile = two_stage_profile()
    dag, _, baseline, free = solve(profile, microbatches=4)
    saved = [b - f for b, f in zip(baseline.stage_energy_j, free.stage_energy_j)]
    assert saved[0] > 0  # stage 0 has slack the plan turns into energy
    fill = FillValue(member_steps_per_bubble_s=40.0, compute_share=0.5, joules_per_member_step=5.0, fill_power_w=150.0)
    # Measured: stage 0 barely idles (its slack is in short waits), stage 1 has long bubbles.
    decisions = decide_stages(dag, profile, free, [0.001, 0.5], fill)
    assert [d.use for d in decisions] == [SlackUse.ENERGY, SlackUse.TRIALS]
    zero, one = decisions
    assert one.trials_value_j == pytest.approx(0.5 * 40.0 * 5.0 - 0.5 * 0.5 * (150.0 - 50.0))
    assert zero.trials_value_j == pytest.approx(0.001 * 200.0 - 0.001 * 0.5 * 100.0)
    assert zero.energy_saved_j == pytest.approx(saved[0]) and zero.trials_value_j < zero.energy_saved_j
    # The energy stage runs the plan's clocks, the fill stage all-max clocks (its bubbles stay whole).
    plans = dag.stage_plans(free.frequencies)
    assert list(zero.frequencies_mhz) == plans[0] and min(plans[0]) < 1800
    assert set(one.frequencies_mhz) == {1800}
    assert zero.reason.startswith("stage 0 follows the clock plan: the clock plan saves")
    assert one.reason.startswith("stage 1 hosts fill trials: fills worth 75 J/iter (500 ms of bubbles x 40")


def test_fills_worth_nothing_leave_every_stage_on_the_plan():
    profile = two_stage_profile()
    dag, _, _, free = solve(profile, microbatches=4)
    decisions = decide_stages(dag, profile, free, [0.2, 0.2], FillValue(0.0, 0.0, 2.0, 150.0))
    assert [d.use for d in decisions] == [SlackUse.ENERGY, SlackUse.ENERGY]
    assert all(d.trials_value_j <= 0 for d in decisions)


def test_bad_measurements_are_refused_with_what_to_give():
    profile = two_stage_profile()
    dag, _, _, free = solve(profile, microbatches=4)
    with pytest.raises(ValueError, match="2 stages need one measured bubble time"):
        decide_stages(dag, profile, free, [0.1], FillValue(1.0, 0.5, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"FillValue.member_steps_per_bubble_s=nan must be a measured value"):
        FillValue(float("nan"), 0.5, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"compute_share=1.5 must be in \[0, 1\]"):
        FillValue(1.0, 1.5, 1.0, 1.0)
