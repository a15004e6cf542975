"""``hydro.shrink``: the µP surrogate of a model, its widths divided by a scale."""
from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field

import torch
from torch import nn

from hydro.binder import FusedModel
from .errors import ShrinkError, ShrinkWarning
from .layers import Readout
from .mup import MUP_ATTR, MuShape, as_mu_parameters, rescale_init
from .report import KeptWidth, ShrinkReport
from .rules import BuildContext, rule_for
from .widths import WidthPlan, analyse, field_size, trace

REPORT_ATTR = "hydro_shrink_report"


def shrink(model: nn.Module, scale: int = 8, *, min_width: int = 8, fixed: Collection[str] = (),
           strict: bool = False, readout_zero_init: bool = False) -> nn.Module:
    """A copy of ``model`` whose width dimensions are divided by ``scale``, in µP with ``model``'s shapes as
    the base, so its best hyperparameters are ``shrink(model, 1)``'s.

    ``shrink(model, 1)`` is ``model`` itself in µP: the same function, parameters and buffers (copies), every µP
    multiplier 1, so training it with ``hydro.optim`` is training ``model``; it draws no random numbers.
    At ``scale > 1`` widths are found by data flow (:mod:`hydro.shrink.widths`); every layer with a width is
    built anew (torch's initialisation, then µP's rescaling; a custom initialisation of ``model`` is not
    carried over), the output layer becomes a :class:`Readout` (input × 1/width_mult; initialised as mup's
    MuReadout, torch's init ×sqrt(width_mult): the scheme of the full-size model's torch init; zero with
    ``readout_zero_init=True``),
    attention keeps the head dimension with fewer heads (narrower heads where the width is not a multiple of it)
    and scales logits by sqrt(full head_dim)/head_dim (torch's 1/sqrt(head_dim) while the head dimension is kept).
    Parameters used directly in forward are sliced. Every parameter carries ``hydro_mup`` (:class:`MuShape`),
    from which ``hydro.optim`` (and ``mup_param_groups`` for torch optimizers) take µP learning-rate and
    weight-decay multipliers. The result is deterministic given the model, the scale and torch's RNG state: a
    checkpoint's ``state_dict`` loads into ``shrink(model, scale)``.

    ``fixed``: module paths kept at full width. Widths coupled to a layer or operation without a shrink
    rule, widths the scale does not divide or would shrink below ``min_width``, and layers that cannot be
    built at the scaled sizes are kept at full width (µP treats them as finite dimensions), listed in one
    :class:`ShrinkWarning` and in ``surrogate.hydro_shrink_report`` (a :class:`ShrinkReport`).
    ``strict=True``: raise :class:`ShrinkError` (naming the layer and the fix) instead of keeping them.
    """
    return shrink_recipe(model, scale, min_width=min_width, fixed=fixed, strict=strict,
                         readout_zero_init=readout_zero_init).surrogate


# Layer types whose construction draws random numbers only in reset_parameters(): rebuilding one is resetting it.
_RESETTABLE = frozenset({nn.Linear, Readout, nn.Conv1d, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm,
                         nn.GroupNorm, nn.Embedding})


@dataclass(frozen=True)
class ShrinkRecipe:
    """What :func:`shrink` returned (``surrogate``) and how it built its layers: per rebuilt layer, in build
    order, its path, its configuration (a copy on the meta device), its shrunk sizes and build context."""

    surrogate: nn.Module
    scale: int
    layers: tuple[tuple[str, nn.Module, dict[str, int], BuildContext], ...]
    _built: dict[str, nn.Module] = field(default_factory=dict, compare=False, repr=False)

    def rebuilt_tensor_names(self) -> set[str]:
        """Qualified names of the surrogate's parameters and buffers held by rebuilt layers."""
        return {f"{path}.{name}" for path, _, _, _ in self.layers
                for name in _all_tensor_names(self.surrogate.get_submodule(path))}

    def materialised(self, device: torch.device | str) -> ShrinkRecipe:
        """The recipe of a model shrunk on the meta device, on ``device``: the surrogate's parameters and buffers
        become zeros there (in place: parameters keep their class and attributes, e.g. µP shapes), and
        :meth:`rebuild` builds the layers there. Draws no random numbers."""
        for module in self.surrogate.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    real = type(param)(torch.zeros(param.shape, dtype=param.dtype, device=device), param.requires_grad)
                    real.__dict__.update(param.__dict__)
                    setattr(module, name, real)
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    module._buffers[name] = torch.zeros(buffer.shape, dtype=buffer.dtype, device=device)
        return ShrinkRecipe(self.surrogate, self.scale, tuple(
            (path, layer, sizes, dataclasses.replace(ctx, device=torch.device(device)))
            for path, layer, sizes, ctx in self.layers))

    @torch.no_grad()
    def rebuild(self) -> dict[str, nn.Module]:
        """The rebuilt layers built again by path (``scale > 1``): torch's initialisation at the shrunk sizes, then
        µP's, drawing from torch's global RNG as :func:`shrink` drew for them after the model's own
        initialisation. Layers of torch types that initialise in ``reset_parameters`` are the same objects at
        every call (reset): read their tensors before the next call. Raises ``ValueError`` at scale 1 (the target
        copies the model's tensors instead)."""
        if self.scale == 1:
            raise ValueError("ShrinkRecipe.rebuild: at scale 1 shrink copies the model's own tensors; nothing to rebuild")
        layers = {}
        for path, template, sizes, ctx in self.layers:
            layer = self._built.get(path)
            if layer is not None:
                layer.reset_parameters()
            else:
                layer = rule_for(template).build(template, sizes, ctx).train(template.training)
                for name, param in layer.named_parameters():
                    setattr(param, MUP_ATTR, getattr(self.surrogate.get_parameter(f"{path}.{name}"), MUP_ATTR))
                if type(layer) in _RESETTABLE:
                    self._built[path] = layer
            rescale_init(layer)
            layers[path] = layer
        return layers


