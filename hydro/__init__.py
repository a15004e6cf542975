"""Hydro: surrogate-based, fused hyperparameter tuning.

``fuse``/``unfuse``/``keep_members`` (Trial Binder), ``hydro.nn`` fused layers, ``hydro.optim`` fused
optimizers, ``trial_losses`` per-member losses, ``plan_fusion`` choice of the fusion count.
"""
from hydro.binder import FusedModel, FuseError, fuse, keep_members, unfuse

__all__ = ["FuseError", "FusedModel", "fuse", "keep_members", "unfuse"]
