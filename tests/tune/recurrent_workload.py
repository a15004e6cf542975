"""A user's recurrent workloads for the command-line tests: a GRU and an LSTM reading digits row by row."""
import textwrap
from pathlib import Path

WORKLOAD = textwrap.dedent('''
    import torch
    from ray import tune
    from torch import nn

    from hydro.examples.data import digits
    from hydro.tune import TuneSpec, accuracy


    class RowReader(nn.Module):
        """A digit read row by row, ``[N, 8, 8] -> [N, 10]``: a recurrent layer, a readout of its last output."""

        def __init__(self, kind):
            super().__init__()
            self.rnn = getattr(nn, kind)(8, 64, batch_first=True)
            self.head = nn.Linear(64, 10)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])


    def data():
        train, val = digits()
        return (train.x[:256].view(-1, 8, 8), train.y[:256]), (val.x[:128].view(-1, 8, 8), val.y[:128])


    def workload(kind):
        spec = TuneSpec(model=lambda config: RowReader(kind), data=data, loss=nn.CrossEntropyLoss(),
                        optimizer=lambda params, config: torch.optim.Adam(params, lr=config["lr"]), metric="val_acc",
                        mode="max", metrics={"val_acc": accuracy}, epochs=2, batch_size=32)
        return spec, {"lr": tune.loguniform(1e-3, 1e-1)}


    def gru():
        return workload("GRU")


    def lstm():
        return workload("LSTM")
''')


def write_workload(folder: Path) -> Path:
    """Write the workload file into ``folder``; returns its path."""
    path = folder / "recurrent_workload.py"
    path.write_text(WORKLOAD)
    return path
