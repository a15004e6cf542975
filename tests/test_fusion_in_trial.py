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
