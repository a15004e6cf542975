"""GRU and LSTM workloads of a user's file tune through ``hydro tune``: fused µP surrogates at S=4 and S=8 (their
hidden size shrunk), then the full-size target; at S=1 the full-size members fuse too."""
import pandas as pd
import pytest

import hydro
from hydro.cli import main
from hydro.tune.examples import EXAMPLES
from hydro.tune.run import prepare
from tests.tune.recurrent_workload import write_workload

# tiny and quick: four members in fused trials (two per trial on the two CPUs), one epoch; after shrunk surrogates,
# the full-size target straight away (no transfer stages)
QUICK = ["--samples", "4", "--fusion", "4", "--epochs", "1", "--scheduler", "none"]
DIRECT = ["--no-ladder", "--no-escalate", "--probes", "0", "--fallback-targets", "0"]


# each cell kind and each surrogate scale through a whole run once (the run's path is the same at S=4 and S=8; the
# shrunk layers of both kinds at several scales: tests/shrink/test_recurrent.py), and the full-size fused members
@pytest.mark.parametrize("kind, scale", [("gru", 4), ("lstm", 8), ("gru", 1)])
def test_recurrent_workload_tunes_through_hydro_tune(kind, scale, ray_cluster, tmp_path, capsys):
    workload = write_workload(tmp_path)
    code = main(["tune", "--workload", f"{workload}:{kind}", "--scale", str(scale), *QUICK,
                 *(DIRECT if scale > 1 else ()), "--storage", str(tmp_path / "runs"), "--name", kind])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"Hydro: 4 members (scale {scale}, fusion 4)" in out and "best configuration (target, val_acc = " in out
    table = pd.read_csv(tmp_path / "runs" / kind / "hydro_members.csv")
    members = table[table["member"].str.fullmatch(r"m\d{5}")]
    assert len(members) == 4 and (members.groupby("trial").size() == 2).all()  # trained two by two, fused
    assert members["val_acc"].notna().all() and (table["kind"] == "target").sum() == 1


def test_the_bundled_gru_example_passes_the_checks_before_tuning_at_s4_and_s8():
    """``hydro tune --example digits-gru``: the driver's pre-check trains two fused surrogates and the full-size
    target one batch at each scale (no Ray)."""
    spec, space = EXAMPLES["digits-gru"]()
    for scale in (4, 8):
        prepare(spec, space, scale=scale)
        assert hydro.shrink(spec.model({}), scale).rnn.hidden_size == 64 // scale
