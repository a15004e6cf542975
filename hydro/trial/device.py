"""Which device a trial trains on: ``TuneSpec.device`` resolved against the accelerators the trial was given."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

AUTO = "auto"


def resolve_device(requested: str, assigned_gpus: Sequence | None = None) -> torch.device:
    """The device of a trial. ``requested``: ``TuneSpec.device`` (``"auto"``, ``"cpu"``, ``"cuda"``,
    ``"cuda:1"``, ...). ``assigned_gpus``: the GPU ids the scheduler gave the trial (Ray: ``ray.get_gpu_ids()``;
    it also restricts ``CUDA_VISIBLE_DEVICES`` to them, so the first is ``cuda:0``), or ``None`` outside one.

    ``"auto"``: ``cuda:0`` when GPUs were assigned (or, outside a scheduler, when CUDA is available), else
    the CPU; a GPU assigned to a process whose torch cannot use CUDA trains on the CPU with a warning.

    Raises:
        ValueError: more than one GPU was assigned (a fused trial trains on one).
        RuntimeError: a CUDA device was requested but torch cannot use CUDA.
    """
    if requested != AUTO:
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            given = "" if assigned_gpus is None else f" (GPUs assigned to this trial: {list(assigned_gpus)})"
            raise RuntimeError(f"hydro.trial.device: TuneSpec.device={requested!r} but torch cannot use CUDA in "
                               f"this process{given}; request GPUs for the trials (gpus_per_trial) or use "
                               f"device='auto'")
        return device
    if assigned_gpus is not None and len(assigned_gpus) > 1:
        raise ValueError(f"hydro.trial.device: this trial was given GPUs {list(assigned_gpus)}, but a fused trial "
                         f"trains on one GPU and would leave the others idle; give each trial one GPU "
                         f"(gpus_per_trial=1) or a fraction of one")
    wants_gpu = torch.cuda.is_available() if assigned_gpus is None else len(assigned_gpus) > 0
    if wants_gpu and torch.cuda.is_available():
        return torch.device("cuda", 0)
    if wants_gpu:
        logger.warning("hydro.trial.device: GPUs %s were assigned to this trial but torch %s cannot use CUDA; "
                       "training on the CPU", list(assigned_gpus), torch.__version__)
    return torch.device("cpu")
