"""Reference: a fill trial trained alone, single-threaded like a fill process."""
import torch

from hydro.bubbles import FillSpec, FillTrial


def train_alone(spec: FillSpec, steps: int) -> FillTrial:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fill processes run single-threaded kernels: bit-comparable results
    try:
        trial = FillTrial(spec)
        for _ in range(steps):
            trial.step()
        return trial
    finally:
        torch.set_num_threads(threads)


def same_state(state: dict, trial: FillTrial) -> bool:
    """``state`` (a checkpoint's model state) equals ``trial``'s weights bit for bit."""
    return all(torch.equal(state[k], v) for k, v in trial.model.state_dict().items())
