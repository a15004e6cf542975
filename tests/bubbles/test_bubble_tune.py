"""Hydro's own trials in pipeline bubbles on a local Ray cluster: a HydroSearcher run on a user TuneSpec with a
running 2-stage pipeline job. Members train in bubbles and end bit-identical to training alone; members that do
not fit a bubble start another fused trial; late-stage trials and the target move to the dedicated worker; job
end and host death move members on without loss; a fill whose code raises fails its members once with its own
cause (not retried); a fill process SIGKILLed (as by the OOM killer) is retried and its members end exactly."""
import threading
import time
from pathlib import Path

import pytest
import ray
from ray import tune
import torch

from hydro.pipeline import PipelineSpec
from hydro.bubbles.fill_process import RAISED
from hydro.bubbles.fit import member_bytes
from hydro.trial.plan import plan_of
from hydro.trial.unit import FusedTrial
from hydro.tune.bubbles.service import placement_service
from hydro.tune.bubbles.fill_trainable import STATE_FILE
from hydro.tune.pipeline.job import PipelineJob, start_dedicated_hosts
from hydro.tune.search.results import member_table
from hydro.tune.run import TuningFailed, fit
from tests.bubbles.workload import HeldLoss, same_members, spec
from tests.tune.workload import SPACE, FaultAtEpoch, Recoveries, faults

PIPELINE = PipelineSpec(width=128, depth=6, microbatches=4, microbatch_size=16)
EPOCHS = 3
DEADLINE_S = 300.0  # generous bound of the waits below: slow under load fails loudly, it never hangs


class RunningJob:
    """A registered pipeline job that keeps iterating in a thread (bubbles exist only while it runs)."""

    def __init__(self, service, name: str, fill_memory_bytes: int | None = None) -> None:
        self.job = PipelineJob(PIPELINE, num_stages=2, name=name, num_cpus_per_stage=0.5,
                               fill_memory_bytes=fill_memory_bytes)
        self.job.profile(2)
        self.job.register(service)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.iterations = 0
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self.stop.is_set():
                reports = self.job.run(5)
                assert all(len(r["losses"]) == 5 for r in reports)
                self.iterations += 5
        except BaseException as error:  # noqa: BLE001 - raised by end()
            self.error = error

    def end(self) -> None:
        if not self.stop.is_set():
            self.stop.set()
            self.thread.join(timeout=DEADLINE_S)
            assert not self.thread.is_alive(), f"the pipeline job's 5 iterations took over {DEADLINE_S:.0f} s"
            self.job.shutdown()
        if self.error is not None:
            raise self.error


class Placement:
    """A placement service (late stage: epoch 2) and two dedicated workers, shared by the module's tests (their
    start is most of a test's set-up); started anew when a test left a worker dead or a slot occupied."""

    def __init__(self) -> None:
        self.service, self.hosts = None, []

    def ready(self):
        if self.service is not None and not self._clean():
            self.stop()
        if self.service is None:
            self.service = placement_service(promote_rung=2)
            self.hosts = start_dedicated_hosts(self.service, 2, num_cpus=0.25)
        return self.service

    def _clean(self) -> bool:
        try:
            ray.get([host.fill_budget.remote() for host in self.hosts], timeout=30)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False
        slots = ray.get(self.service.slots.remote())
        return len(slots) == 2 and all(s["trial"] is None for s in slots)

    def stop(self) -> None:
        for actor in [self.service, *self.hosts]:
            try:
                ray.kill(actor)
            except ValueError:
                pass
        self.service, self.hosts = None, []


@pytest.fixture(scope="module")
def placement(ray_cluster):
    placement = Placement()
    yield placement
    placement.stop()


@pytest.fixture
def service(placement):
    """The placement service with two live, free dedicated workers and no pipeline job."""
    return placement.ready()


def _fit(tmp_path: Path, name: str, **overrides):
    options = dict(num_samples=4, fusion=2, transfer_fraction=1.0, storage_path=str(tmp_path), name=name, verbose=0,
                   max_failures=0, bubbles=True)
    return fit(spec(epochs=EPOCHS), SPACE, **{**options, **overrides})


def _check_exact(result) -> list[str]:
    """Every unit of the trial ended exactly as its members trained alone, every epoch reported once; returns the
    slots it visited."""
    _check_states(result)
    history = result.metrics_dataframe
    assert list(history["epoch"]) == list(range(1, EPOCHS + 1))  # every epoch reported once
    return [slot for slots in history["slots"] for slot in slots.split(",")]


