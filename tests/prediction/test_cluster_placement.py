"""Placement policies and the trace-driven cluster simulator."""
import pytest

from schedulers.placement.cluster import A100, H100, V100, Cluster, GpuType
from schedulers.placement.learned_speeds import LearnedSpeeds
from schedulers.placement.policies import (BusyGpu, EarliestFinish, ElasticEarliestFinish, ElasticHeterogeneityAware,
                                           HeterogeneityAware, PendingTrial, TypeOblivious, busy_seconds)
from schedulers.placement.simulator import TuningJob, job_stream, simulate

TYPES = {g.name: g for g in (H100, A100, V100)}
SURROGATE, TARGET = PendingTrial("s", 0.25 / 64), PendingTrial("t", 0.25)


def test_small_surrogates_go_to_weak_gpus_and_targets_to_the_strongest():
    placed = HeterogeneityAware().place([SURROGATE, TARGET], {"V100": 1, "H100": 1}, TYPES)
    assert sorted(placed) == [(0, "V100"), (1, "H100")]
    # a target would run at 0.29 of its H100 speed on a V100: with min_efficiency it waits, until patience runs out
    waiting = HeterogeneityAware(min_efficiency=0.5, patience_s=60)
    assert waiting.place([TARGET], {"V100": 1}, TYPES) == []
    assert waiting.place([PendingTrial("t", 0.25, waited_s=61)], {"V100": 1}, TYPES) == [(0, "V100")]


def test_earliest_finish_waits_for_a_strong_gpu_only_while_that_is_quicker():
    # a 27-epoch target: 54000 steps, 4287 s on an H100, 13932 s on a V100
    target = PendingTrial("t", 0.25, steps=54000)
    run_h100, run_v100 = 54000 * H100.step_seconds(0.25), 54000 * V100.step_seconds(0.25)
    policy = EarliestFinish()
    assert policy.place([target], {"V100": 1}, TYPES, busy={"H100": [600.0]}) == []  # waits 10 min for the H100
    late = run_v100 - run_h100 + 1
    assert policy.place([target], {"V100": 1}, TYPES, busy={"H100": [late]}) == [(0, "V100")]
    # the first target reserves the H100 that frees in 10 min; the second would wait 10 min + 4287 s there, or
    # for the A100 (6566 s run) 20 min: A100 wins; the surrogate behind them takes the free V100
    surrogate = PendingTrial("s", 8 * 0.25 / 64, steps=2000)
    placed = policy.place([target, PendingTrial("t2", 0.25, steps=54000), surrogate], {"V100": 1}, TYPES,
                          busy={"H100": [600.0], "A100": [1200.0]})
    assert placed == [(2, "V100")]
    # both free: the target takes the H100 and the surrogate the V100; in the other order (FIFO) the surrogate
    # takes the H100 (34 s there, 79 s on the V100) and the target waits 34 s for it rather than run 3x longer
    assert policy.place([target, surrogate], {"H100": 1, "V100": 1}, TYPES, busy={}) == [(0, "H100"), (1, "V100")]
    assert policy.place([surrogate, target], {"H100": 1, "V100": 1}, TYPES, busy={}) == [(0, "H100")]
    with pytest.raises(ValueError, match="busy="):
        policy.place([target], {"V100": 1}, TYPES)
    with pytest.raises(ValueError, match="steps"):
        policy.place([TARGET], {"V100": 1}, TYPES, busy={})


def test_a_busy_gpu_is_given_back_after_its_trials_steps_left():
    held = [BusyGpu("H100", 0.25, 54000, 50000), BusyGpu("V100", 0.004, 2000, 2000), BusyGpu("H100", 0.1, 100, 0)]
    assert busy_seconds(held, TYPES) == {"H100": [4000 * H100.step_seconds(0.25), 100 * H100.step_seconds(0.1)],
                                         "V100": [0.0]}
    # the target waits for the H100 that frees first rather than run 3x longer on the free V100
    target = PendingTrial("t", 0.25, steps=54000)
    assert EarliestFinish().place([target], {"V100": 1}, TYPES, busy_seconds(held, TYPES)) == []


