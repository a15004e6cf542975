"""A real 2-stage 1F1B pipeline on a local Ray cluster: bubbles reported, fill trials exact and kept."""
import pytest
import torch

from hydro.bubbles import FillSpec, FillTrial, PipelineSpec
from hydro.bubbles.fill import FillTooLarge
from hydro.tune.pipeline_job import PipelineJob
from tests.bubbles.alone import same_state, train_alone, train_unsplit

SPEC = PipelineSpec(width=128, depth=6, microbatches=4, microbatch_size=16)
FILL = FillSpec(configs=[{"lr": 0.1, "momentum": 0.9}, {"lr": 0.02}])


@pytest.fixture(scope="module")
def job(ray_cluster):
    job = PipelineJob(SPEC, num_stages=2, num_cpus_per_stage=0.5)  # leaves room for a second job
    job.profile(2)
    yield job


def _run_until_filled(job: PipelineJob, stage: int) -> list[dict]:
    """Run the job until the fill trial of ``stage`` has completed a step (an idle-policy fill process gets
    little of a busy test machine's bubbles)."""
    reports = job.run(6)
    for _ in range(100):
        if job.fill_status(stage)["completed_steps"] > 0:
            break
        reports = job.run(6)
    return reports


def test_pipeline_trains_like_the_unsplit_model_and_reports_its_bubbles(job):
    reports = job.run(3)
    # Every wait for an activation (last stage) or a gradient (first stage) is a reported bubble.
    assert [len(r["bubbles"]) for r in reports] == [3 * SPEC.microbatches] * 2
    for r in reports:
        assert all(b["length"] >= 0 and b["predicted_s"] >= 0 and b["free_bytes"] > 0 for b in r["bubbles"])
        assert sum(b["length"] for b in r["bubbles"]) > 0
        assert [o["label"] for o in r["ops"]].count("F0") == 3
    # The last stage's first wait of each iteration covers the first stage's forwards: predicted > 0.
    assert reports[1]["bubbles"][0]["predicted_s"] > 0
    # Same training as the unsplit model with microbatch gradient accumulation (5 iterations so far).
    model = train_unsplit(SPEC, 5)
    import ray

    stage_weights = ray.get([s.weights.remote() for s in job.stages])
    expected = list(model.state_dict().values())
    actual = [t for w in stage_weights for t in w.values()]
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_gated_fill_trains_exactly_as_alone_and_survives_detaching(job):
    assert job.attach_fill(0, FILL, mode="gated") == 2
    reports = _run_until_filled(job, 0)
    assert "fill_steps" in reports[0] and "fill_steps" not in reports[1]  # stage 1 hosts nothing
    checkpoint = job.detach_fill(0)  # the stage leaves mid-fill: completed steps are kept
    done = checkpoint["completed_steps"]
    alone = train_alone(FILL, done)
    assert same_state(checkpoint["model"], alone)
    moved = FillTrial.from_checkpoint(checkpoint)  # continues elsewhere exactly
    for _ in range(3):
        moved.step()
    for _ in range(3):
        alone.step()
    assert all(torch.equal(a, b) for a, b in zip(moved.model.state_dict().values(), alone.model.state_dict().values()))


def test_fill_too_large_for_the_stage_is_refused_with_the_numbers(ray_cluster):
    small = PipelineJob(SPEC, num_stages=2, name="small", fill_memory_bytes=1000, num_cpus_per_stage=0.5)
    try:
        with pytest.raises(FillTooLarge, match=r"stage 0: fill trial refused: .*MiB"):
            small.attach_fill(0, FILL)
    finally:
        small.shutdown()


def test_job_ending_mid_fill_hands_back_checkpoints(job):
    job.attach_fill(1, FILL, mode="gated")
    _run_until_filled(job, 1)
    checkpoints = job.shutdown()
    assert checkpoints[0] is None and checkpoints[1]["completed_steps"] > 0
    alone = train_alone(FILL, checkpoints[1]["completed_steps"])
    assert same_state(checkpoints[1]["model"], alone)
