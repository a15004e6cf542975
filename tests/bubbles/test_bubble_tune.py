"""Fill trials as Ray Tune trials on a local cluster: placed in pipeline bubbles, promoted to a dedicated
worker, moved when their pipeline job ends — each trains exactly as it would alone."""
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import ray
import torch
from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from hydro.bubbles import FillSpec, PipelineSpec
from hydro.tune.bubble_scheduler import BubbleScheduler
from hydro.tune.bubble_service import placement_service
from hydro.tune.fill_trainable import CHECKPOINT_FILE, fill_trainable
from hydro.tune.pipeline_job import PipelineJob, start_dedicated_hosts
from tests.bubbles.alone import same_state, train_alone

PIPELINE = PipelineSpec(width=128, depth=6, microbatches=4, microbatch_size=16)
TEMPLATE = FillSpec(configs=[])
STEPS, EVERY = 300, 25
GROUPS = [[{"lr": 0.1, "momentum": 0.9}, {"lr": 0.02}], [{"lr": 0.05}, {"lr": 0.2, "momentum": 0.5}]]


class RunningJob:
    """A registered pipeline job that keeps iterating in a thread (bubbles exist only while it runs)."""

    def __init__(self, service, name: str) -> None:
        self.job = PipelineJob(PIPELINE, num_stages=2, name=name, num_cpus_per_stage=0.5)
        self.job.profile(2)
        self.job.register(service)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                self.job.run(5)
        except BaseException as error:  # noqa: BLE001 - raised by end()
            self.error = error

    def end(self) -> None:
        self.stop.set()
        self.thread.join()
        self.job.shutdown()
        if self.error is not None:
            raise self.error


@pytest.fixture
def cluster(ray_cluster):
    """A placement service (late stage: 100 steps) and one dedicated worker; removed after the test."""
    service = placement_service(promote_rung=100)
    hosts = start_dedicated_hosts(service, 1, num_cpus=0.25)
    yield service
    for actor in [service, *hosts]:
        ray.kill(actor)


def _tune(tmp_path: Path, name: str, groups: list, scheduler=None) -> tune.ResultGrid:
    trainable = tune.with_resources(fill_trainable(TEMPLATE, STEPS, EVERY), {"cpu": 0.01})
    return tune.Tuner(trainable, param_space={"members": tune.grid_search(groups)},
                      tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler),
                      run_config=tune.RunConfig(storage_path=str(tmp_path), name=name, verbose=0)).fit()


def _check_exact(result: tune.Result) -> list[str]:
    """The trial's final checkpoint equals training its members alone; returns the slots it ran in."""
    assert result.error is None
    final = torch.load(Path(result.checkpoint.path) / CHECKPOINT_FILE, weights_only=False)
    assert final["completed_steps"] == STEPS
    assert same_state(final["model"], train_alone(replace(TEMPLATE, configs=result.config["members"]), STEPS))
    history = result.metrics_dataframe
    assert list(history["completed_steps"]) == list(range(EVERY, STEPS + 1, EVERY))  # every report point, once
    return list(dict.fromkeys(history["slot"]))


def test_trials_fill_bubbles_first_and_late_stage_trials_move_to_the_dedicated_worker(cluster, tmp_path):
    job = RunningJob(cluster, "squeezed")
    try:
        results = _tune(tmp_path, "promote", GROUPS, BubbleScheduler())
    finally:
        job.end()
    visited = [_check_exact(r) for r in results]
    assert all(slots[0].startswith("squeezed/") for slots in visited)  # early: in bubbles
    assert any("dedicated/0" in slots[1:] for slots in visited)  # late: promoted to the free dedicated slot


def test_a_pipeline_job_ending_mid_trial_loses_no_state(cluster, tmp_path):
    job = RunningJob(cluster, "ending")

    def end_when_started() -> None:
        for _ in range(2000):
            slots = ray.get(cluster.slots.remote())
            if any(s["trial"] and s["job"] == "ending" for s in slots):
                status = [job.job.fill_status(i) for i in range(2)]
                if any(s is not None and s["completed_steps"] >= 2 * EVERY for s in status):
                    break
            threading.Event().wait(0.02)
        job.end()

    ender = threading.Thread(target=end_when_started)
    ender.start()
    results = _tune(tmp_path, "ending", GROUPS[:1])  # FIFO: no promotion, it moves only because the job ends
    ender.join()
    slots = _check_exact(results[0])
    assert slots[0].startswith("ending/") and slots[-1] == "dedicated/0"


class StopOneGroup(FIFOScheduler):
    """Stops the trial of the group whose first member has lr 0.05 at its first result."""

    def on_trial_result(self, tune_controller, trial, result):
        stop = trial.config["members"][0]["lr"] == 0.05
        return TrialScheduler.STOP if stop else TrialScheduler.CONTINUE


def test_a_trial_stopped_by_the_scheduler_leaves_no_fill_behind(cluster, tmp_path):
    job = RunningJob(cluster, "stopping")
    try:
        results = _tune(tmp_path, "stopping", GROUPS, BubbleScheduler(StopOneGroup()))
        stopped = next(r for r in results if r.config["members"][0]["lr"] == 0.05)
        assert stopped.metrics["completed_steps"] == EVERY  # stopped at its first report
        _check_exact(next(r for r in results if r is not stopped))
        assert all(s["trial"] is None for s in ray.get(cluster.slots.remote()))
        hosts = [*job.job.stages, ray.get_actor("hydro-bubbles/dedicated/0")]
        assert ray.get([h.fill_status.remote() for h in hosts]) == [None] * 3
    finally:
        job.end()
