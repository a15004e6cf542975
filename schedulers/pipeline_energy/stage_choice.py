"""Per stage of a registered pipeline job, from measured values: host fill trials in its bubbles, or follow
the Perseus plan's clocks (its slack spent on energy); every decision carries its reason.

The energy side is the plan's saving on the stage (J per iteration) against all-max clocks. The trials side
is the stage's measured bubble seconds per iteration times what fills make of a bubble second
(:class:`FillValue`: member-steps per bubble second, each worth what it costs on a dedicated device), less
the energy the fills draw over blocking while they compute. :class:`~schedulers.pipeline_energy.slack.EnergyOrTrials` compares
them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schedulers.pipeline_energy.dag import InstructionDAG, PlanPoint
from schedulers.pipeline_energy.profile import PipelineProfile
from schedulers.pipeline_energy.slack import EnergyOrTrials, SlackUse, StageSlack, apply_choices


@dataclass(frozen=True)
class FillValue:
    """What fill trials make of bubbles, measured.

    Args:
        member_steps_per_bubble_s: member-steps (a fused step of k members counts k) fills complete per second
            of bubble they get.
        compute_share: the fills' compute seconds per bubble second, in [0, 1].
        joules_per_member_step: what one member-step costs on a dedicated device (J).
        fill_power_w: the power a stage's device draws while a fill computes in a bubble (W).
    """

    member_steps_per_bubble_s: float
    compute_share: float
    joules_per_member_step: float
    fill_power_w: float

    def __post_init__(self) -> None:
        for name in ("member_steps_per_bubble_s", "compute_share", "joules_per_member_step", "fill_power_w"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"pipeline_energy: FillValue.{name}={value} must be a measured value >= 0.")
        if self.compute_share > 1:
            raise ValueError(f"pipeline_energy: FillValue.compute_share={self.compute_share} must be in [0, 1] "
                             f"(fill compute seconds per bubble second).")

    @property
    def joules_per_compute_s(self) -> float:
        """What one second of the fills' compute is worth (J); 0 when they computed nothing."""
        if self.compute_share == 0:
            return 0.0
        return self.member_steps_per_bubble_s * self.joules_per_member_step / self.compute_share


@dataclass(frozen=True)
class StageDecision:
    """One stage's use of its slack, the values it was decided on (per iteration) and why."""

    stage: int
    use: SlackUse
    bubble_s: float  # measured bubble seconds per iteration
    energy_saved_j: float  # the plan's saving on the stage
    trials_value_j: float  # the fills' value net of their extra energy
    frequencies_mhz: tuple[int, ...]  # the clocks it runs (one per instruction, schedule order)
    reason: str


def decide_stages(dag: InstructionDAG, profile: PipelineProfile, plan: PlanPoint, bubble_s: Sequence[float],
                  fill: FillValue) -> list[StageDecision]:
    """Each stage's decision: ``plan`` (a frontier point) gives the energy side, ``bubble_s[stage]`` (measured
    bubble seconds per iteration) and ``fill`` the trials side. A stage that hosts trials keeps all-max clocks
    (its bubbles stay whole); the others run ``plan``'s clocks.

    Raises:
        ValueError: ``bubble_s`` does not give one non-negative value per stage.
    """
    if len(bubble_s) != dag.num_stages or any(not s >= 0 for s in bubble_s):
        raise ValueError(f"pipeline_energy: {dag.num_stages} stages need one measured bubble time (s per iteration, "
                         f">= 0) each; got {list(bubble_s)}.")
    baseline = dag.evaluate(dag.max_frequency_plan(profile), profile)
    policy = EnergyOrTrials(fill.joules_per_compute_s)
    extra_w = max(fill.fill_power_w - profile.p2p_power_w, 0.0)
    slacks = [StageSlack(stage, idle, baseline.stage_energy_j[stage] - plan.stage_energy_j[stage],
                         idle * fill.compute_share, idle * fill.compute_share * extra_w)
              for stage, idle in enumerate(bubble_s)]
    uses = [policy.choose(s) for s in slacks]
    clocks = dag.stage_plans(apply_choices(dag, profile, plan, uses).frequencies)
    return [StageDecision(s.stage, use, s.slack_s, s.energy_saved_j, policy.trials_value_j(s), tuple(clocks[s.stage]),
                          _reason(s, use, policy, fill))
            for s, use in zip(slacks, uses)]


def _reason(slack: StageSlack, use: SlackUse, policy: EnergyOrTrials, fill: FillValue) -> str:
    value = policy.trials_value_j(slack)
    trials = (f"fills worth {value:.4g} J/iter ({slack.slack_s * 1e3:.4g} ms of bubbles x "
              f"{fill.member_steps_per_bubble_s:.4g} member-steps/s x {fill.joules_per_member_step:.4g} J/member-step "
              f"- {slack.trial_energy_j:.4g} J fill draw)")
    energy = f"the clock plan saves {slack.energy_saved_j:.4g} J/iter"
    if use is SlackUse.TRIALS:
        return f"stage {slack.stage} hosts fill trials: {trials} > {energy}"
    return f"stage {slack.stage} follows the clock plan: {energy} >= {trials}"
