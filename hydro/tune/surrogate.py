"""The one place that builds a member model: the user's full-size model, or its µP surrogate (Model Shrinker)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

from torch import nn


def build_member(model_factory: Callable[[Mapping], nn.Module], config: Mapping, scale: int) -> nn.Module:
    """``model_factory(config)`` for ``scale == 1``; its widths divided by ``scale`` (µP, via ``hydro.shrink``)
    otherwise."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1 (1 = full size), got {scale}")
    model = model_factory(config)
    if scale == 1:
        return model
    import hydro

    shrink = getattr(hydro, "shrink", None)
    if shrink is None:
        raise RuntimeError(f"scale={scale} needs the Model Shrinker (hydro.shrink), which this installation of "
                           "Hydro does not have; use scale=1 (fusion only)")
    return shrink(model, scale=scale)
