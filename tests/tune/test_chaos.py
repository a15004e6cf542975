"""Chaos on a local Ray cluster: trial workers SIGKILLed at well-defined moments of a shrunk run with a width ladder
and a full-size target (``hydro.tune.fit``, what ``hydro tune`` runs) — a search trial, a ladder rung's trial, the
target twice (Tune's retry from its checkpoint, then a fresh trial) — and the run still ends with the undisturbed
answer, bit for bit, and its full-size target.

The moments are states of the run seen by a Tune callback in the driver, not sleeps: "the first result of the
first trial of a kind" (after its first epoch, before its first checkpoint: ``checkpoint_every=2``), and the same
again after its retry. Stopping decisions: the search's members stop at the epochs ASHA decides from the results
of members that reached a rung before them, which depends on the order concurrent trials report in; this run
trains the search in one fused trial (``max_concurrent_trials=1``), where the order is fixed, and the ladder and
the target do not stop members early. A run that lost its target (no retries allowed) resumes with
``hydro.tune.resume`` to the same answer.
"""
from __future__ import annotations

import json
import os
import signal

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from hydro.trial.plan import TrialKind, plan_of
from hydro.tune.search.results import BEST_FILE, best_configuration, member_table
from hydro.tune.run import fit, resume
from schedulers.member_id import MemberId
from tests.digits import mlp
from tests.tune.workload import SPACE, spec

WORKLOAD = spec(epochs=3, checkpoint_every=2, model=lambda config: mlp({"hidden": 32}))


class Killer(tune.Callback):
    """SIGKILLs the worker of the first trial that ``which`` picks (``"search"``, ``"ladder"`` or ``"target"``) at its
    first result (epoch 1, before its first checkpoint), ``times`` times in all: each retry, from the start again,
    reports epoch 1 again (a fresh trial of the same members too)."""

    def __init__(self, which: str, times: int = 1):
        self.which, self.times, self.kills, self.members = which, times, [], None

    def on_trial_result(self, iteration, trials, trial, result, **info):
        plan = plan_of(trial.config)
        kind = "target" if plan.kind == TrialKind.TARGET else \
            "ladder" if any(not MemberId.parse(m).is_search for m in plan.member_ids) else "search"
        if kind != self.which or result["epoch"] != 1 or len(self.kills) == self.times \
                or self.members not in (None, plan.member_ids):
            return
        self.members = plan.member_ids
        self.kills.append(trial.trial_id)
        os.kill(result["pid"], signal.SIGKILL)


def tuned(tmp_path, name, killers=()):
    results, searcher = fit(WORKLOAD, SPACE, num_samples=8, scale=4, fusion=8, seed=3, max_concurrent_trials=1,
                            scheduler=ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2),
                            storage_path=str(tmp_path), name=name, verbose=0, callbacks=list(killers))
    return best_configuration(results, WORKLOAD), member_table(results, WORKLOAD)


@pytest.fixture(scope="module")
def undisturbed(ray_cluster, tmp_path_factory):
    return tuned(tmp_path_factory.mktemp("chaos"), "undisturbed")


@pytest.mark.parametrize("kills", [[("search", 1)], [("ladder", 2)], [("target", 2)], [("search", 1), ("target", 1)]],
                         ids=["search", "ladder-twice", "target-twice", "search-and-target"])
def test_killed_workers_leave_the_answer_and_the_target_as_undisturbed(undisturbed, tmp_path, kills):
    killers = [Killer(which, times) for which, times in kills]
    best, table = tuned(tmp_path, "killed", killers)
    expected, expected_table = undisturbed
    assert [len(k.kills) for k in killers] == [times for _, times in kills]
    assert best["kind"] == TrialKind.TARGET and expected["kind"] == TrialKind.TARGET
    assert best["config"] == expected["config"] and best["value"] == expected["value"], (best, expected)
    columns = ["member", "kind", "epochs", "stop_epoch", "val_acc", "error"]
    ordered = [t.sort_values("member")[columns].reset_index(drop=True) for t in (table, expected_table)]
    assert ordered[0].equals(ordered[1])  # every member: the same epochs, stops and results, none failed


class KillTargetOnce(tune.Callback):
    """SIGKILLs the target's worker at its first result, once across processes and restores (a marker file): Tune
    restores the run's callbacks with it."""

    def __init__(self, marker):
        self.marker = marker

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if plan_of(trial.config).kind == TrialKind.TARGET and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(result["pid"], signal.SIGKILL)


def test_a_run_that_lost_its_target_resumes_to_the_undisturbed_answer(undisturbed, tmp_path):
    results, _ = fit(WORKLOAD, SPACE, num_samples=8, scale=4, fusion=8, seed=3, max_concurrent_trials=1,
                     scheduler=ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2), max_failures=0,
                     storage_path=str(tmp_path), name="lost", verbose=0,
                     callbacks=[KillTargetOnce(str(tmp_path / "killed"))])
    assert best_configuration(results, WORKLOAD)["kind"] == TrialKind.SURROGATE  # no retry allowed: no target
    results, _ = resume(results.experiment_path, WORKLOAD)
    best, expected = best_configuration(results, WORKLOAD), undisturbed[0]
    assert best["kind"] == TrialKind.TARGET and (best["config"], best["value"]) == (expected["config"], expected["value"])
    written = json.loads((tmp_path / "lost" / BEST_FILE).read_text())
    assert written["kind"] == "target" and written["value"] == expected["value"]
