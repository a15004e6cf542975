"""``hydro tune --workload FILE``: a user's file (its own model class, pickled by value to the workers)."""
import textwrap

import ray

from hydro.cli import main

WORKLOAD = textwrap.dedent('''
    import torch
    from ray import tune
    from torch import nn

    from hydro.examples.data import digits
    from hydro.tune import TuneSpec, accuracy


    class UserNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))

        def forward(self, x):
            return self.body(x)


    def data():
        train, val = digits()
        return (train.x[:256], train.y[:256]), (val.x[:128], val.y[:128])


    def workload():
        spec = TuneSpec(model=lambda config: UserNet(), data=data, loss=nn.CrossEntropyLoss(),
                        optimizer=lambda params, config: torch.optim.Adam(params, lr=config["lr"]),
                        metric="val_acc", mode="max", metrics={"val_acc": accuracy}, epochs=2, batch_size=32)
        return spec, {"lr": tune.loguniform(1e-3, 1e-1)}
''')


def test_tune_cli_runs_a_user_workload_file(tmp_path, capsys):
    path = tmp_path / "my_workload.py"
    path.write_text(WORKLOAD)
    try:
        assert main(["tune", "--workload", str(path), "--samples", "3", "--fusion", "3", "--scheduler", "none",
                     "--storage", str(tmp_path / "runs"), "--name", "cli"]) == 0
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    assert "best configuration (target, val_acc = " in out
    assert sum(line.split()[0].startswith("m0000") for line in out.splitlines() if line.strip()) == 3
    assert (tmp_path / "runs" / "cli" / "hydro_members.csv").exists()
    assert (tmp_path / "runs" / "cli" / "hydro_best.json").exists()
