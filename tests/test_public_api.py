"""What the README uses exists: top-level exports and the demo's help with its defaults."""
import torch
from torch import nn

import hydro
from hydro.cli import build_parser


def test_readme_names_are_attributes_of_hydro():
    for name in ("fuse", "unfuse", "keep_members", "shrink", "trial_losses", "plan_fusion", "FusionPlan",
                 "FuseError", "ShrinkError", "ShrinkWarning"):
        assert name in hydro.__all__ and getattr(hydro, name) is not None, name
    assert issubclass(hydro.ShrinkWarning, UserWarning)
    fused = hydro.fuse([nn.Linear(3, 2) for _ in range(2)])
    losses = hydro.trial_losses(nn.MSELoss(), fused(torch.ones(4, 3)), torch.zeros(4, 2))
    assert losses.shape == (2,)


def test_demo_help_shows_defaults(capsys):
    parser = build_parser()
    try:
        parser.parse_args(["demo", "--help"])
    except SystemExit:
        pass
    text = " ".join(capsys.readouterr().out.split())
    for option, default in (("--configs", 16), ("--epochs", 4), ("--width", 64), ("--fusion", "auto")):
        assert option in text and f"(default: {default})" in text, option