def shrink_recipe(model: nn.Module, scale: int = 8, *, min_width: int = 8, fixed: Collection[str] = (),
                  strict: bool = False, readout_zero_init: bool = False) -> ShrinkRecipe:
    """:func:`shrink` (same arguments, result, warnings and random draws) with how it built its layers."""
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
        raise ShrinkError(f"hydro.shrink: scale must be an integer >= 1, got {scale!r}")
    if not isinstance(min_width, int) or isinstance(min_width, bool) or min_width < 1:
        raise ShrinkError(f"hydro.shrink: min_width must be an integer >= 1, got {min_width!r}")
    if isinstance(fixed, str):
        raise ShrinkError(f"hydro.shrink: fixed must be a collection of module paths, got the string {fixed!r}. "
                          f"Fix: fixed=[{fixed!r}]")
    _check_shrinkable(model, fixed)
    # fx stores forward's tensor constants on the module it traces, and runs forward's code on its buffers (not
    # on its parameters, which it traces as proxies): a copy that holds the model's parameters themselves
    traced = _copy_sharing(model, list(model.parameters()))
    graph = trace(traced)
    fixed_fields: set[tuple[str, str]] = set()
    kept: list[KeptWidth] = []
    widths: set[int] = set()  # the sizes of the widths found first
    while True:  # every round keeps more widths at full size, so this ends
        try:
            plan = analyse(traced, graph, fixed, fixed_fields, keep_unruled=not strict)
        except ShrinkError as error:
            if not kept:
                raise
            raise ShrinkError(_nothing_left(model, scale, min_width, widths, kept)) from error
        widths = widths or {field_size(model, p, f) for p in plan.layers for f in plan.scaled_fields(p)}
        problems = _size_problems(model, plan, scale, min_width)
        if not problems:
            layers, problem = _shrunk_layers(model, plan, scale, readout_zero_init)
            if problem is None:
                break
            problems = [problem]
        if strict:
            raise ShrinkError(problems[0].message)
        for problem in problems:
            fields = {(p, f) for field_ in problem.fields for p, f in plan.members(plan.layers[problem.path][field_])}
            if fields <= fixed_fields:  # another field of the same width group was the cause
                continue
            fixed_fields.update(fields)
            kept.append(KeptWidth(problem.cause, tuple(sorted(f"'{p}'.{f}" for p, f in fields))))
    replaced = [t for path in layers for t in _tensors(model.get_submodule(path))]
    sliced = [_tensor_at(model, name) for name, (group, _) in plan.tensors.items() if plan.scaled(group)]
    surrogate = _copy_sharing(model, [*replaced, *sliced])  # those are rebuilt or sliced copies below
    for path, layer in layers.items():
        _set_module(surrogate, path, layer)
    for name, (group, dim) in plan.tensors.items():
        if plan.scaled(group):
            _slice_tensor(surrogate, name, dim, scale)
    as_mu_parameters(surrogate)
    report = ShrinkReport(scale, tuple(plan.kept + kept), _head_changes(model, surrogate))
    setattr(surrogate, REPORT_ATTR, report)
    if report.notice() and scale > 1:  # at scale 1 (the full-size target) nothing is scaled, so nothing to say
        warnings.warn(report.notice(), ShrinkWarning, stacklevel=4)  # the caller of hydro.shrink(...)
    return ShrinkRecipe(surrogate, scale, tuple((path, *_layer_build(model, path, plan, scale, readout_zero_init))
                                                for path in layers))


@dataclass(frozen=True)
class _Problem:
    """Scaled ``fields`` of layer ``path`` that cannot be scaled: a short ``cause`` and the strict error."""

    path: str
    fields: tuple[str, ...]
    cause: str
    message: str


