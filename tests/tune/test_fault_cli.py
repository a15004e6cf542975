"""``hydro tune``'s fault handling without a run: a run that ends without its full-size target exits 1 with one
line saying so (unless --no-target asked for none); the flags parse."""
from __future__ import annotations

import pytest

from hydro.cli import build_parser
from hydro.tune import cli


def parsed(*argv):
    return build_parser().parse_args(["tune", "--example", "digits-mlp", *argv])


@pytest.mark.parametrize("kind, with_target, code", [("target", True, 0), ("surrogate", True, 1),
                                                     ("surrogate", False, 0)])
def test_a_run_without_its_target_exits_1_unless_none_was_asked_for(kind, with_target, code, monkeypatch, capsys):
    monkeypatch.setattr(cli, "best_configuration", lambda results, spec: {"kind": kind})
    results = type("Results", (), {"experiment_path": "/runs/digits"})()
    assert cli._target_missing(results, None, parsed(), with_target) == code
    err = capsys.readouterr().err.strip()
    if code:
        assert err.startswith("hydro tune: the run ended without its full-size target: the configuration above is "
                              "a surrogate's") and len(err.splitlines()) == 1
        assert "hydro tune --example digits-mlp --resume /runs/digits" in err
    else:
        assert err == ""


def test_fault_flags_parse():
    args = parsed("--max-failures", "3", "--resume", "/runs/x", "--no-target")
    assert (args.max_failures, args.resume, args.no_target) == (3, "/runs/x", True)
    assert parsed().max_failures == 1 and not parsed().no_target


def test_joining_a_cluster_without_authentication_warns_and_a_refused_join_is_one_line(monkeypatch, caplog):
    import ray
    from ray._private.authentication import authentication_token_setup, authentication_utils

    from hydro.cli_options import UsageError

    def refused(address=None, **kwargs):
        raise ConnectionError("Could not read 'session_name' from GCS\nafter 28 s of retries\n...")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cli, "_reachable", lambda address: None)
    monkeypatch.setattr(cli, "token_refused", lambda address: False)
    monkeypatch.setattr(authentication_token_setup, "maybe_enable_token_auth_if_token_available", lambda **kw: False)
    monkeypatch.setattr(authentication_utils, "is_token_auth_enabled", lambda: False)
    monkeypatch.setattr(ray, "init", refused)
    with caplog.at_level("WARNING", "hydro.tune.cli"), pytest.raises(UsageError) as error:
        cli.connect("127.0.0.5:6379")
    assert "joining the Ray cluster at 127.0.0.5:6379 without authentication" in caplog.text
    assert str(error.value) == ("hydro tune: could not join the Ray cluster at 127.0.0.5:6379 (ConnectionError: Could "
                                "not read 'session_name' from GCS); if it uses token authentication, put its token in "
                                "~/.ray/auth_token or $RAY_AUTH_TOKEN")


def test_no_target_then_resume_on_the_command_line(ray_cluster, workload_file, tmp_path, capsys):
    import json

    from hydro.cli import main

    common = ["tune", "--workload", str(workload_file), "--scheduler", "none", "--storage", str(tmp_path / "runs")]
    assert main([*common, "--samples", "2", "--fusion", "2", "--no-target", "--name", "search"]) == 0
    best = json.loads((tmp_path / "runs" / "search" / "hydro_best.json").read_text())
    assert best["kind"] == "fused"  # a fused full-size member's (--scale 1)
    (tmp_path / "runs" / "search" / "hydro_best.json").unlink()
    assert main([*common, "--resume", str(tmp_path / "runs" / "search")]) == 0  # finished: its results again
    assert json.loads((tmp_path / "runs" / "search" / "hydro_best.json").read_text()) == best
    assert "the run ended without its full-size target" not in capsys.readouterr().err