def _check_states(result) -> None:
    """Every unit of the trial ended exactly as its members trained alone."""
    assert result.error is None, result.error
    states = torch.load(Path(result.checkpoint.path) / STATE_FILE, weights_only=False)
    trial_plan = plan_of(result.config)
    tune_spec = spec(epochs=EPOCHS)
    for state in states:
        assert state["trial"]["epoch"] == EPOCHS
        alone = FusedTrial(tune_spec, trial_plan, tune_spec.load_data(), member_ids=state["trial"]["member_ids"])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for _ in range(EPOCHS):
                alone.run_epoch()
        finally:
            torch.set_num_threads(threads)
        assert same_members(state, alone)


def test_hydro_trials_fill_bubbles_exactly_overflow_into_another_fused_trial_and_move_to_dedicated(service, tmp_path):
    tune_spec = spec()
    one_member = member_bytes(tune_spec, {"lr": 0.1, "momentum": 0.9}, 1, False, tune_spec.load_data())
    job = RunningJob(service, "squeezed", fill_memory_bytes=one_member)  # a stage's bubbles hold one member
    try:
        results, searcher = _fit(tmp_path, "squeeze")
    finally:
        job.end()
    assert job.iterations > 0
    visited = {r.config["hydro"].kind: [] for r in results}
    for result in results:
        visited[result.config["hydro"].kind].append((_check_exact(result), result.metrics_dataframe))
    surrogates, (target,) = visited["surrogate"], visited["target"]
    assert len(surrogates) == 2 and len(searcher.member_results()) == 4
    # Early units take the job's two bubble slots first (then dedicated workers): which of the 4 units get them
    # depends on the trials' start order, so count epoch 1's slots of both trials together
    first_epoch = [slot for slots, history in surrogates for slot in slots[:history["units"].iloc[0]]]
    assert sum(slot.startswith("squeezed/") for slot in first_epoch) >= 1  # members trained in bubbles
    for slots, history in surrogates:  # 2 members, 1 fits a bubble slot: the other starts another fused trial,
        units = history["units"].iloc[0]  # unless the first one went to a dedicated worker (which one does is
        assert units == (2 if any(slot.startswith("squeezed/") for slot in slots[:units]) else 1)  # start order)
    assert any(slot.startswith("dedicated/") for slots, history in surrogates
               for slot in slots[history["units"].iloc[0]:])  # promoted (or placed there) after epoch 1
    assert all(slot.startswith("dedicated/") for slot in target[0])  # the target: a dedicated worker only


def test_job_end_and_host_death_move_members_on_without_loss(service, tmp_path):
    """The job ends once a unit there finished an epoch; the unit goes on on a dedicated worker, where its loss
    holds it mid-training (:class:`HeldLoss`) until that worker is killed: the kill always finds it there, however
    fast or slow the machine (the fill cannot finish first)."""
    job = RunningJob(service, "ending")
    held = tmp_path / "held"
    held.mkdir()
    killed: list[str] = []
    FIRST_EPOCH.clear()

    def disrupt() -> None:
        """End the job once a unit there finished an epoch; then kill the dedicated worker the unit moved to, once
        its fill trial has trained a step there and is held in its loss."""
        deadline = time.monotonic() + DEADLINE_S
        try:
            while not (FIRST_EPOCH.is_set() and any(s["trial"] and s["job"] == "ending"
                                                     for s in ray.get(service.slots.remote()))):
                if time.monotonic() > deadline:
                    return  # (the assertions below say so)
                threading.Event().wait(0.05)
            job.end()
            (held / "hold").touch()
            while time.monotonic() < deadline and not killed:
                if (held / "held").exists():
                    for slot in ray.get(service.slots.remote()):
                        if slot["name"].startswith("dedicated/") and slot["trial"]:
                            host = ray.get_actor(f"hydro-bubbles/{slot['name']}")
                            if (ray.get(host.fill_steps.remote()) or 0) > 0:
                                killed.append(slot["name"])
                                ray.kill(host)
                                break
                threading.Event().wait(0.05)
        finally:
            (held / "release").touch()

    disruptor = threading.Thread(target=disrupt, daemon=True)
    disruptor.start()
    results, _ = fit(spec(epochs=EPOCHS, loss=HeldLoss(str(held))), SPACE, num_samples=2, fusion=2,
                     transfer_fraction=None, storage_path=str(tmp_path), name="ending", verbose=0, max_failures=0,
                     bubbles=True, callbacks=[EpochReported()])
    disruptor.join(timeout=DEADLINE_S)
    assert not disruptor.is_alive(), "the disruptor still waits"
    (result,) = results
    slots = _check_exact(result)
    assert len(killed) == 1 and slots[0].startswith("ending/") and slots[-1].startswith("dedicated/")


