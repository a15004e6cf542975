"""The slack policy: per stage, energy saving against the value of trial work in the same slack."""
import pytest

from hydro.pipeline.schedule import one_f_one_b
from schedulers.pipeline_energy import (
    EnergyOrTrials,
    InstructionDAG,
    SlackUse,
    StageSlack,
    apply_choices,
    stage_slack,
)
from tests.pipeline_energy.plans import solve, two_stage_profile


def test_policy_picks_per_stage_and_reports_both_sides():
    profile = two_stage_profile()
    dag, _, baseline, free = solve(profile, microbatches=4)
    slacks = stage_slack(dag, profile, free, fill_share=0.6, fill_power_w=300.0)
    assert slacks[0].slack_s > slacks[1].slack_s >= 0
    assert slacks[0].energy_saved_j > 0
    assert slacks[0].trial_work_s == pytest.approx(0.6 * slacks[0].slack_s)
    assert slacks[0].trial_energy_j == pytest.approx(slacks[0].trial_work_s * 250.0)
    # Cheap trial work: every stage keeps the energy plan; dear trial work: stages with slack take trials.
    assert [EnergyOrTrials(0.0).choose(s) for s in slacks] == [SlackUse.ENERGY, SlackUse.ENERGY]
    dear = EnergyOrTrials(5000.0)
    choices = [dear.choose(s) for s in slacks]
    assert choices[0] is SlackUse.TRIALS
    combined = apply_choices(dag, profile, free, choices)
    assert combined.time_s <= baseline.time_s  # reverting stages to max clocks never slows the iteration
    assert all(combined.frequencies[k] == 1800 for k in dag.order[0])


def test_policy_compares_value_and_saving():
    slack = StageSlack(stage=0, slack_s=0.1, energy_saved_j=10.0, trial_work_s=0.05, trial_energy_j=5.0)
    assert EnergyOrTrials(300.0).trials_value_j(slack) == pytest.approx(10.0)
    assert EnergyOrTrials(300.0).choose(slack) is SlackUse.ENERGY  # a tie keeps the free energy saving
    assert EnergyOrTrials(301.0).choose(slack) is SlackUse.TRIALS
    assert slack.break_even_w == pytest.approx(300.0)
    with pytest.raises(ValueError, match="negative"):
        EnergyOrTrials(-1.0)
    with pytest.raises(ValueError, match="fill_share"):
        stage_slack(InstructionDAG(one_f_one_b(2, 2)), two_stage_profile(), None, fill_share=1.5, fill_power_w=1.0)
