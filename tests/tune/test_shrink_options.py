"""Shrink options on the tuning path: ``TuneSpec.shrink_fixed``/``shrink_min_width``/``shrink_strict``
reach ``hydro.shrink`` for every member a trial builds, and ``hydro tune`` sets them from its flags."""
from __future__ import annotations

import pytest
import torch

import hydro
from hydro.cli import main
from hydro.examples.models import MLP
from hydro.shrink.errors import ShrinkError
from hydro.trial.check import WorkloadError
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune import cli as tune_cli
from tests.tune.workload import small_digits, spec

CONFIG = {"lr": 0.1, "momentum": 0.0}
SURROGATES = TrialPlan(TrialKind.SURROGATE, [("m00000", CONFIG), ("m00001", CONFIG)], scale=8, mup=True)


def widths(**options) -> list[tuple[int, int]]:
    workload = spec(model=lambda config: MLP((64, 16, 16, 16, 10)), **options)
    member = hydro.unfuse(FusedTrial(workload, SURROGATES, small_digits()).members.model)[0]
    return [tuple(layer.weight.shape) for layer in member.net if hasattr(layer, "weight")]


def test_spec_shrink_options_reach_every_member():
    assert widths(shrink_min_width=2) == [(2, 64), (2, 2), (2, 2), (10, 2)]  # 16 / 8 = 2 >= min_width
    assert widths(shrink_min_width=2, shrink_fixed=("net.4",)) == [(2, 64), (16, 2), (16, 16), (10, 16)]  # kept


def test_spec_readout_init_reaches_every_member():
    def readout(**options):
        workload = spec(model=lambda config: MLP((64, 64, 64, 10)), **options)
        return hydro.unfuse(FusedTrial(workload, SURROGATES, small_digits()).members.model)[0].net[-1].weight

    assert torch.count_nonzero(readout(shrink_readout_zero_init=True)) == 0
    assert torch.count_nonzero(readout(shrink_readout_zero_init=False)) == readout().numel()


def test_strict_shrink_refuses_what_would_fall_below_min_width():
    with pytest.raises(ShrinkError):
        widths(shrink_strict=True)  # 16 / 8 = 2 < min_width 8


def test_cli_flags_set_the_shrink_options(monkeypatch, capsys):
    seen = []

    def prepare(workload, space, **kwargs):
        seen.append(workload)
        raise WorkloadError("stop here")

    monkeypatch.setattr(tune_cli, "prepare", prepare)
    assert main(["tune", "--example", "char-lm", "--scale", "8", "--shrink-fixed", "embed, head", "--min-width", "4",
                 "--strict-shrink"]) == 2
    (workload,) = seen
    assert workload.shrink_fixed == ("embed", "head") and workload.shrink_min_width == 4 and workload.shrink_strict
    assert "hydro tune: stop here" in capsys.readouterr().err