FIRST_EPOCH = threading.Event()  # module-level: Tune pickles the run's callbacks, and an Event does not pickle


class EpochReported(tune.Callback):
    """Sets :data:`FIRST_EPOCH` once a trial reports its first epoch (the driver hears it at once; the run's files
    on the storage path are copied there only every few seconds, later under load)."""

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if result.get("epoch", 0) >= 1:
            FIRST_EPOCH.set()


@pytest.mark.parametrize("fault", ["raise", "kill_once"])
def test_a_fill_that_raises_fails_its_members_once_and_a_killed_fill_is_retried(service, tmp_path, fault):
    log = str(tmp_path / "faults")
    tune_spec = spec(epochs=EPOCHS, loss=FaultAtEpoch(2, log, fault), checkpoint_every=1)  # in epoch 2's first batch
    job, recoveries = RunningJob(service, "faulty"), Recoveries()
    try:
        results, _ = fit(tune_spec, SPACE, num_samples=2, fusion=2, transfer_fraction=None, storage_path=str(tmp_path),
                         name="faulty", verbose=0, max_failures=1, bubbles=True, callbacks=[recoveries])
    except TuningFailed as failed:  # every member failed (their epoch-1 values are no result): one summary
        assert fault == "raise" and "no member ended with a finite objective" in str(failed)
        assert "2 x ZeroDivisionError: fault injected by the test's loss in epoch 2" in str(failed)
        results = failed.results
    finally:
        job.end()
    assert job.iterations > 0 and all(s["trial"] is None for s in ray.get(service.slots.remote()))
    (result,) = results
    assert result.error is None
    table = member_table(results, tune_spec)
    if fault == "raise":  # raised once, not retried: its members failed with the cause, their epoch 1 kept
        assert len(set(faults(log))) == 1 and recoveries.recovered == []  # one process (its members each hit it)
        assert result.metrics["hydro_error"].startswith("ZeroDivisionError: fault injected by the test's loss in "
                                                        "epoch 2 (the fill trial of members m00000, m00001 failed on ")
        assert RAISED in result.metrics["hydro_traceback"]
        assert table["error"].all() and (table["epochs"] == 1).all()
    else:  # killed, retried from its epoch-1 checkpoint in a new fill process, ends as if trained alone
        assert len(set(faults(log))) == 2 and len(recoveries.recovered) == 1
        _check_states(result)  # (not its history: Ray restores a retried trial's result.json from its last sync)
        assert not table["error"].any() and (table["epochs"] == EPOCHS).all()


def test_a_fill_longer_than_every_bubble_moves_to_a_dedicated_worker_and_ends_exactly(service, tmp_path):
    """Its loss burns 0.2 s of CPU per call, 100 times longer than every bubble of an idle machine: instead of
    failing, the fill goes on from its last state on a dedicated worker before its second epoch ends (promotion
    would come after the second). Usually that is before its first epoch ends; but the job's bubbles lengthen with
    the machine's load (its stages wait longer for the CPU), and once they exceed half the unit the gate lets it
    overrun them (``OVERRUN_FACTOR``), so under heavy load the first epoch may end in the bubbles."""
    job = RunningJob(service, "slowpoke")
    try:
        results, _ = fit(spec(epochs=EPOCHS, fault="slow", at=1), SPACE, num_samples=2, fusion=2,
                         transfer_fraction=None, storage_path=str(tmp_path), name="slowpoke", verbose=0,
                         max_failures=0, bubbles=True)
    finally:
        job.end()
    (result,) = results
    # Placed in the job's bubbles first (as in the tests above), it reported every epoch after the first from the
    # dedicated worker (usually the first too, replayed there from the start), exactly as trained alone, with no
    # Tune retry.
    _check_exact(result)
    reported_from = [slots.split(",") for slots in result.metrics_dataframe["slots"]]
    assert all(slot.startswith("dedicated/") for slots in reported_from[1:] for slot in slots), reported_from


def test_cli_bubbles_is_refused_without_a_cluster_whose_jobs_registered_bubbles(monkeypatch, capsys):
    from hydro.cli import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["tune", "--example", "digits-mlp", "--bubbles"]) == 2
    assert "--bubbles: give the cluster whose pipeline jobs have registered" in capsys.readouterr().err
