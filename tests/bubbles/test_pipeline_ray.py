"""A real 2-stage 1F1B pipeline on a local Ray cluster: bubbles reported; Hydro fill trials exact and kept;
a fill that raises, is SIGKILLed or hangs never harms the main job."""
import math

import pytest
import ray
import torch

from hydro.bubbles import FailureKind, FillTooLarge, SlotMode
from hydro.pipeline import PipelineSpec
from hydro.tune.pipeline.job import PipelineJob, interface_of, process_group_backend, rendezvous
from tests.bubbles.workload import plan, same_members, spec, train_alone
from tests.bubbles.alone import train_unsplit

SPEC = PipelineSpec(width=128, depth=6, microbatches=4, microbatch_size=16)
TIMEOUTS = {"unit_timeout_s": 3.0, "answer_timeout_s": 10.0}


@pytest.fixture(scope="module")
def job(ray_cluster):
    job = PipelineJob(SPEC, num_stages=2, num_cpus_per_stage=0.5, timeouts=TIMEOUTS)  # leaves room for a second job
    job.profile(2)
    yield job


def _run_until(job: PipelineJob, stage: int, done, rounds: int = 400) -> tuple[list[list[dict]], dict | None]:
    """Run the job (6 iterations at a time) until ``done(fill_status)``; returns every report and that status."""
    reports = []
    for _ in range(rounds):
        reports.append(job.run(6))
        status = job.fill_status(stage)
        if done(status):
            return reports, status
    raise AssertionError(f"the fill of stage {stage} did not get there in {rounds} rounds")


def test_pipeline_trains_like_the_unsplit_model_and_reports_its_bubbles(job):
    reports = job.run(3)
    assert process_group_backend(torch.device("cpu")) == "gloo" and process_group_backend(torch.device("cuda")) == "nccl"
    # Every wait for an activation (last stage) or a gradient (first stage) is a reported bubble.
    assert [len(r["bubbles"]) for r in reports] == [3 * SPEC.microbatches] * 2
    for r in reports:
        assert all(b["length"] >= 0 and b["predicted_s"] >= 0 and b["free_bytes"] > 0 for b in r["bubbles"])
        assert sum(b["length"] for b in r["bubbles"]) > 0
        assert [o["label"] for o in r["ops"]].count("F0") == 3
    assert reports[1]["bubbles"][0]["predicted_s"] > 0
    # Same training as the unsplit model with microbatch gradient accumulation (5 iterations so far).
    model = train_unsplit(SPEC, 5)
    stage_weights = ray.get([s.weights.remote() for s in job.stages])
    actual = [t for w in stage_weights for t in w.values()]
    for a, e in zip(actual, model.state_dict().values()):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_gated_fill_trains_a_tunespec_trial_exactly_as_alone_and_survives_detaching(job):
    assert job.attach_fill(0, spec(), plan(), SlotMode.GATED) == ["m0", "m1", "m2"]
    reports, _ = _run_until(job, 0, lambda status: status["result"] is not None)
    assert "fill_steps" in reports[-1][0] and "fill_steps" not in reports[-1][1]  # stage 1 hosts nothing
    result = job.fill_status(0)["result"]
    assert result.epoch == 1
    state = ray.get(job.stages[0].fill_decide.remote(["m0", "m2"]))["state"]  # m1 stops after epoch 1
    assert same_members(state, train_alone(spec(), plan(), 1))
    moved = job.detach_fill(0)["state"]  # the stage leaves mid-fill: completed steps are kept
    assert moved["trial"]["member_ids"] == ["m0", "m2"] and moved["trial"]["epoch"] == 1


def test_a_fill_that_raises_crashes_or_hangs_never_harms_the_main_job(job):
    """Three fills fail in turn on stage 1 (raise, SIGKILL, hang); each is detached and reported with its cause,
    the stage hosts the next; the main job's losses stay bit-identical to the same job run alone."""
    losses = []
    for fault, cause, kind in [("raise", "ZeroDivisionError: fault injected", FailureKind.RAISED),
                               ("kill", "SIGKILL", FailureKind.DIED),
                               ("hang", "the fill trial hangs", FailureKind.HUNG)]:
        # Loss call 8 of the fill process: the memory fit measures one member (3 calls), then epoch 1's 10 training
        # steps; call 8 is the 5th step, before any decision is asked for.
        job.attach_fill(1, spec(fault=fault, at=8), plan(), SlotMode.GATED)
        reports, status = _run_until(job, 1, lambda status: status is None or "failed" in status)
        assert status is not None and cause in status["failed"] and status["failure"].kind is kind, (cause, status)
        losses += [loss for r in reports for loss in r[1]["losses"]]
        assert all(len(r[1]["losses"]) == 6 for r in reports)  # every iteration completed
    assert job.fill_status(1) is None  # the slot is free again
    total = ray.get(job.stages[1].iteration.remote())
    assert losses == _losses_alone(total)[-len(losses):]  # bit-identical to the job running alone


def _losses_alone(iterations: int) -> list[float]:
    """The last stage's losses of the first ``iterations`` iterations of the same job run alone."""
    alone = PipelineJob(SPEC, num_stages=2, name="alone", num_cpus_per_stage=0.5)
    try:
        alone.profile(2)
        return [math.nan, math.nan] + alone.run(iterations - 2)[1]["losses"]
    finally:
        alone.shutdown()


def test_fill_too_large_for_the_stage_is_refused_with_the_numbers(ray_cluster):
    small = PipelineJob(SPEC, num_stages=2, name="small", fill_memory_bytes=1000, num_cpus_per_stage=0.5)
    try:
        with pytest.raises(FillTooLarge, match=r"stage 0: fill trial refused: .*MiB"):
            small.attach_fill(0, spec(), plan())
    finally:
        small.shutdown()


def test_job_ending_mid_fill_hands_back_states(job):
    job.attach_fill(1, spec(), plan(), SlotMode.GATED)
    _run_until(job, 1, lambda status: status["result"] is not None)
    ended = job.shutdown()
    assert ended[0] is None and ended[1]["state"]["pending"].epoch == 1  # awaiting its decision: kept
    assert same_members(ended[1]["state"], train_alone(spec(), plan(), 1))


def test_stages_rendezvous_on_their_nodes_addresses():
    """Stages on several nodes meet at stage 0's node address (not loopback); on one node, over loopback."""
    assert rendezvous([("10.0.0.1", 5001), ("10.0.0.2", 6001)]) == "tcp://10.0.0.1:5001"
    assert rendezvous([("10.0.0.1", 5001), ("10.0.0.1", 6001)]) == "tcp://127.0.0.1:5001"
    assert interface_of("127.0.0.1") == "lo" and interface_of("203.0.113.7") is None  # (a documentation address)
