"""The identity of a member of a Hydro search (plain Python): which drawn configuration it trains, at which scale
and with which seed. Its string form ``<config>[@<scale>][#<seed>]`` is what results, member tables and
checkpoints hold and what users see: ``m00007`` (a search member), ``m00007#1`` (its second seed),
``m00007@2`` and ``m00007@2#1`` (a width-ladder member at S=2)."""
from __future__ import annotations

import re
from dataclasses import dataclass

_FORM = re.compile(r"([^@#]+)(?:@([1-9][0-9]*))?(?:#([1-9][0-9]*))?")


@dataclass(frozen=True)
class MemberId:
    """``config``: the id of the search member whose configuration it trains; ``scale``: the width divisor of
    its ladder rung (``None``: a search member, at the search's scale); ``seed``: its seed repeat (0: the first).

    Raises:
        ValueError: ``config`` empty or holding ``@``/``#``, ``scale`` < 1 or ``seed`` < 0.
    """

    config: str
    scale: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.config or "@" in self.config or "#" in self.config:
            raise ValueError(f"MemberId: config must be a non-empty id without '@' or '#', got {self.config!r}")
        if self.scale is not None and not (isinstance(self.scale, int) and self.scale >= 1):
            raise ValueError(f"MemberId: scale must be an int >= 1 or None (the search's), got {self.scale!r}")
        if not (isinstance(self.seed, int) and self.seed >= 0):
            raise ValueError(f"MemberId: seed must be an int >= 0, got {self.seed!r}")

    @classmethod
    def parse(cls, text: str) -> MemberId:
        """The member id written as ``text`` (``str(MemberId.parse(text)) == text``).

        Raises:
            ValueError: ``text`` is not of the form ``<config>[@<scale>][#<seed>]`` (scale and seed >= 1, no
                leading zeros).
        """
        match = _FORM.fullmatch(text) if isinstance(text, str) else None
        if match is None:
            raise ValueError(f"MemberId: {text!r} is not a member id; member ids read <config>[@<scale>][#<seed>], "
                             f"e.g. 'm00007', 'm00007#1', 'm00007@2#1'")
        config, scale, seed = match.groups()
        return cls(config, None if scale is None else int(scale), 0 if seed is None else int(seed))

    def __str__(self) -> str:
        at = "" if self.scale is None else f"@{self.scale}"
        return f"{self.config}{at}{f'#{self.seed}' if self.seed else ''}"

    @property
    def is_search(self) -> bool:
        """Whether it trains at the search's scale (a search member or a seed repeat of one, not a ladder member)."""
        return self.scale is None

    def scale_or(self, search_scale: int) -> int:
        """The scale it trains at: its ladder rung's, else ``search_scale``."""
        return search_scale if self.scale is None else self.scale

    def repeat(self, seed: int) -> MemberId:
        """The member of the same configuration and scale with seed ``seed``."""
        return MemberId(self.config, self.scale, seed)
