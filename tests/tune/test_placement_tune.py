"""``fit(..., placement="elastic")`` on a real two-node local Ray cluster whose nodes declare two GPU types
(``hydro_gpu:<type>`` custom resources on CPU nodes; the trials train on CPU): each trial runs on a node of the
type its placement chose and logged, the type chosen by predicted finish, and every member's results equal its
fused trial trained in this process."""
from __future__ import annotations

import logging

import pytest
import torch

from hydro.trial.plan import plan_of
from hydro.trial.unit import FusedTrial
from tests.conftest import REPO
from tests.prediction.workload import mlp_without_input_bias
from tests.tune.workload import SPACE, StartTogether, StopOneOfEachTrial, small_digits, spec

TYPES = {"A100": 1, "V100": 1}  # one node of each (3 CPUs in all: only 2 trials can run at once)


@pytest.fixture(scope="module")
def two_type_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"hydro_gpu:A100": 1}, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"hydro_gpu:V100": 1})
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield ray
    ray.shutdown()
    cluster.shutdown()


def node_types(ray) -> dict[str, str]:
    """Node id -> the GPU type the node declares."""
    return {node["NodeID"]: next(name.split(":", 1)[1] for name in node["Resources"] if name.startswith("hydro_gpu:"))
            for node in ray.nodes() if node["Alive"]}


def trained_alone(workload, config, epochs, stopped=()):
    """The trial's members trained in this process (one thread, as a Ray worker of 1 CPU), the ``stopped`` ones
    sliced out after the first epoch: per member, its metrics after its last epoch."""
    plan = plan_of(config)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    results = {}
    try:
        trial = FusedTrial(workload, plan, small_digits())
        for _ in range(epochs):
            metrics = trial.run_epoch()
            results.update({m: {name: values[i].item() for name, values in metrics.items()}
                            for i, m in enumerate(trial.member_ids)})
            if trial.epoch == 1 and stopped:
                trial.keep([i for i, m in enumerate(trial.member_ids) if m not in stopped])
    finally:
        torch.set_num_threads(threads)
    return results


def test_trials_land_on_the_predicted_type_and_train_as_alone(two_type_cluster, tmp_path, caplog):
    from hydro.tune import fit

    ray, workload = two_type_cluster, spec(epochs=2)
    with caplog.at_level(logging.INFO, logger="hydro.tune.placement.trial_placement"):
        results, searcher = fit(workload, SPACE, num_samples=6, fusion=2, transfer_fraction=None,
                                storage_path=str(tmp_path / "runs"), name="placed", verbose=0, placement="elastic")
    assert not results.errors
    assert searcher._cluster.trial_slots() == 2  # a GPU each, not a CPU each
    choices = searcher.placement.choices
    placed_lines = [r.getMessage() for r in caplog.records if " placed on " in r.getMessage()]
    assert len(choices) == len(results) == 3 and len(placed_lines) == 3
    assert searcher.placement.finish.ratios  # step times measured on the types
    landed = node_types(ray)
    for result in results:
        trial_id = result.metrics["trial_id"]
        choice = choices[trial_id]
        gpu = min(choice.finish_s, key=choice.finish_s.get)  # where it was predicted to finish first
        assert gpu == choice.gpu or choice.finish_s[gpu] == choice.finish_s[choice.gpu]  # (a tie: the shorter run)
        gpu = choice.gpu
        assert landed[result.metrics["node_id"]] == gpu  # ran on a node of the type it was placed on
        assert any(line.startswith(f"trial {trial_id} ") and f"placed on {gpu}" in line for line in placed_lines)
        alone = trained_alone(workload, result.config, 2)
        for member, expected in alone.items():
            reported = result.metrics["members"][member]
            assert reported["val_acc"] == expected["val_acc"] and reported["val_loss"] == expected["val_loss"]
    assert not searcher.placement.finish.trials  # every trial ended: no GPU counted as held


