"""A user's project for the command-line tests: ``my_workload.py`` importing ``user_net.py`` beside it."""
import textwrap
from pathlib import Path

USER_NET = textwrap.dedent('''
    from torch import nn


    class UserNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))

        def forward(self, x):
            return self.body(x)
''')

WORKLOAD = textwrap.dedent('''
    import torch
    from ray import tune
    from torch import nn

    from hydro.examples.data import digits
    from hydro.tune import TuneSpec, accuracy
    from user_net import UserNet  # a module beside this file


    def data():
        train, val = digits()
        return (train.x[:256], train.y[:256]), (val.x[:128], val.y[:128])


    def workload(optimizer=lambda params, config: torch.optim.Adam(params, lr=config["lr"]),
                 space={"lr": tune.loguniform(1e-3, 1e-1)}, metric="val_acc", mode="max"):
        spec = TuneSpec(model=lambda config: UserNet(), data=data, loss=nn.CrossEntropyLoss(), optimizer=optimizer,
                        metric=metric, mode=mode, metrics={"val_acc": accuracy}, epochs=2, batch_size=32)
        return spec, space


    def rmsprop():
        return workload(optimizer=lambda params, config: torch.optim.RMSprop(params, lr=config["lr"]))


    def warmup_cosine():  # Adam with a per-batch linear warm-up (2 batches), then cosine decay
        spec, space = workload()
        spec.lr_scheduler = lambda optimizer, config: torch.optim.lr_scheduler.SequentialLR(
            optimizer, [torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=2),
                        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=14)], milestones=[2])
        spec.lr_scheduler_interval = "batch"
        return spec, space


    def diverging():  # SGD takes a NaN learning rate (Adam refuses it): every member's loss is NaN after one step
        return workload(optimizer=lambda params, config: torch.optim.SGD(params, lr=config["lr"]),
                        space={"lr": float("nan")}, metric="val_loss", mode="min")
''')


def write_project(folder: Path) -> Path:
    """Write the project into ``folder`` (created); returns the workload file's path."""
    folder.mkdir()
    (folder / "user_net.py").write_text(USER_NET)
    (folder / "my_workload.py").write_text(WORKLOAD)
    return folder / "my_workload.py"
