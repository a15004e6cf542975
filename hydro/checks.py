"""Precondition checks of public entry points: one ``ValueError`` naming the argument (after a prefix naming its
owner), its value and the rule it breaks, e.g. ``plan_fusion: steps must be an int >= 1 (timed steps per count),
got 0`` or ``TuneSpec.epochs must be an int >= 1, got 0``."""
from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

from torch import Tensor

Rule = tuple[str, Any, Callable[[Any], Any], str]  # (name, value, ok(value) -> bool or bool tensor, the rule)


def is_count(value: Any, low: int = 1) -> bool:
    """``value`` is an ``int`` (not a ``bool``) >= ``low``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def is_whole(value: Any) -> bool:
    """``value`` is an integer number: an ``int`` (not a ``bool``), a numpy integer or an integer-valued float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return isinstance(value, numbers.Integral) or float(value).is_integer()


def check(prefix: str, *rules: Rule) -> None:
    """Raise ``ValueError`` ``f"{prefix}{name} must be {rule}, got {value}"`` for the first rule whose
    ``ok(value)`` is false (for a tensor: anywhere) or raises ``TypeError`` (e.g. a string where a number belongs)."""
    for name, value, ok, rule in rules:
        try:
            result = ok(value)
            good = bool(result.all()) if isinstance(result, Tensor) else bool(result)
        except TypeError:
            good = False
        if not good:
            shown = value.tolist() if isinstance(value, Tensor) else repr(value)
            raise ValueError(f"{prefix}{name} must be {rule}, got {shown}")
