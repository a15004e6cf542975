"""Model Shrinker: µP surrogates whose best hyperparameters transfer to the full-width target.

``hydro.shrink(model, scale)`` (this package is callable: it is :func:`hydro.shrink.shrink`) divides the
widths of ``model`` by ``scale`` in µP with the target's shapes as the base; ``hydro.optim`` applies the µP
learning-rate/weight-decay multipliers to its parameters automatically, ``mup_param_groups`` does it for
plain ``torch.optim`` optimizers.
"""
import sys
import types

from torch import nn

from .errors import ShrinkError, ShrinkWarning
from .layers import FusedReadout, MuMultiheadAttention, MuTransformerEncoderLayer, Readout
from .mup import MUP_ATTR, MuParameter, MuShape, group_by_multipliers, mup_param_groups
from .report import KeptWidth, ShrinkReport
from .shrink import shrink

__all__ = ["MUP_ATTR", "FusedReadout", "KeptWidth", "MuMultiheadAttention", "MuParameter", "MuShape",
           "MuTransformerEncoderLayer", "Readout", "ShrinkError", "ShrinkReport", "ShrinkWarning",
           "group_by_multipliers", "mup_param_groups", "shrink"]


class _CallablePackage(types.ModuleType):
    """Lets ``hydro.shrink`` be both this package and the function ``hydro.shrink(model, scale)``."""

    def __call__(self, model: nn.Module, scale: int = 8, **options) -> nn.Module:
        return shrink(model, scale, **options)


sys.modules[__name__].__class__ = _CallablePackage
