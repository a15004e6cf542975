"""Energy and bubbles in one run on a local Ray cluster: a 2-stage pipeline job whose stages have different slack
registers with energy on; from measured values (its bubbles, its clocks profiled on simulated DVFS devices, what a
fill makes of a bubble) one stage stays a bubble slot and the other follows a Perseus clock plan on its device; the
decisions and their reasons are kept by the placement service and in the run's folder; ``fit(energy=...,
bubbles=True)`` trains its members in the slot exactly, with the energy bandit's batch sizes."""
import json
import math
import threading

import ray

from hydro.energy.frequency import DVFSModel
from hydro.energy.tuning import DeviceSource, EnergySettings
from hydro.pipeline import PipelineSpec
from hydro.trial.plan import plan_of
from hydro.tune.bubbles.service import STAGE_DECISIONS_FILE, placement_service
from hydro.tune.pipeline.job import PipelineJob
from hydro.tune.pipeline.stage_energy import SimulatedDevices, StageEnergy, decide
from hydro.tune.run import fit
from schedulers.pipeline_energy import SlackUse
from tests.bubbles.test_bubble_tune import EPOCHS, _check_states
from tests.bubbles.workload import plan, spec
from tests.tune.workload import SPACE

# 3 linear layers over 2 stages: stage 0 takes 64->512->512, stage 1 only 512->10 (little work, long bubbles).
PIPELINE = PipelineSpec(width=512, depth=2, microbatches=4, microbatch_size=64)
CLOCKS = tuple(range(1740, 1000, -60))
SIMULATED = SimulatedDevices(DVFSModel(CLOCKS))  # a simulated DVFS device per stage, made in the stage's process


def _break_even(decision, rate) -> float:
    """J per member-step above which fills win the stage (its values do not depend on that worth)."""
    draw = -decision.trials_value_j  # the fill's extra energy: measured with a worth of 0
    return (decision.energy_saved_j + draw) / (decision.bubble_s * rate.member_steps_per_bubble_s)


def test_one_stage_hosts_fills_the_other_follows_its_clock_plan_and_the_run_is_exact(ray_cluster, tmp_path):
    service = placement_service()
    job = PipelineJob(PIPELINE, num_stages=2, name="perseus", num_cpus_per_stage=0.5)
    stop, errors = threading.Event(), []
    thread = threading.Thread()
    try:
        job.profile(2)
        rate = job.measure_fill(1, spec(), plan())  # a real fused trial in stage 1's bubbles
        assert rate.member_steps_per_bubble_s > 0 and 0 < rate.compute_share <= 1
        measured = job.measure_stages(StageEnergy(SIMULATED, rate, joules_per_member_step=0.0))
        probe = decide(measured, PIPELINE.microbatches, StageEnergy(SIMULATED, rate, joules_per_member_step=0.0))
        assert [d.use for d in probe] == [SlackUse.ENERGY, SlackUse.ENERGY]  # fills worth nothing: clocks everywhere
        low, high = sorted(_break_even(d, rate) for d in probe)
        assert high > 1.2 * low, probe  # the stages' slack differs: a worth between them splits them
        worth = math.sqrt(low * high)
        decisions = job.register(service, energy=StageEnergy(SIMULATED, rate, joules_per_member_step=worth),
                                 measured=measured)  # decided on the same measurements as the probe

        uses = {d.use: d for d in decisions}
        assert set(uses) == {SlackUse.TRIALS, SlackUse.ENERGY}, [d.reason for d in decisions]
        fills, clocks = uses[SlackUse.TRIALS], uses[SlackUse.ENERGY]
        assert fills.trials_value_j > fills.energy_saved_j and clocks.energy_saved_j >= clocks.trials_value_j
        assert "hosts fill trials" in fills.reason and "follows the clock plan" in clocks.reason
        assert set(fills.frequencies_mhz) == {max(CLOCKS)} and min(clocks.frequencies_mhz) < max(CLOCKS)
        # Only the fill stage is a slot; the service keeps both decisions with their reasons.
        assert [s["name"] for s in ray.get(service.slots.remote())] == [f"perseus/{fills.stage}"]
        kept = ray.get(service.stage_decisions.remote())["perseus"]
        assert [(k["use"], k["reason"]) for k in kept] == [(d.use.value, d.reason) for d in decisions]

        before = ray.get([s.clock_history.remote() for s in job.stages])

        def iterate() -> None:
            try:
                while not stop.is_set():
                    assert all(len(r["losses"]) == 3 for r in job.run(3))
            except BaseException as error:  # noqa: BLE001 - asserted below
                errors.append(error)

        thread = threading.Thread(target=iterate, daemon=True)
        thread.start()
        settings = EnergySettings(str(tmp_path / "energy.db"), "perseus-tune", DeviceSource.SIMULATED,
                                  batch_sizes=(16, 32))
        results, searcher = fit(spec(epochs=EPOCHS), SPACE, num_samples=2, fusion=2, transfer_fraction=None,
                                storage_path=str(tmp_path), name="energy-bubbles", verbose=0, max_failures=0,
                                energy=settings, bubbles=True)
        stop.set()
        thread.join(timeout=300)
        assert not thread.is_alive() and not errors, errors
        after = ray.get([s.clock_history.remote() for s in job.stages])
    finally:
        stop.set()
        job.shutdown()
        ray.kill(service)
    # The clock stage ran its plan's clocks on its device, reset to the default after every run; the fill stage's
    # clocks were not touched after its profile.
    ran = after[clocks.stage][len(before[clocks.stage]):]
    assert set(ran) == {*clocks.frequencies_mhz, "reset"} and ran[-1] == "reset"
    assert after[fills.stage] == before[fills.stage]
    (result,) = list(results)
    _check_states(result)  # every member ended exactly as it trains alone
    assert len(searcher.member_results()) == 2
    assert {slot for slots in result.metrics_dataframe["slots"] for slot in slots.split(",")} == {
        f"perseus/{fills.stage}"}
    assert {c["batch_size"] for _, c in plan_of(result.config).members} <= {16, 32}  # the energy bandit's choice
    written = json.loads((tmp_path / "energy-bubbles" / STAGE_DECISIONS_FILE).read_text())
    assert [(k["use"], k["reason"]) for k in written["perseus"]] == [(d.use.value, d.reason) for d in decisions]