def test_type_oblivious_placement_is_fifo_reproducible_and_uses_only_free_gpus():
    queue = [PendingTrial(f"k{i}", 0.1) for i in range(5)]
    placed = TypeOblivious().place(queue, {"V100": 2, "H100": 1}, TYPES)
    assert [i for i, _ in placed] == [0, 1, 2] and sorted(g for _, g in placed) == ["H100", "V100", "V100"]
    assert TypeOblivious().place(queue, {"V100": 2, "H100": 1}, TYPES) == placed


def test_stopping_follows_the_trace_and_the_best_configuration_survives():
    job = job_stream(1, seed=3)[0]
    stops = job.stop_epochs()
    assert [sum(s > r for s in stops) for r in (0, 1, 3, 9)] == [32, 11, 4, 2]
    assert stops[job.best()] == 27 and job.qualities()[job.best()] == max(job.qualities())


def one_job(**overrides):
    fields = dict(name="j", arrival_s=0.0, configs=16, fusion=8, surrogate_work=0.004, target_work=0.25,
                  steps_per_epoch=100, rungs=(1, 3, 9), reduction=4, target_epochs=5, seed=0)
    return TuningJob(**{**fields, **overrides})


def test_one_job_alone_runs_for_the_predicted_time():
    cluster = Cluster.of((H100, 1), (V100, 2))
    result = simulate(cluster, [one_job()], HeterogeneityAware())
    # two surrogate trials (8 members each), equal gains: FIFO order takes the H100, then a V100; each epoch
    # takes 100 steps of its surviving members; then the target takes the H100 for 5 epochs
    stops = one_job().stop_epochs()

    def busy(group, gpu):
        return sum(100 * gpu.step_seconds(0.004 * sum(stops[m] > e for m in group)) for e in range(9)
                   if any(stops[m] > e for m in group))

    first, second = busy(range(8), H100), busy(range(8, 16), V100)
    target = 5 * 100 * H100.step_seconds(0.25)
    assert result.makespan_s == pytest.approx(max(first, second) + target)
    assert result.gpu_hours * 3600 == pytest.approx(first + second + target)
    assert result.gpu_seconds_by_type["V100"] == pytest.approx(second)


def test_elastic_merge_releases_gpus_and_keeps_the_tuning_result():
    cluster = Cluster.of((A100, 4))
    jobs = [one_job(configs=32, seed=s, arrival_s=100.0 * s, target_epochs=1, target_work=0.004, steps_per_epoch=1000)
            for s in range(3)]  # the surrogate phase dominates; 5 s per merge
    plain = simulate(cluster, jobs, HeterogeneityAware(), merge_s=5.0)
    elastic = simulate(cluster, jobs, ElasticHeterogeneityAware(), merge_s=5.0)
    assert elastic.best_configs == plain.best_configs
    assert elastic.gpu_hours < 0.9 * plain.gpu_hours


def test_earliest_finish_queues_a_target_behind_another_on_the_h100_when_that_finishes_first():
    # two jobs at once, one configuration each (a 1-epoch surrogate), then 5-epoch targets: 1000 steps of 0.25
    # take 87.9 s per epoch on the H100 and 258 s on the V100, so the second target waits 440 s for the H100
    jobs = [one_job(name=f"j{i}", configs=1, fusion=1, rungs=(1,), reduction=1, steps_per_epoch=1000, seed=i)
            for i in range(2)]
    target_s, surrogate_h100_s = 5 * 1000 * H100.step_seconds(0.25), 1000 * H100.step_seconds(0.004)
    cluster = Cluster.of((H100, 1), (V100, 1))
    result = simulate(cluster, jobs, EarliestFinish())
    assert result.gpu_seconds_by_type["H100"] == pytest.approx(2 * target_s + surrogate_h100_s)
    assert result.gpu_seconds_by_type["V100"] == pytest.approx(1000 * V100.step_seconds(0.004))  # a surrogate
    assert result.makespan_s == pytest.approx(result.gpu_seconds_by_type["H100"])  # the H100 never idles
    greedy = simulate(cluster, jobs, HeterogeneityAware())  # no predictions: the second target takes the V100
    assert result.makespan_s < 0.7 * greedy.makespan_s and result.gpu_hours < 0.5 * greedy.gpu_hours


