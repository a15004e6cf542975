"""A warm-up + cosine schedule (TuneSpec.lr_scheduler) tunes end to end: through ``hydro tune`` with a user's
workload file and through the Python API (``fit``), surrogates and the full-size target alike."""
import json

import torch

from hydro.cli import main
from hydro.tune.run import fit
from tests.tune.workload import SPACE, spec


def test_hydro_tune_runs_a_workload_with_a_warmup_cosine_schedule(ray_cluster, workload_file, tmp_path, capsys):
    assert main(["tune", "--workload", f"{workload_file}:warmup_cosine", "--samples", "3", "--fusion", "3",
                 "--scheduler", "none", "--storage", str(tmp_path / "runs"), "--name", "sched"]) == 0
    out = capsys.readouterr().out
    assert "best configuration (target, val_acc = " in out
    assert json.loads((tmp_path / "runs" / "sched" / "hydro_best.json").read_text())["kind"] == "target"


def test_fit_tunes_with_a_warmup_cosine_schedule(ray_cluster, tmp_path):
    workload = spec(epochs=2)
    workload.lr_scheduler = lambda optimizer, config: torch.optim.lr_scheduler.SequentialLR(
        optimizer, [torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=1),
                    torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2)], milestones=[1])
    results, _ = fit(workload, SPACE, num_samples=3, fusion=3, storage_path=str(tmp_path), name="sched")
    assert not results.errors
    best = json.loads((tmp_path / "sched" / "hydro_best.json").read_text())
    assert best["kind"] == "target" and 1e-3 <= best["config"]["lr"] <= 1.0
