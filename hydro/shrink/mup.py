"""µP shape information of parameters and the µP rules that follow from it (microsoft/mup's rules).

Each parameter of a shrunk model carries ``param.hydro_mup``, a :class:`MuShape`: per dimension the
target's (base) size if that dimension is a width, else ``None``, and the shrunk size. From it follow the
per-parameter learning-rate and weight-decay multipliers of MuSGD and MuAdam, and µP's initialisation
rescaling. Shapes are a member's shapes: a fused parameter ``[F, ...]`` carries its member's ``MuShape``.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import Readout

MUP_ATTR = "hydro_mup"
RULES = ("sgd", "adam")


@dataclass(frozen=True)
class MuShape:
    """µP shape of one parameter: ``base[i]`` is the target's size of dimension ``i`` if it is a width
    (``None`` if not); ``shape[i]`` is the shrunk size. Like ``mup.InfShape``."""

    base: tuple[int | None, ...]
    shape: tuple[int, ...]

    def mult(self, dim: int) -> float:
        """Width multiplier ``shape/base`` of dimension ``dim`` (1 for a non-width dimension)."""
        base = self.base[dim]
        return 1.0 if base is None else self.shape[dim] / base

    @property
    def ninf(self) -> int:
        """How many dimensions are widths: 0 fixed, 1 vector-like, 2 matrix-like."""
        return sum(b is not None for b in self.base)

    def width_mult(self) -> float:
        """The multiplier of the last width dimension (fan-in for a matrix), as ``InfShape.width_mult``."""
        widths = [i for i, b in enumerate(self.base) if b is not None]
        return self.mult(widths[-1]) if widths else 1.0

    def multipliers(self, rule: str) -> tuple[float, float]:
        """``(lr_mult, wd_mult)`` of MuSGD (``rule='sgd'``) or MuAdam/MuAdamW (``rule='adam'``)."""
        if rule not in RULES:
            raise ValueError(f"µP rule must be one of {RULES}, got {rule!r}")
        if self.ninf > 2:
            raise ValueError(f"µP is defined for at most 2 width dimensions; this parameter has {self.ninf}")
        if rule == "adam":
            m = self.width_mult()
            return (1.0 / m, m) if self.ninf == 2 else (1.0, 1.0)
        if self.ninf == 1:
            m = self.width_mult()
            return m, 1.0 / m
        if self.ninf == 2:
            ratio = self.mult(1) / self.mult(0)  # fan-in multiplier / fan-out multiplier
            return 1.0 / ratio, ratio
        return 1.0, 1.0


class MuParameter(nn.Parameter):
    """A parameter whose attributes (its ``hydro_mup``) survive ``copy.deepcopy``; torch's Parameter drops
    them, so a deep copy of a shrunk model (or ``hydro.unfuse``, which deep-copies) would lose µP."""

    def __deepcopy__(self, memo: dict) -> "MuParameter":
        if id(self) in memo:
            return memo[id(self)]
        result = super().__deepcopy__(memo)
        result.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return result


def as_mu_parameters(model: nn.Module) -> None:
    """Every parameter of ``model`` becomes a :class:`MuParameter` keeping its attributes; one without a
    ``MuShape`` gets an all-fixed one."""
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            mu = MuParameter(param.data, param.requires_grad)
            mu.__dict__.update(param.__dict__)
            if mu_shape(mu) is None:
                setattr(mu, MUP_ATTR, MuShape((None,) * param.dim(), tuple(param.shape)))
            setattr(module, name, mu)  # (not _parameters[name] =: a recurrent layer refreshes its weight list)


def mu_shape(param: Tensor) -> MuShape | None:
    return getattr(param, MUP_ATTR, None)


def group_by_multipliers(params: Iterable[Tensor], rule: str) -> dict[tuple[float, float], list[Tensor]]:
    """Parameters keyed by their µP ``(lr_mult, wd_mult)``; parameters without µP information get (1, 1)."""
    groups: dict[tuple[float, float], list[Tensor]] = {}
    for p in params:
        shape = mu_shape(p)
        groups.setdefault((1.0, 1.0) if shape is None else shape.multipliers(rule), []).append(p)
    return groups


def mup_param_groups(params: Iterable[Tensor], rule: str, lr: float, weight_decay: float = 0.0) -> list[dict]:
    """Parameter groups for a plain ``torch.optim`` optimizer of family ``rule`` ('sgd' or 'adam') with the
    µP learning rates and weight decays set, as MuSGD/MuAdam build them: e.g.
    ``torch.optim.AdamW(mup_param_groups(model.parameters(), 'adam', lr=1e-3, weight_decay=0.1))``."""
    return [{"params": ps, "lr": lr * lr_mult, "weight_decay": weight_decay * wd_mult}
            for (lr_mult, wd_mult), ps in group_by_multipliers(params, rule).items()]


@torch.no_grad()
def rescale_init(module: nn.Module) -> None:
    """µP initialisation from torch's default one (what ``mup.set_base_shapes`` does): the readout's weight and
    bias ×sqrt(width_mult) (unless zero-initialised), every other Linear/Conv bias ×sqrt(fan-in mult), a recurrent
    layer's vector-like parameters (biases, input weights from a fixed-size input) ×sqrt(hidden mult).
    Parameters must already carry their :class:`MuShape`."""
    for sub in module.modules():
        if isinstance(sub, Readout):
            if not sub.zero_init:
                factor = mu_shape(sub.weight).width_mult() ** 0.5
                for p in (sub.weight, sub.bias):
                    if p is not None:
                        p.mul_(factor)
        elif isinstance(sub, (nn.Linear, nn.modules.conv._ConvNd)) and sub.bias is not None:
            sub.bias.mul_(mu_shape(sub.weight).mult(1) ** 0.5)
        elif isinstance(sub, nn.RNNBase):  # torch's init U(±1/sqrt(hidden)) for all: vector-like ones to the base's
            for p in sub.parameters(recurse=False):
                if mu_shape(p).ninf == 1:
                    p.mul_(mu_shape(p).width_mult() ** 0.5)
