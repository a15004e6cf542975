"""Model Shrinker: µP surrogates whose best hyperparameters transfer to the full-width target.

``shrink(model, scale)`` divides the widths of ``model`` by ``scale`` in µP with the target's shapes as the
base; ``hydro.optim`` applies the µP learning-rate/weight-decay multipliers to its parameters automatically,
``mup_param_groups`` does it for plain ``torch.optim`` optimizers.
"""
from .errors import ShrinkError
from .layers import FusedReadout, MuMultiheadAttention, MuTransformerEncoderLayer, Readout
from .mup import MUP_ATTR, MuShape, group_by_multipliers, mup_param_groups
from .shrink import shrink

__all__ = ["MUP_ATTR", "FusedReadout", "MuMultiheadAttention", "MuShape", "MuTransformerEncoderLayer", "Readout",
           "ShrinkError", "group_by_multipliers", "mup_param_groups", "shrink"]