def _nothing_left(model: nn.Module, scale: int, min_width: int, widths: set[int], kept: list[KeptWidth]) -> str:
    """The error for a model all of whose widths had to be kept at full size at ``scale``: the causes, then the
    fix (the scales up to 16 that divide every width of ``widths`` without going below ``min_width``)."""
    causes = ", ".join(dict.fromkeys(k.cause for k in kept))
    working = [str(s) for s in range(2, 17) if s != scale and all(n % s == 0 and n // s >= min_width for n in widths)]
    divisor = f"a scale that divides its widths ({', '.join(working)}), or " if working else ""
    return (f"hydro.shrink: at scale {scale}, {type(model).__name__} has no width left to shrink ({causes}). Fix: "
            f"{divisor}full size (scale=1; hydro tune --scale 1). Kept at full size: {'; '.join(map(str, kept))}")


def _check_shrinkable(model: nn.Module, fixed: Collection[str]) -> None:
    if not isinstance(model, nn.Module):
        raise ShrinkError(f"hydro.shrink: model must be an nn.Module, got {type(model).__name__}")
    if isinstance(model, FusedModel):
        raise ShrinkError("hydro.shrink: this model is fused (hydro.fuse); shrink the members, then fuse them. "
                          "Fix: hydro.fuse([hydro.shrink(m, scale) for m in models])")
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


def _size_problems(model: nn.Module, plan: WidthPlan, scale: int, min_width: int) -> list[_Problem]:
    """Scaled widths the scale does not divide or would shrink below ``min_width``."""
    problems = []
    for path in plan.layers:
        module = model.get_submodule(path)
        sizes = rule_for(module).fields(module)
        for name in sorted(plan.scaled_fields(path)):
            size = sizes[name]
            where = f"width '{name}' = {size} of layer '{path}' ({type(module).__name__})"
            if size % scale:
                problems.append(_Problem(path, (name,), f"{size} is not divisible by scale {scale}",
                                         f"hydro.shrink: {where} is not divisible by scale {scale}. Fix: use a scale "
                                         f"that divides it, a width that is a multiple of {scale}, or keep the "
                                         f"layer at full width with fixed=[{path!r}]"))
            elif size // scale < min_width:
                problems.append(_Problem(path, (name,), f"{size} would shrink to {size // scale} < min_width="
                                                        f"{min_width}",
                                         f"hydro.shrink: {where} would shrink to {size // scale} < min_width="
                                         f"{min_width}. Fix: a smaller scale, or a smaller min_width"))
    return problems


def _shrunk_layers(model: nn.Module, plan: WidthPlan, scale: int,
                   readout_zero_init: bool) -> tuple[dict[str, nn.Module], _Problem | None]:
    """Every layer with a width built at its scaled sizes, or the first layer that cannot be."""
    layers = {}
    for path in plan.layers:
        try:
            layers[path] = _shrunk_layer(model, path, plan, scale, readout_zero_init)
        except ShrinkError as error:
            if not plan.scaled_fields(path):
                raise
            cause = f"layer '{path}' ({type(model.get_submodule(path)).__name__}) cannot be built at the scaled sizes"
            return layers, _Problem(path, tuple(sorted(plan.scaled_fields(path))), cause, str(error))
    return layers, None


def _head_changes(model: nn.Module, surrogate: nn.Module) -> tuple[str, ...]:
    """Attention layers whose heads had to become narrower than the full model's."""
    changes = []
    for path, attn in model.named_modules():
        small = surrogate.get_submodule(path) if isinstance(attn, nn.MultiheadAttention) else None
        if isinstance(small, nn.MultiheadAttention) and small.head_dim != attn.head_dim:
            changes.append(f"attention '{path}': {attn.num_heads} heads of {attn.head_dim} -> {small.num_heads} "
                           f"head(s) of {small.head_dim} (width {small.embed_dim} is not a multiple of "
                           f"{attn.head_dim})")
    return tuple(changes)


def _shrunk_layer(model: nn.Module, path: str, plan: WidthPlan, scale: int, readout_zero_init: bool) -> nn.Module:
    """Layer ``path`` built at its shrunk sizes, with µP shapes attached and µP initialisation; at scale 1, with
    copies of the model's own parameters and buffers instead (all µP multipliers are 1 there)."""
    template = model.get_submodule(path)
    rule = rule_for(template)
    full = rule.fields(template)
    scaled = plan.scaled_fields(path)
    _, sizes, ctx = _layer_build(model, path, plan, scale, readout_zero_init, configuration=False)
    try:
        # at scale 1 built on the meta device (no initialisation, no random draws), then given the model's state
        layer = rule.build(template, sizes, ctx if scale > 1 else dataclasses.replace(ctx, device="meta"))
        # µP shapes the way mup's delta model finds them: a dimension is a width iff doubling the widths changes it
        delta = rule.build(template, {f: 2 * n if f in scaled else n for f, n in full.items()},
                           dataclasses.replace(ctx, device="meta"))
    except ValueError as error:
        raise ShrinkError(f"hydro.shrink: layer '{path}' ({type(template).__name__}): {error}") from error
    if scale == 1:
        _copy_state(template, layer)
    base = dict(template.named_parameters())
    wide = dict(delta.named_parameters())
    for name, param in layer.named_parameters():
        dims = tuple(b if b != w else None for b, w in zip(base[name].shape, wide[name].shape))
        setattr(param, MUP_ATTR, MuShape(dims, tuple(param.shape)))
    if scale > 1:
        rescale_init(layer)
    return layer.train(template.training)


def _layer_build(model: nn.Module, path: str, plan: WidthPlan, scale: int, readout_zero_init: bool, *,
                 configuration: bool = True) -> tuple[nn.Module | None, dict[str, int], BuildContext]:
    """How layer ``path`` is built shrunk: its configuration (with ``configuration``: a copy holding meta tensors;
    else ``None``), its shrunk sizes and its build context."""
    template = model.get_submodule(path)
    scaled = plan.scaled_fields(path)
    sizes = {f: n // scale if f in scaled else n for f, n in rule_for(template).fields(template).items()}
    factory = next((dict(device=t.device, dtype=t.dtype) for t in template.parameters() if t.is_floating_point()), {})
    ctx = BuildContext(scaled, readout_zero_init=readout_zero_init and scale > 1, **factory)
    if not configuration:
        return None, sizes, ctx
    memo = {id(t): nn.Parameter(t.to("meta"), t.requires_grad) if isinstance(t, nn.Parameter) else t.to("meta")
            for t in _tensors(template)}
    return copy.deepcopy(template, memo), sizes, ctx


def _all_tensor_names(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_parameters()] + [name for name, _ in module.named_buffers()]


def _copy_state(template: nn.Module, layer: nn.Module) -> None:
    """Give ``layer`` (built on the meta device at ``template``'s sizes) copies of ``template``'s parameters and
    buffers, non-persistent ones included (rules keep torch's names)."""
    source = dict(template.named_parameters()) | dict(template.named_buffers())
    names = _all_tensor_names(layer)
    if sorted(names) != sorted(source):
        raise ShrinkError(f"hydro.shrink: the rebuilt {type(layer).__name__} has tensors {sorted(names)} where "
                          f"{type(template).__name__} has {sorted(source)}; its shrink rule must keep torch's names")
    for name, tensor in [*layer.named_parameters(), *layer.named_buffers()]:  # not to_empty: it imports sympy
        _set_tensor(layer, name, tensor, source[name].detach().clone())


@torch.no_grad()
def _slice_tensor(model: nn.Module, name: str, dim: int, scale: int) -> None:
    """Keep the first 1/scale of dimension ``dim`` of parameter or buffer ``name`` (a width)."""
    tensor = _tensor_at(model, name)
    base = tensor.shape
    new = _set_tensor(model, name, tensor, tensor.narrow(dim, 0, base[dim] // scale).clone())
    if isinstance(new, nn.Parameter):
        setattr(new, MUP_ATTR, MuShape(tuple(n if d == dim else None for d, n in enumerate(base)), tuple(new.shape)))


def _set_tensor(model: nn.Module, name: str, old: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """Put ``value`` where ``model`` holds ``old`` under ``name``: a parameter as ``old`` requires grad, else a
    buffer as persistent as ``old``; returns what it put."""
    owner_path, _, attr = name.rpartition(".")
    owner = model.get_submodule(owner_path)
    if isinstance(old, nn.Parameter):
        value = nn.Parameter(value, old.requires_grad)
        setattr(owner, attr, value)
    else:
        owner.register_buffer(attr, value, persistent=attr not in owner._non_persistent_buffers_set)
    return value


def _tensor_at(model: nn.Module, name: str) -> torch.Tensor:
    """The tensor attribute ``name`` (a dotted path) of ``model``."""
    owner_path, _, attr = name.rpartition(".")
    return getattr(model.get_submodule(owner_path), attr)


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers of ``module`` and its submodules."""
    return [*module.parameters(), *module.buffers()]


def _copy_sharing(model: nn.Module, shared: list[torch.Tensor]) -> nn.Module:
    """A deep copy of ``model`` that holds the ``shared`` tensors themselves instead of copies: tensors the copy
    only reads or that are replaced in it, so a full-size model's weights are not copied to be thrown away."""
    return copy.deepcopy(model, {id(tensor): tensor for tensor in shared})


def _set_module(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent), name, module)
