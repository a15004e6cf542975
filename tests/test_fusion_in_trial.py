"""Fusion planned where the trial runs: measured on the trial's device and precision, once per (group key,
scale, device type, precision) in a process; the trial trains its members in chunks of the planned size."""
from __future__ import annotations

import torch

import hydro.trial.fusion as fusion_module
from hydro.trial.fusion import fusion_in_trial
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import small_digits, spec

MEMBERS = [(f"m{i}", {"lr": 0.05 * (i + 1), "momentum": 0.9}) for i in range(5)]


def test_planned_once_per_group_device_and_precision_on_the_trials_device(monkeypatch):
    calls, real = [], fusion_module.plan_fusion

    def recording(*args, **kwargs):
        calls.append((kwargs["device"], torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None))
        return real(*args, **kwargs)

    monkeypatch.setattr(fusion_module, "plan_fusion", recording)
    monkeypatch.setattr(fusion_module, "_PLANNED_IN_PROCESS", {})
    data = spec().load_data()
    cpu = torch.device("cpu")
    first = fusion_in_trial(spec(), {"lr": 0.1}, 1, data, 4, cpu)
    assert 1 <= first <= 4 and fusion_in_trial(spec(), {"lr": 0.2}, 1, data, 4, cpu) == first  # cached
    assert fusion_in_trial(spec(), {"lr": 0.2}, 1, data, 1, cpu) == 1  # never more than the trial's members
    fusion_in_trial(spec(precision="bf16"), {"lr": 0.1}, 1, data, 4, cpu)  # another precision: measured again
    fusion_in_trial(spec(batch_size=16), {"lr": 0.1}, 1, data, 4, cpu)  # another group: measured again
    assert calls == [(cpu, None), (cpu, torch.bfloat16), (cpu, None)]


def test_a_trial_trains_its_members_in_chunks_of_the_planned_size():
    whole = FusedTrial(spec(), TrialPlan(TrialKind.SURROGATE, MEMBERS), small_digits())
    chunked = FusedTrial(spec(), TrialPlan(TrialKind.SURROGATE, MEMBERS), small_digits(), fusion=2)
    assert [len(c.member_ids) for c in chunked.chunks] == [2, 2, 1] and chunked.max_fusion == 2
    assert chunked.member_ids == whole.member_ids
    for want, got in zip([whole.run_epoch() for _ in range(2)], [chunked.run_epoch() for _ in range(2)]):
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_a_later_stage_of_a_group_in_the_same_process_measures_two_counts_not_the_ladder(monkeypatch):
    import hydro.fusion_measure as planning

    measured, real = [], planning.measure_fusion

    def recording(model_factory, batch, loss_fn, count, *args, **kwargs):
        measured.append(count)
        return real(model_factory, batch, loss_fn, count, *args, **kwargs)

    monkeypatch.setattr(planning, "measure_fusion", recording)
    monkeypatch.setattr(fusion_module, "_PLANNED_IN_PROCESS", {})
    data, cpu = spec().load_data(), torch.device("cpu")
    budget = 1 << 30
    fusion_in_trial(spec(), {"lr": 0.1}, 2, data, 8, cpu, budget)  # the first stage: the ladder
    assert measured[:2] == [1, 2] and len(measured) > 2
    ladder = len(measured)
    fusion_in_trial(spec(), {"lr": 0.3}, 2, data, 8, cpu, budget)  # the same stage again: planned already
    assert len(measured) == ladder
    later = fusion_in_trial(spec(), {"lr": 0.1}, 1, data, 8, cpu, budget)  # the next stage: F = 1 and 2 only
    assert measured[ladder:] == [1, 2] and 1 <= later <= 8
    fusion_in_trial(spec(), {"lr": 0.2}, 1, data, 8, cpu, budget)
    assert len(measured) == ladder + 2


def test_extrapolation_takes_the_largest_count_whose_memory_fits_where_fusing_loses_no_throughput():
    from hydro.fusion_measure import FusionMeasurement, FusionPlan, extrapolated_plan

    def plan(two_samples_per_s: float) -> FusionPlan:
        return FusionPlan(2, "cpu", 1000, "measured", [FusionMeasurement(1, 0.1, 100, 10.0),
                                                      FusionMeasurement(2, 0.2, 200, two_samples_per_s)])

    assert extrapolated_plan(plan(10.0), 32).num_members == 10  # 100 bytes a member: 10 fit in 1000
    assert extrapolated_plan(plan(10.0), 6).num_members == 6
    assert extrapolated_plan(plan(5.0), 32).num_members == 2  # fusing two halves the throughput: as measured
