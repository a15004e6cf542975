"""Step-time model: the NNLS fit, candidate F, per-layer features and timings, and the predicted planner."""
import time

import pytest
import torch
from torch import nn

from hydro.examples.models import MLP
from hydro.profiling import fit_step_time_model, profile_layers, step_features, time_layer
from hydro.trial.fusion import PredictedFusion
from schedulers.prediction.step_time import (ALL_KINDS, OPTIMIZER, LayerFeatures, LayerTiming, StepTimeModel,
                                             candidate_counts, memory_bytes)


def synthetic(kind, per_flop, per_byte, overhead, shapes, members=(1, 4, 16)):
    rows = []
    for flops, nbytes in shapes:
        features = LayerFeatures(kind, flops, nbytes, params=10)
        rows += [LayerTiming(features, f, per_flop * f * flops + per_byte * f * nbytes + overhead) for f in members]
    return rows


def test_fit_recovers_the_rates_and_overhead_of_each_kind():
    linear = synthetic("Linear", 1e-10, 1e-9, 5e-5, [(1e6, 1e4), (4e6, 3e4), (2e7, 2e5)])
    relu = synthetic("ReLU", 0.0, 2e-9, 1e-5, [(1e4, 1e5), (5e4, 4e5)])
    model = StepTimeModel.fit("dev", linear + relu)
    fit = model.kinds["Linear"]
    assert fit.per_flop == pytest.approx(1e-10, rel=1e-6) and fit.per_byte == pytest.approx(1e-9, rel=1e-6)
    assert fit.overhead_s == pytest.approx(5e-5, rel=1e-6)
    held_out = LayerFeatures("Linear", 8e6, 5e4)
    assert model.layer_seconds(held_out, 8) == pytest.approx(1e-10 * 8 * 8e6 + 1e-9 * 8 * 5e4 + 5e-5, rel=1e-6)
    assert model.layer_seconds(LayerFeatures("Unseen", 1e6, 1e4), 2) == model.kinds[ALL_KINDS].seconds(2e6, 2e4)
    assert StepTimeModel.from_dict(model.to_dict()) == model


def test_fit_refuses_no_timings_and_non_positive_times():
    with pytest.raises(ValueError, match="no layer timings"):
        StepTimeModel.fit("dev", [])
    with pytest.raises(ValueError, match="positive number of seconds"):
        StepTimeModel.fit("dev", [LayerTiming(LayerFeatures("Linear", 1, 1), 1, 0.0)])


def test_candidates_are_the_knee_and_its_neighbours_within_the_memory_budget():
    # overhead 1 ms, 0.1 ms of work per member: throughput F/(0.1F + 1) reaches 85% of the F=64 value at F=32
    model = StepTimeModel.fit("dev", synthetic("Linear", 1e-10, 0.0, 1e-3, [(1e6, 0.0), (3e6, 0.0)]))
    layers = [LayerFeatures("Linear", 1e6, 0.0, params=1000, saved_bytes=0.0)]
    speeds = {f: model.throughput(layers, f, 32) for f in (8, 16, 32, 64)}
    assert speeds[16] < 0.85 * speeds[64] <= speeds[32]
    assert candidate_counts(model, layers, 32, max_members=64, tolerance=0.15) == [16, 32, 64]
    per_member = memory_bytes(layers, 1)
    assert candidate_counts(model, layers, 32, max_members=64, memory_budget_bytes=8.5 * per_member,
                            tolerance=0.15) == [2, 4, 8]
    assert candidate_counts(model, layers, 32, max_members=3, tolerance=0.15) == [1, 2, 3]


def test_layer_features_count_flops_of_linear_and_conv_and_every_call():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 8, 3, padding=1, groups=1), nn.Linear(8 * 4 * 4, 5)

        def forward(self, x):
            return self.fc(self.conv(x).flatten(1)) + self.fc(self.conv(x).flatten(1))

    layers = profile_layers(Twice(), torch.randn(2, 3, 4, 4))
    assert [layer.name for layer in layers] == ["conv", "fc", "conv", "fc"]
    conv, fc = layers[0].features, layers[1].features
    assert conv.flops == 2 * (2 * 8 * 4 * 4) * 3 * 9 and fc.flops == 2 * 2 * 128 * 5
    assert fc.params == 128 * 5 + 5 and fc.shape == (2, 128, 5)
    features = step_features(MLP((64, 32, 10)), torch.randn(4, 64))
    assert [f.kind for f in features] == ["Linear", "ReLU", "Linear", OPTIMIZER]
    assert features[-1].params == 64 * 32 + 32 + 32 * 10 + 10


def test_timed_layers_fit_a_model_that_predicts_more_time_for_more_members():
    layer = profile_layers(nn.Linear(128, 128), torch.randn(64, 128))[0]
    timing = time_layer(layer, 4, rounds=3, clock=time.thread_time)
    assert timing.members == 4 and timing.seconds > 0
    # CPU time of the timing thread (as above): wall-clock times of these microsecond layers on a loaded machine
    # once timed F=1 slower than F=8, and the fit then predicted the same time for both
    model = fit_step_time_model(MLP((64, 256, 10)), torch.randn(32, 64), members=(1, 16), clock=time.thread_time)
    assert {"Linear", "ReLU", OPTIMIZER} <= set(model.kinds)
    features = step_features(MLP((64, 256, 10)), torch.randn(32, 64))
    assert 0 < model.step_seconds(features, 1) < model.step_seconds(features, 16)


def test_timed_layers_take_turns_round_by_round(monkeypatch):
    import hydro.profiling as profiling

    layers = profile_layers(MLP((16, 8, 4)), torch.randn(2, 16))
    calls = []
    monkeypatch.setattr(profiling, "_layer_step", lambda layer, members, device: lambda: calls.append(layer.name))
    ticks = iter(range(10**6))
    timings = profiling.time_layers(layers, 2, rounds=3, min_time_s=0.0, clock=lambda: next(ticks))
    names = [layer.name for layer in layers]
    assert calls == names + names * 3  # one warm-up each, then every layer's round before anyone's next
    assert [t.features for t in timings] == [layer.features for layer in layers] and {t.members for t in timings} == {2}


def test_predicted_fusion_measures_only_the_candidates(monkeypatch):
    from hydro.trial import fusion
    from tests.tune.workload import small_digits, spec

    measured = []
    real = fusion.plan_fusion

    def spy(*args, **kwargs):
        plan = real(*args, **kwargs)
        measured.append([m.num_members for m in plan.measurements])
        return plan

    monkeypatch.setattr(fusion, "plan_fusion", spy)
    model = StepTimeModel.fit("dev", synthetic("Linear", 1e-10, 0.0, 1e-3, [(1e4, 0.0), (3e4, 0.0)])
                              + synthetic(OPTIMIZER, 0.0, 1e-12, 1e-6, [(0.0, 1e4), (0.0, 1e5)]))
    workload = spec()
    planner = PredictedFusion(workload, 1, workload.load_data(), max_members=16, threads=1, model=model)
    count = planner.fusion_for("group", {"lr": 0.1, "momentum": 0.9, "hidden": 16})
    features = step_features(MLP((64, 16, 10)), small_digits()[0][0][:32])
    candidates = candidate_counts(model, features, 32, 16)
    assert len(candidates) == 3 and len(measured) == 1
    assert measured[0] == candidates[:len(measured[0])] and count in measured[0]  # may stop early, never skip
