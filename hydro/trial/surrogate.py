"""The one place that builds a member model: the user's full-size model, or its µP version (Model Shrinker)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn

from hydro.shrink import shrink


def build_member(model_factory: Callable[[Mapping], nn.Module], config: Mapping, scale: int,
                 mup: bool | None = None, shrink_options: Mapping | None = None) -> nn.Module:
    """``model_factory(config)`` as written (``scale == 1``, no µP), or in µP with its widths divided by
    ``scale`` via ``hydro.shrink``. ``mup`` defaults to ``scale > 1``; ``scale=1, mup=True`` is the full-size
    target of a surrogate run: the model as written (same parameters and function) with the µP shapes through
    which the surrogates' hyperparameters transfer (every multiplier 1). ``shrink_options``: keywords for
    ``hydro.shrink`` (``TuneSpec.shrink_options()``)."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1 (1 = full size), got {scale}")
    model = model_factory(config)
    if not (scale > 1 if mup is None else mup):
        if scale != 1:
            raise ValueError(f"scale={scale} shrinks the model, which needs µP (mup=True)")
        return model
    return shrink(model, scale, **(shrink_options or {}))
