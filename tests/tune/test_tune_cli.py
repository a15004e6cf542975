"""``hydro tune`` as a user types it: a workload file importing a module beside it (both pickled by value to the
workers), bad input refused before Ray starts, and a run in which every member fails ending with one summary."""
import json
import re

import pytest
import ray

from hydro.cli import main

RAY_WORKER_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\(\w+ pid=\d+")  # a line Ray forwarded from a worker


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
    (["--scale", "0"], "argument --scale: give 'auto' or a width divisor >= 1 (must be >= 1, got 0)"),
    (["--transfer-fraction", "0"], "argument --transfer-fraction: must be in (0, 1], got 0.0"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--example", "digits-mlp", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not ray.is_initialized()


@pytest.mark.parametrize("argv, message", [
    (["--energy-eta", "0.7"], "hydro tune: --energy-eta only applies with --energy; add --energy or leave it out"),
    (["--energy-batch-sizes", "16", "--energy-beta", "3"],
     "hydro tune: --energy-beta, --energy-batch-sizes only apply with --energy; add --energy or leave them out"),
    (["--energy", "--energy-devices", "simulated", "--energy-beta", "1"],
     "hydro tune --energy: hydro.energy: beta=1.0 must be > 1 (trials stop at beta x the least cost)"),
    (["--gpus-per-trial", "-1"], "hydro tune: hydro.tune: gpus_per_trial must be a fraction in [0, 1] or a whole "
                                 "number of GPUs (Ray's rule), got -1.0"),
    (["--address", "127.0.0.1:1"], "hydro tune: no Ray cluster answers at 127.0.0.1:1 ([Errno 111] Connection "
                                   "refused); start one there with `ray start --head --port 1`"),
    (["--workload", "no_such_module"], "hydro tune: --workload no_such_module: importing 'no_such_module' failed: "
                                       "ModuleNotFoundError: No module named 'no_such_module'"),
])
def test_bad_input_found_after_parsing_ends_with_one_line_and_exit_code_2(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = argv if "--workload" in argv else ["--example", "digits-mlp", *argv]
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not ray.is_initialized()


def test_a_workload_function_that_raises_is_named_with_its_file_and_line(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def workload():\n    raise RuntimeError('no data here')\n")
    assert main(["tune", "--workload", str(tmp_path / "broken.py")]) == 2
    assert capsys.readouterr().err == (f"hydro tune: --workload {tmp_path / 'broken.py'}: calling workload() failed: "
                                       f"{tmp_path / 'broken.py'}:2: RuntimeError: no data here\n")


def test_trials_asking_for_gpus_a_local_cluster_lacks_are_refused_instead_of_waiting_forever(tmp_path, capsys,
                                                                                              monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        code = main(["tune", "--example", "digits-mlp", "--gpus-per-trial", "1", "--storage", str(tmp_path)])
    finally:
        ray.shutdown()
    err = capsys.readouterr().err
    assert code == 2 and "hydro tune: hydro.tune: a trial asks for 1 CPU, 1 GPU but no node of the Ray cluster has " \
                         "that much (the most one node has: " in err and ", 0 GPU); this cluster is this machine's" in err
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


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


def test_every_member_failing_ends_with_one_summary_and_exit_code_1(ray_cluster, workload_file, tmp_path, capsys):
    code = main(["tune", "--workload", f"{workload_file}:diverging", "--samples", "4", "--fusion", "2",
                 "--storage", str(tmp_path / "runs"), "--name", "nan"])
    captured = capsys.readouterr()
    assert code == 1
    assert "hydro tune: hydro: no member ended with a finite objective (every member diverged: NaN or inf)" in captured.err
    assert "TypeError" not in captured.err
    # Ray forwards its workers' output prefixed "(name pid=N)"; a worker Tune stops at the end of the run can print
    # Ray's own SIGTERM traceback there (seen once in CI). Hydro's summary, on the driver, must not be one.
    driver = [line for line in captured.err.splitlines() if not RAY_WORKER_LINE.match(line)]
    assert not any("Traceback" in line for line in driver), "\n".join(driver)
    assert (tmp_path / "runs" / "nan" / "hydro_members.csv").exists()
    assert not (tmp_path / "runs" / "nan" / "hydro_best.json").exists()


def test_transfer_options_default_to_the_policy_and_the_flags_set_them():
    from hydro.cli import build_parser
    import dataclasses

    from hydro.tune.cli import TRANSFER_OPTIONS, transfer_options
    from hydro.tune.search.searcher import _SET_BY_SEARCHER
    from schedulers.transfer import Disagreement, TransferPolicy

    # every transfer option HydroSearcher takes is a flag
    assert set(TRANSFER_OPTIONS) == {f.name for f in dataclasses.fields(TransferPolicy)} - _SET_BY_SEARCHER

    def policy(*flags):
        args = build_parser().parse_args(["tune", "--example", "digits-mlp", *flags])
        return TransferPolicy(1.0, 16, "val_acc", "max", scale=8, **transfer_options(args))

    assert policy() == TransferPolicy(1.0, 16, "val_acc", "max", scale=8)  # no flag: the policy's own defaults
    flags = ["--no-ladder", "--eta", "2", "--top-k", "2", "--seeds", "3", "--no-escalate", "--disagreement", "likely",
             "--probes", "1", "--probe-margin", "0.02", "--max-target-drop", "0.005", "--fallback-targets", "0",
             "--min-agreement", "0.3", "--no-halving"]
    assert policy(*flags) == TransferPolicy(
        1.0, 16, "val_acc", "max", scale=8, ladder=False, halving=False, eta=2, top_k=2, seeds=3, escalate=False,
        disagreement=Disagreement.LIKELY, probes=1, probe_margin=0.02, max_target_drop=0.005, fallback_targets=0,
        min_agreement=0.3)


def test_transfer_flags_reach_the_run(ray_cluster, workload_file, tmp_path, capsys, caplog):
    """With ``--scale auto``: the user's 64-16-10 net shrinks only to S=2 (16/4 is below the minimum width 8)."""
    with caplog.at_level("INFO", logger="hydro"):
        assert main(["tune", "--workload", str(workload_file), "--samples", "3", "--fusion", "3", "--scheduler",
                     "none", "--scale", "auto", "--no-ladder", "--top-k", "2", "--storage", str(tmp_path / "runs"),
                     "--name", "top2"]) == 0
    assert "scale='auto': S=2 for the search on cpu (3 fused members, 1 threads)" in caplog.text
    assert "cannot shrink to S=8, S=4" in caplog.text
    assert "transfer stages after the search: 2 at full size" in caplog.text  # no ladder rung, 2 targets
    out = capsys.readouterr().out
    assert "Hydro: 3 members (scale 2, chosen by --scale auto, fusion 3)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("target ")]
    assert len(rows) == 2 and all(row[1] == "target" for row in rows)
