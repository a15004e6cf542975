"""What ``hydro tune`` prints by default: Hydro's progress, the top member rows (the returned target first) and
what the columns and member names mean, once; none of Ray's log lines (its cluster and token notices, per-trial
tensorboard and checkpoint lines), which ``--verbose`` brings back; the printed trained model is the returned one,
loadable from the run directory with one call."""
import json

import ray
import torch

from hydro.cli import main
from hydro.examples.data import digits
from hydro.tune import load_model
from hydro.tune.cli import LEGEND

RAY_NOISE = ("Checkpoint successfully created", "tensorboard", "Token authentication", "Started a local Ray instance",
             "Wrote the latest version of all result files", "Number of trials")


def test_hydro_tune_prints_hydro_not_ray_and_the_returned_model(workload_file, tmp_path, capfd, caplog):
    try:
        assert main(["tune", "--workload", str(workload_file), "--samples", "3", "--fusion", "3", "--epochs", "1",
                     "--scale", "2", "--storage", str(tmp_path / "runs"), "--name", "quiet"]) == 0
    finally:
        ray.shutdown()
    out, err = capfd.readouterr()
    for noise in RAY_NOISE:
        assert noise not in out + err + caplog.text, noise
    assert any(r.name == "hydro.tune.search.progress" and r.getMessage().startswith("members: ") for r in caplog.records)
    assert out.count(LEGEND.strip()) == 1
    table = out.split("member ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]  # the rows up to the blank line
    kinds = [line.split()[1] for line in table]
    targets = kinds.count("target")  # the returned one, and fallback targets when the first one regressed
    assert targets >= 1 and kinds == ["target"] * targets + ["surrogate"] * 3  # the targets first
    run = tmp_path / "runs" / "quiet"
    best = json.loads((run / "hydro_best.json").read_text())
    assert f"trained full-size model: {best['checkpoint']} (your model, trained: hydro.tune.load_model('{run}'))" in out
    model = load_model(str(run))  # the user's UserNet, pickled with its module's code
    _, val = digits()
    with torch.no_grad():
        accuracy = (model(val.x[:128]).argmax(-1) == val.y[:128]).float().mean().item()
    assert type(model).__name__ == "UserNet" and abs(accuracy - best["value"]) < 1e-6
