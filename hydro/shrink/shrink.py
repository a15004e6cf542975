"""``hydro.shrink``: the µP surrogate of a model, its widths divided by a scale."""
from __future__ import annotations

import copy
from collections.abc import Collection

import torch
from torch import nn

from .errors import ShrinkError
from .mup import MUP_ATTR, MuShape, as_mu_parameters, rescale_init
from .rules import BuildContext, rule_for
from .widths import WidthPlan, analyse, trace


def shrink(model: nn.Module, scale: int = 8, *, min_width: int = 8, readout_zero_init: bool = True,
           fixed: Collection[str] = ()) -> nn.Module:
    """A copy of ``model`` whose width dimensions are divided by ``scale``, in µP with ``model``'s shapes as
    the base, so its best hyperparameters are ``shrink(model, 1)``'s.

    Widths are found by data flow (:mod:`hydro.shrink.widths`); every layer with a width is built anew
    (torch's initialisation, then µP's rescaling), the output layer becomes a :class:`Readout` (input ×
    1/width_mult, zero-initialised unless ``readout_zero_init=False``), attention uses logits / head_dim with
    the head dimension kept and fewer heads. Parameters used directly in forward are sliced. Every parameter
    carries ``hydro_mup`` (:class:`MuShape`), from which ``hydro.optim`` (and ``mup_param_groups`` for torch
    optimizers) take µP learning-rate and weight-decay multipliers. The result is deterministic given the
    model, the scale and torch's RNG state: a checkpoint's ``state_dict`` loads into ``shrink(model, scale)``.
    ``min_width``: smallest width allowed; ``fixed``: module paths kept at full width.
    Raises :class:`ShrinkError` naming the layer and the fix when the model cannot be shrunk.
    """
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
        raise ShrinkError(f"hydro.shrink: scale must be an integer >= 1, got {scale!r}")
    _check_shrinkable(model, fixed)
    traced = copy.deepcopy(model)  # torch.fx stores tensor constants of forward on the module it traces
    plan = analyse(traced, trace(traced), fixed)
    _check_sizes(model, plan, scale, min_width)
    surrogate = copy.deepcopy(model)
    for path in plan.layers:
        _set_module(surrogate, path, _shrunk_layer(model, path, plan, scale, readout_zero_init))
    for name, (group, dim) in plan.tensors.items():
        if plan.scaled(group):
            _slice_tensor(surrogate, name, dim, scale)
    as_mu_parameters(surrogate)
    return surrogate


def _check_shrinkable(model: nn.Module, fixed: Collection[str]) -> None:
    if any(hasattr(p, MUP_ATTR) for p in model.parameters()):
        raise ShrinkError("hydro.shrink: this model is already a shrunk (µP) model. Fix: shrink the full-width "
                          "model with the product of the scales")
    for path in fixed:
        try:
            model.get_submodule(path)
        except AttributeError as error:
            raise ShrinkError(f"hydro.shrink: fixed=[{path!r}] names no submodule of {type(model).__name__}") from error
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    tied = [group for group in names.values() if len(group) > 1]
    if tied:
        raise ShrinkError(f"hydro.shrink: parameters {tied[0]} are one tied tensor; shrinking tied weights is not "
                          f"supported. Fix: untie them (separate parameters) before shrinking")


def _check_sizes(model: nn.Module, plan: WidthPlan, scale: int, min_width: int) -> None:
    for path, fields in plan.layers.items():
        module = model.get_submodule(path)
        sizes = rule_for(module).fields(module)
        for name in plan.scaled_fields(path):
            size = sizes[name]
            if size % scale:
                raise ShrinkError(f"hydro.shrink: width '{name}' = {size} of layer '{path}' "
                                  f"({type(module).__name__}) is not divisible by scale {scale}. Fix: use a scale "
                                  f"that divides it, or a width that is a multiple of {scale}")
            if size // scale < min_width:
                raise ShrinkError(f"hydro.shrink: width '{name}' = {size} of layer '{path}' "
                                  f"({type(module).__name__}) would shrink to {size // scale} < min_width="
                                  f"{min_width}. Fix: a smaller scale, or a smaller min_width")


def _shrunk_layer(model: nn.Module, path: str, plan: WidthPlan, scale: int, readout_zero_init: bool) -> nn.Module:
    """Layer ``path`` built at its shrunk sizes, with µP shapes attached and µP initialisation."""
    template = model.get_submodule(path)
    rule = rule_for(template)
    full = rule.fields(template)
    scaled = plan.scaled_fields(path)
    factory = next((dict(device=t.device, dtype=t.dtype) for t in template.parameters() if t.is_floating_point()), {})
    ctx = BuildContext(scaled, readout_zero_init=readout_zero_init, **factory)
    try:
        layer = rule.build(template, {f: n // scale if f in scaled else n for f, n in full.items()}, ctx)
        # µP shapes the way mup's delta model finds them: a dimension is a width iff doubling the widths changes it
        delta = rule.build(template, {f: 2 * n if f in scaled else n for f, n in full.items()},
                           BuildContext(scaled, device="meta", dtype=ctx.dtype, readout_zero_init=readout_zero_init))
    except ValueError as error:
        raise ShrinkError(f"hydro.shrink: layer '{path}' ({type(template).__name__}): {error}") from error
    base = dict(template.named_parameters())
    wide = dict(delta.named_parameters())
    for name, param in layer.named_parameters():
        dims = tuple(b if b != w else None for b, w in zip(base[name].shape, wide[name].shape))
        setattr(param, MUP_ATTR, MuShape(dims, tuple(param.shape)))
    rescale_init(layer)
    return layer.train(template.training)


@torch.no_grad()
def _slice_tensor(model: nn.Module, name: str, dim: int, scale: int) -> None:
    """Keep the first 1/scale of dimension ``dim`` of parameter or buffer ``name`` (a width)."""
    owner_path, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_path)
    tensor = getattr(owner, attr)
    base = tensor.shape
    sliced = tensor.narrow(dim, 0, base[dim] // scale).clone()
    if isinstance(tensor, nn.Parameter):
        param = nn.Parameter(sliced, tensor.requires_grad)
        setattr(param, MUP_ATTR, MuShape(tuple(n if d == dim else None for d, n in enumerate(base)),
                                         tuple(param.shape)))
        setattr(owner, attr, param)
    else:
        owner.register_buffer(attr, sliced, persistent=attr not in owner._non_persistent_buffers_set)


def _set_module(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent), name, module)