def test_earliest_finish_saves_gpu_hours_on_a_loaded_mixed_cluster_with_the_same_tuning_result():
    cluster = Cluster.of((H100, 1), (A100, 1), (V100, 2))
    jobs = job_stream(6, seed=1, mean_interarrival_s=900.0, steps_per_epoch=500)
    results = {policy: simulate(cluster, jobs, policy()) for policy in (TypeOblivious, HeterogeneityAware,
                                                                         EarliestFinish, ElasticEarliestFinish)}
    base = results[TypeOblivious]
    for result in results.values():
        assert (result.best_configs, result.member_epochs) == (base.best_configs, base.member_epochs)
    assert base.member_epochs == [sum(job.stop_epochs()) for job in jobs]
    assert results[EarliestFinish].gpu_hours < 0.85 * base.gpu_hours
    assert results[EarliestFinish].gpu_hours < results[HeterogeneityAware].gpu_hours
    assert results[ElasticEarliestFinish].gpu_hours < results[EarliestFinish].gpu_hours
    # mispredicted run times change decisions, not the tuning result
    noisy = simulate(cluster, jobs, ElasticEarliestFinish(), prediction_error=0.5, seed=3)
    assert noisy.member_epochs == base.member_epochs and noisy.gpu_hours != results[ElasticEarliestFinish].gpu_hours


def test_cluster_and_simulation_refuse_impossible_input():
    with pytest.raises(ValueError, match="known GPU types"):
        Cluster({"V100": V100}, {"H100": 1})

    class Greedy(TypeOblivious):
        def place(self, queue, free, types, busy=None):
            return [(0, "V100"), (0, "V100")]

    with pytest.raises(ValueError, match="busy GPU or a trial twice"):
        simulate(Cluster.of((V100, 1)), [one_job()], Greedy())
    with pytest.raises(ValueError, match="prediction_error"):
        simulate(Cluster.of((V100, 1)), [one_job()], EarliestFinish(), prediction_error=-0.1)
    assert GpuType("X", 2.0, 0.01).step_seconds(1.0) == pytest.approx(0.51)


