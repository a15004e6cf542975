"""What ``hydro.shrink`` kept at full width, and why: ``model.hydro_shrink_report``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KeptWidth:
    """Widths kept at full size: ``widths`` (``'layer'.field`` names) because of ``cause`` (a layer or
    operation without a shrink rule, or a size the scale cannot divide or would shrink below ``min_width``)."""

    cause: str
    widths: tuple[str, ...]

    def __str__(self) -> str:
        return f"{', '.join(self.widths)} ({self.cause})" if self.widths else self.cause


@dataclass(frozen=True)
class ShrinkReport:
    """The outcome of ``hydro.shrink(model, scale)``: ``kept`` widths (µP treats them as finite dimensions:
    hyperparameters still transfer along the scaled ones) and attention layers whose heads changed."""

    scale: int
    kept: tuple[KeptWidth, ...] = ()
    heads: tuple[str, ...] = field(default=())

    def notice(self) -> str:
        """One message listing what was kept and changed, or ``""`` when every width was scaled."""
        lines = [f"  - {kept}" for kept in self.kept] + [f"  - {change}" for change in self.heads]
        if not lines:
            return ""
        return (f"hydro.shrink: at scale {self.scale}, kept at full width (µP treats these as finite dimensions) "
                f"or changed:\n" + "\n".join(lines) + "\nPass strict=True to get an error instead, or fixed=[...] to "
                "choose the layers kept at full width yourself.")
