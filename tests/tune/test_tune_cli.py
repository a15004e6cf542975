"""``hydro tune`` as a user types it: a workload file importing a module beside it (both pickled by value to the
workers), bad input refused before Ray starts, and a run in which every member fails ending with one summary."""
import json

import pytest
import ray

from hydro.cli import main


def test_tune_cli_runs_a_user_workload_file(workload_file, tmp_path, capsys):
    try:
        assert main(["tune", "--workload", str(workload_file), "--samples", "3", "--fusion", "3", "--scheduler",
                     "none", "--storage", str(tmp_path / "runs"), "--name", "cli"]) == 0
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    assert "best configuration (target, val_acc = " in out and "Number of trials" not in out
    assert sum(line.split()[0].startswith("m0000") for line in out.splitlines() if line.strip()) == 3
    assert f"trained full-size model: {tmp_path / 'runs' / 'cli'}/hydro_trial_" in out
    assert (tmp_path / "runs" / "cli" / "hydro_members.csv").exists()
    assert json.loads((tmp_path / "runs" / "cli" / "hydro_best.json").read_text())["kind"] == "target"


@pytest.mark.parametrize("argv, message", [
    (["--fusion", "abc"], "argument --fusion: give 'auto' or a number of members >= 1 ('abc' is not an integer)"),
    (["--epochs", "0"], "argument --epochs: must be >= 1, got 0"),
    (["--epochs", "-1"], "argument --epochs: must be >= 1, got -1"),
    (["--samples", "0"], "argument --samples: must be >= 1, got 0"),
    (["--scale", "0"], "argument --scale: must be >= 1, got 0"),
    (["--transfer-fraction", "0"], "argument --transfer-fraction: must be in (0, 1], got 0.0"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--example", "digits-mlp", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not ray.is_initialized()


def test_an_unsupported_optimizer_fails_once_before_ray_starts(workload_file, tmp_path, capsys):
    code = main(["tune", "--workload", f"{workload_file}:rmsprop", "--storage", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and not ray.is_initialized()
    assert err.startswith("hydro tune: hydro: the workload fails before tuning starts, training two fused members "
                          "at scale 1 one batch with the configuration {'lr': ")
    assert err.rstrip().endswith("UnsupportedOptimizer: the optimizer factory returned torch.optim.rmsprop.RMSprop; "
                                 "fused training supports torch.optim.SGD, Adam and AdamW. Or set "
                                 "TuneSpec(fallback_unfused=True) to train these members unfused (full size only)")
    assert "Traceback" not in err


def test_every_member_failing_ends_with_one_summary_and_exit_code_1(workload_file, tmp_path, capsys):
    try:
        code = main(["tune", "--workload", f"{workload_file}:diverging", "--samples", "4", "--fusion", "2",
                     "--storage", str(tmp_path / "runs"), "--name", "nan"])
    finally:
        ray.shutdown()
    captured = capsys.readouterr()
    assert code == 1
    assert "hydro tune: hydro: no member ended with a finite objective (every member diverged: NaN or inf)" in captured.err
    assert "TypeError" not in captured.err and "Traceback" not in captured.err
    assert (tmp_path / "runs" / "nan" / "hydro_members.csv").exists()
    assert not (tmp_path / "runs" / "nan" / "hydro_best.json").exists()
