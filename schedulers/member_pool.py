"""The member pool of a Hydro search (plain Python): members are drawn from a searcher's suggestions under
their own ids, buffered by group key (members that may share one fused trial), and handed out as fused groups
of the size the fusion planner chose for their group."""
from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

Member = tuple[str, dict]  # (member id, configuration)


class Suggestion(enum.Enum):
    """What a searcher answers instead of a configuration (Ray's ``Searcher.suggest`` outcomes)."""

    NOT_NOW = "not_now"    # nothing to suggest right now (e.g. a concurrency limit); ask again later
    FINISHED = "finished"  # the searcher will suggest nothing more
    REJECTED = "rejected"  # the member's configuration cannot train: it takes its id and joins no group


def member_id(index: int) -> str:
    """The id of the ``index``-th drawn member: ``m00000``, ``m00001``, ..."""
    return f"m{index:05d}"


@dataclass
class MemberPool:
    """Draws up to ``num_samples`` members; a group holds at most ``max_fusion`` members.

    ``draw(suggest, key_of, fusion_of)`` fills buffers until one group is full (or the searcher has nothing
    now) and returns a group to start: the first full one, else the largest partial one. ``suggest(member_id)``
    returns a configuration or a :class:`Suggestion`; ``key_of(config)`` the group key; ``fusion_of(key,
    config)`` the planned fusion count of that group (asked once per key).
    """

    num_samples: int
    max_fusion: int
    configs: dict[str, dict] = field(default_factory=dict)
    buffers: dict[Hashable, list[Member]] = field(default_factory=dict)
    fusion: dict[Hashable, int] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    source_finished: bool = False

    def __post_init__(self) -> None:
        for name, what in (("num_samples", "member configurations"), ("max_fusion", "members per fused trial")):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} ({what}) must be an int >= 1, got {value!r}")

    @property
    def drawn(self) -> int:
        return len(self.configs) + len(self.rejected)

    @property
    def exhausted(self) -> bool:
        """No member is left to draw or waiting in a buffer."""
        return (self.source_finished or self.drawn >= self.num_samples) and not self.buffers

    def draw(self, suggest: Callable[[str], dict | Suggestion], key_of: Callable[[dict], Hashable],
             fusion_of: Callable[[Hashable, dict], int]) -> list[Member]:
        """The next group to start (empty if there is none now)."""
        for _ in range(self.max_fusion):
            full = [k for k, b in self.buffers.items() if len(b) >= self._size(k, b[0][1], fusion_of)]
            if full:
                return self._take(full[0], fusion_of)
            if self.source_finished or self.drawn >= self.num_samples:
                break
            member = member_id(self.drawn)
            config = suggest(member)
            if config is Suggestion.NOT_NOW:
                break
            if config is Suggestion.FINISHED:
                self.source_finished = True
                break
            if config is Suggestion.REJECTED:
                self.rejected.append(member)
                continue
            self.configs[member] = config
            self.buffers.setdefault(key_of(config), []).append((member, config))
        if not self.buffers:
            return []
        return self._take(max(self.buffers, key=lambda k: len(self.buffers[k])), fusion_of)

    def _size(self, key: Hashable, config: dict, fusion_of: Callable[[Hashable, dict], int]) -> int:
        if key not in self.fusion:
            self.fusion[key] = max(1, min(self.max_fusion, fusion_of(key, config)))
        return self.fusion[key]

    def _take(self, key: Hashable, fusion_of: Callable[[Hashable, dict], int]) -> list[Member]:
        buffer = self.buffers[key]
        count = self._size(key, buffer[0][1], fusion_of)
        taken, rest = buffer[:count], buffer[count:]
        if rest:
            self.buffers[key] = rest
        else:
            del self.buffers[key]
        return taken