def test_the_benchmark_records_its_assumed_constants_and_the_gains_sensitivity_to_them(tmp_path, capsys):
    """``benchmarks/cluster_placement.py`` at tiny sizes: its JSON records every assumed speed and overhead and
    what holds by construction and the prior its learned speeds start from, and its speed sweep covers every
    (overhead, speed scale) and load; at the assumed constants the sweep reproduces the main table's gains."""
    import json

    from benchmarks.cluster_placement import LOADS, main

    main(["--jobs", "3", "--seeds", "1", "--overheads-ms", "0", "8", "--speed-scales", "0", "1",
          "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "assumed constants of the simulated cluster" in printed and "sensitivity to the true speeds" in printed
    record = json.loads((tmp_path / "cluster_placement.json").read_text())
    assumed = record["assumptions"]
    assert {name: (g["count"], g["rate"], g["overhead_s"]) for name, g in assumed["gpu_types"].items()} == {
        "H100": (2, 3.5, 0.008), "A100": (2, 2.2, 0.008), "V100": (4, 1.0, 0.008)}
    assert all(g["source"].startswith("assumed") for g in assumed["gpu_types"].values())
    assert assumed["jobs"]["steps_per_epoch"] == 2000 and assumed["merge_s"] == 30.0
    speeds = assumed["placement_speeds"]
    assert speeds["(b)/(c)"] == "learned" and speeds["prior"]["name"] == "uniform"
    assert {g["rate"] for g in speeds["prior"]["gpu_types"].values()} == {1.0}
    assert "(c) with known speeds" in {r["policy"] for r in record["table"]}
    assert any("same tuning result" in claim for claim in assumed["by_construction"])
    sweep = record["speed_sensitivity"]
    assert sorted((r["load"], r["overhead_s"], r["speed_scale"]) for r in sweep) == sorted(
        (load, o, s) for load in LOADS for o in (0.0, 0.008) for s in (0.0, 1.0))
    equal = [r for r in sweep if r["speed_scale"] == 0.0]
    assert all(r["rates"] == {"H100": 1.0, "A100": 1.0, "V100": 1.0} for r in equal)
    for load in LOADS:
        at_assumed = next(r for r in sweep if r["load"] == load and (r["overhead_s"], r["speed_scale"]) == (0.008, 1))
        table = {r["policy"]: r for r in record["table"] if r["load"] == load}
        assert at_assumed["gpu_hours_vs_a_b"] == pytest.approx(table["(b) earliest finish"]["gpu_hours_vs_a"])
        assert at_assumed["gpu_hours_vs_a_c"] == pytest.approx(table["(c) (b) + elastic merge"]["gpu_hours_vs_a"])


UNIFORM = {name: GpuType(name, 1.0, 0.008) for name in TYPES}


def test_learned_speeds_from_a_uniform_prior_come_to_prefer_the_type_measured_faster():
    speeds = LearnedSpeeds(UNIFORM, {"H100": 1, "A100": 1, "V100": 1})
    target = PendingTrial("t", 0.25, steps=1000)
    assert speeds.types()["H100"].step_seconds(0.25) == speeds.types()["V100"].step_seconds(0.25)
    for key, gpu in (("h", H100), ("a", A100), ("v", V100)):  # one target on each type, stepping at its true speed
        speeds.started(key, gpu.name, 0.25, 1, 1000)
        speeds.measured(key, 100, 1, gpu.step_seconds(0.25))
    learned = speeds.types()
    assert [learned[g].step_seconds(0.25) for g in ("H100", "A100", "V100")] == pytest.approx(
        [g.step_seconds(0.25) for g in (H100, A100, V100)])  # a target's step as measured on each type
    assert speeds.correction("H100") < speeds.correction("A100") < speeds.correction("V100") == pytest.approx(1.0)
    assert EarliestFinish().place([target], {"V100": 1, "H100": 1}, UNIFORM, busy={}) == [(0, "H100")]  # a tie: name
    assert EarliestFinish().place([target], {"V100": 1, "A100": 1}, learned, busy={}) == [(0, "A100")]
    # the prior alone cannot tell the V100 is slower: it would take the V100 rather than wait 60 s for the H100
    assert EarliestFinish().place([target], {"V100": 1}, UNIFORM, busy={"H100": [60.0]}) == [(0, "V100")]
    assert EarliestFinish().place([target], {"V100": 1}, learned, busy={"H100": [60.0]}) == []
    speeds.ended("h")
    assert speeds.types()["H100"] == learned["H100"]  # what was measured stays after the trial ends


def test_a_simulation_with_learned_speeds_keeps_the_tuning_result():
    cluster = Cluster.of((H100, 1), (A100, 1), (V100, 2))
    jobs = job_stream(6, seed=1, mean_interarrival_s=900.0, steps_per_epoch=500)
    prior = {name: UNIFORM[name] for name in cluster.types}
    base = simulate(cluster, jobs, TypeOblivious())
    known = simulate(cluster, jobs, ElasticEarliestFinish())
    learned = simulate(cluster, jobs, ElasticEarliestFinish(), prior=prior)
    for result in (known, learned):
        assert (result.best_configs, result.member_epochs) == (base.best_configs, base.member_epochs)
    assert learned.gpu_hours != known.gpu_hours  # it placed by other speeds than the true ones
    assert learned.gpu_hours < 0.85 * base.gpu_hours
    # a prior equal to the true speeds is corrected by exactly 1: the same run as with known speeds
    exact = simulate(cluster, jobs, ElasticEarliestFinish(), prior=dict(cluster.types))
    assert (exact.gpu_hours, exact.makespan_s) == (known.gpu_hours, known.makespan_s)
    with pytest.raises(ValueError, match="prior must give a speed for each"):
        simulate(cluster, jobs, EarliestFinish(), prior={"H100": H100})