def test_survivors_of_two_trials_merge_into_one_that_trains_them_as_alone(two_type_cluster, tmp_path, caplog,
                                                                          monkeypatch):
    """Two fused trials of one group keep one member each after epoch 1: they hand their exact states over at one
    epoch boundary and one trial continues both on one GPU (logged, recorded); every member's results equal its
    own trial trained alone (a model without a bias on the shared input: merged arithmetic is bit-identical)."""
    from hydro.tune import fit
    from hydro.tune.placement.trial_placement import TrialPlacement

    # The merge needs the two trials on two GPUs at once. Where the second goes is a near tie (the A100 after the
    # first trial, or the idle V100) that the driver's step-time fit decides, and under load that fit can make
    # this tiny model's step all work and queue both on the A100; pin it to what it measures on an idle core
    # (per-call overhead about 17x the work of a member).
    monkeypatch.setattr(TrialPlacement, "_work", lambda self, plan: (1.6e-5, 3.0e-4))

    (tmp_path / "started").mkdir()
    epochs = 6  # room for the merge: a trial may be an epoch or two ahead of the other when the rule sees both
    workload = spec(epochs=epochs, model=mlp_without_input_bias, loss=StartTogether(str(tmp_path / "started")))
    with caplog.at_level(logging.INFO, logger="hydro.tune.placement.trial_merging"):
        results, searcher = fit(workload, SPACE, num_samples=4, fusion=2, transfer_fraction=None,
                                scheduler=StopOneOfEachTrial(), storage_path=str(tmp_path / "runs"), name="merged",
                                verbose=0, placement="elastic")
    assert not results.errors
    (merge,) = searcher.merging.merges
    assert sorted(merge.handed) == sorted(merge.trials) and len(merge.trials) == 2 and not merge.left
    assert sorted(merge.members) == ["m00001", "m00003"] and 1 <= merge.epoch < epochs
    assert merge.finish_s <= merge.alone_s * 1.05
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"merge {merge.id}: trials ") and "freeing 1 GPU(s)" in m for m in messages)
    assert any(m.startswith(f"merge {merge.id}: trial {merge.trial} continues members") for m in messages)
    by_trial = {r.metrics["trial_id"]: r for r in results}
    assert set(by_trial) == {*merge.trials, merge.trial}  # three trials: the two merged, and the one they became
    sources, merged = [by_trial[t] for t in merge.trials], by_trial[merge.trial]
    assert all(r.metrics["epoch"] == merge.epoch for r in sources)  # they ended at the hand-over
    assert merged.metrics["epoch"] == epochs and merged.metrics["live_members"] == 0
    # the merged trial started once both had ended: from then on one GPU trained what two did
    assert merged.metrics["trial_started_at"] >= max(r.metrics["reported_at"] for r in sources)
    assert not searcher.placement.finish.trials  # every trial ended: no GPU counted as held
    table = searcher.member_results()
    assert sorted(table) == ["m00000", "m00001", "m00002", "m00003"]
    for source in sources:
        alone = trained_alone(workload, source.config, epochs, stopped={"m00000", "m00002"})
        for member, expected in alone.items():
            assert table[member]["epoch"] == (1 if member in ("m00000", "m00002") else epochs)
            assert table[member]["val_acc"] == expected["val_acc"], member
            assert table[member]["val_loss"] == expected["val_loss"], member


def test_hydro_tune_places_the_example_with_its_transfer_stages(two_type_cluster, tmp_path, capsys, caplog):
    from hydro.cli import main

    with caplog.at_level(logging.INFO, logger="hydro.tune.placement.trial_placement"):
        code = main(["tune", "--example", "digits-mlp", "--samples", "4", "--scale", "8", "--fusion", "2",
                     "--epochs", "2", "--top-k", "1", "--placement", "elastic", "--storage", str(tmp_path / "runs"),
                     "--name", "placed-cli"])
    assert code == 0
    out = capsys.readouterr().out
    assert "best configuration (target" in out
    placed = [r.getMessage() for r in caplog.records if " placed on " in r.getMessage()]
    assert len(placed) >= 3 and any("(1 members)" in line for line in placed)  # search trials, the target
    assert all(line.split(" placed on ")[1].split(":")[0] in TYPES for line in placed)


def test_placement_refuses_a_streamed_training_split():
    from hydro.tune.placement.trial_placement import check_placement
    from tests.test_data_sources import splits

    workload = spec(data=lambda: splits("iterable"))
    with pytest.raises(ValueError, match="which an iterable dataset does not know"):
        check_placement("elastic", workload, workload.load_data())
    check_placement("elastic", spec(), spec().load_data())  # a sized one is placed
