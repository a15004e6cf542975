"""Hydro's trials in the bubbles of a Ray Train pipeline job on a local Ray cluster: a TorchTrainer with 2 CPU
workers runs a 2-stage torch.distributed.pipelining schedule (gloo) whose stages register as bubble slots with one
call in the train loop. A HydroSearcher run (bubbles=True) trains its members there; when the job ends, or a
worker dies, they continue on a dedicated worker and end bit-identical to training alone."""
import os
import signal
import threading
import time

import pytest
import ray

from tests.bubbles.test_bubble_tune import (DEADLINE_S, FIRST_EPOCH, EpochReported, _check_exact, _fit,  # noqa: F401
                                            placement, service)
from tests.bubbles.train_job import run_job


def _wait_for(condition, what: str, running) -> None:
    """Wait for ``condition()`` while the job ``running`` runs."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert not ray.wait([running], timeout=0)[0], f"the job ended before {what}: {ray.get(running)}"
        assert time.monotonic() < deadline, f"waited {DEADLINE_S:.0f} s for {what}"
        time.sleep(0.05)


def _job_slots(service, job: str) -> list[dict]:
    return [s for s in ray.get(service.slots.remote()) if s["job"] == job]


@pytest.mark.parametrize("ending", ["job_end", "worker_lost"])
def test_ray_train_pipeline_stages_host_fill_trials_and_lose_no_member(service, tmp_path, ending):
    job, schedule = f"train-{ending}", "ScheduleGPipe" if ending == "job_end" else "Schedule1F1B"
    directory = tmp_path / "job"
    directory.mkdir()
    running = run_job.remote(job, schedule, str(directory))
    _wait_for(lambda: len(_job_slots(service, job)) == 2, "the Ray Train job's 2 stages to register", running)
    assert all(0 < s["idle_fraction"] < 1 for s in _job_slots(service, job))  # measured bubbles

    disrupted: list[str] = []
    FIRST_EPOCH.clear()

    def disrupt() -> None:
        """Once a unit in the job's slots has reported an epoch: end the job, or kill the worker of the stage
        that hosts the unit."""
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            hosting = [s["name"] for s in _job_slots(service, job) if s["trial"]]
            if hosting and FIRST_EPOCH.is_set():
                if ending == "job_end":
                    (directory / "stop").touch()
                else:
                    os.kill(int((directory / f"pid-{hosting[0].rpartition('/')[2]}").read_text()), signal.SIGKILL)
                disrupted.append(hosting[0])
                return
            time.sleep(0.05)

    disruptor = threading.Thread(target=disrupt, daemon=True)
    disruptor.start()
    try:
        results, _ = _fit(tmp_path, job, num_samples=2, transfer_fraction=None, callbacks=[EpochReported()])
    finally:
        (directory / "stop").touch()
        error = ray.get(running, timeout=DEADLINE_S)
    disruptor.join(timeout=DEADLINE_S)
    assert len(disrupted) == 1, "the fill trial never ran in the job's bubbles"
    if ending == "job_end":
        assert error is None, error
    else:
        assert error is not None  # the job failed with its worker (no Train retries here)
    assert _job_slots(service, job) == []  # the job's slots are gone
    (result,) = results
    slots = _check_exact(result)  # every member ended exactly as trained alone, every epoch reported once
    assert slots[0].startswith(f"{job}/") and slots[-1].startswith("dedicated/")


def test_a_relay_whose_worker_stops_taking_calls_reports_its_slot_lost_and_fails_the_callers(service):
    """A worker that is alive but takes no calls (nothing polls the relay here): after ``lost_after_s`` the waiting
    call fails as if the host had died, and the job's slots are gone (their units continue elsewhere)."""
    from hydro.tune.bubbles.ray_train import SlotRelay

    ray.get(service.register_stage.remote("silent", 0, 0.5, 1 << 30, "hydro-bubbles/silent/0"))
    relay = ray.remote(num_cpus=0)(SlotRelay).options(name="hydro-bubbles/silent/0").remote("silent/0", 1.0)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(relay.fill_status.remote(0.0), timeout=60)
    assert _job_slots(service, "silent") == []
