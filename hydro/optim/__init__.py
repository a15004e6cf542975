"""Fused optimizers and LR schedulers: hyperparameters are scalars or one value per member."""
from . import lr_scheduler
from .adam import Adam, AdamW
from .base import FusedOptimizer
from .clip import clip_grad_norm_
from .sgd import SGD

__all__ = ["SGD", "Adam", "AdamW", "FusedOptimizer", "clip_grad_norm_", "lr_scheduler"]
