"""Hydro: surrogate-based, fused hyperparameter tuning.

``fuse``/``unfuse``/``keep_members`` (Trial Binder), ``hydro.nn`` fused layers, ``hydro.optim`` fused
optimizers, ``trial_losses`` per-member losses, ``plan_fusion`` choice of the fusion count (a
``FusionPlan``), ``shrink`` (Model Shrinker: µP surrogates, see :mod:`hydro.shrink`).
"""
from hydro.binder import FusedModel, FuseError, fuse, keep_members, unfuse
from hydro import shrink  # the Model Shrinker package, callable as hydro.shrink(model, scale)
from hydro.loss import trial_losses
from hydro.fusion_measure import FusionPlan, plan_fusion
from hydro.shrink import ShrinkError, ShrinkWarning

__all__ = ["FuseError", "FusedModel", "FusionPlan", "ShrinkError", "ShrinkWarning", "fuse", "keep_members",
           "plan_fusion", "shrink", "trial_losses", "unfuse"]
