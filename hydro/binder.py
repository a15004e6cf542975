"""Trial Binder: ``F`` models of one architecture trained as one fused model, and back.

``fuse`` traces the members with torch.fx, checks they share one architecture, replaces every layer by
its fused twin (``hydro.nn``) holding the members' weights stacked along a leading trial dimension, and
rewrites the functions the forward calls so they act member by member. The fused model takes the
members' shared batch ``[N, ...]`` and returns ``[F, N, ...]``; its ``state_dict`` has the members' keys
with every tensor stacked, so member ``i`` is ``{k: v[i]}``.

The members themselves are never changed: they are traced as copies, once in training and once in eval
mode (``fused.train()``/``fused.eval()`` switch between the two graphs, so ``if self.training:`` branches
are right in both). A submodule whose forward updates its own buffers or parameters in place is run
member by member (exact); state changes that cannot be kept per member are refused with a ``FuseError``.
"""
from __future__ import annotations

import copy
import enum
import inspect
import operator
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.fx
from torch import Tensor, nn
from torch.fx import Node
from torch.nn.utils import parametrize

from hydro.nn import functional as trialwise_fn
from hydro.nn.base import expand_members
from hydro.nn.registry import ELEMENTWISE, RANDOM, all_tensors, fuse_layer, is_registered, load_stacked
from hydro.nn.vmap import VmapModule, mirror

_TRACE_HELP = (
    "The usual cause is Python control flow on tensor values (if/for/while on a tensor, len() or .item() "
    "of a tensor) in forward. Fix: make that code static, or move it into its own submodule and pass that "
    "submodule's class in `hydro.fuse(..., leaf_modules=[ThatClass])`: it is then fused as a whole with "
    "torch.vmap, or run member by member where vmap cannot run it (exact, slower)."
)


class FuseError(ValueError):
    """Models cannot be fused: they differ in architecture, or torch.fx cannot trace them."""


class FusedModel(nn.Module):
    """``num_members`` models in one module. ``forward`` takes what one member takes (a batch shared by all
    members, or ``[F, N, ...]`` per member if fused with ``fused_inputs=True``) and returns the members'
    outputs stacked: ``[F, N, ...]``. ``member_ids`` names the members that remain after slicing;
    ``fallbacks`` maps layers fused with the generic vmap fallback (or run member by member) to the reason;
    ``graphs`` holds the rewritten graph of each training mode (``True``: train, ``False``: eval)."""

    def __init__(self, num_members: int) -> None:
        super().__init__()
        self.num_members = num_members
        self.member_ids: list[int] = list(range(num_members))
        self.fallbacks: dict[str, str] = {}
        self.graphs: dict[bool, torch.fx.Graph] = {}

    def forward(self, *args, **kwargs):
        return self._forward_fns[self.training](self, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}"


def fuse(models: Sequence[nn.Module], *, leaf_modules: Iterable[type[nn.Module]] = (),
         fused_inputs: bool = False) -> FusedModel:
    """Fuse independently built models of one architecture (each keeps its own weights; none is changed).

    ``leaf_modules``: classes fused as a whole with ``torch.vmap`` instead of being traced into.
    ``fused_inputs``: the fused model takes per-member inputs ``[F, N, ...]`` instead of a shared batch.
    """
    if isinstance(models, nn.Module):
        raise FuseError(f"hydro.fuse takes a list of models, got one {type(models).__name__}. "
                        f"Fix: hydro.fuse([model_0, model_1, ...]), each member its own model")
    models = list(models)
    if not models:
        raise FuseError("hydro.fuse needs at least one model, got an empty sequence")
    for i, model in enumerate(models):
        if not isinstance(model, nn.Module):
            raise FuseError(f"hydro.fuse: member {i} is a {type(model).__name__}, not an nn.Module")
        _check_no_hooks(model, i)
    tracer_leaves = leaf_module_types(leaf_modules, "hydro.fuse")
    first, per_member = _trace_until_stateless(models[0], tracer_leaves)
    is_leaf = _leaf_predicate(tracer_leaves, frozenset(per_member))
    # The other members only need their graphs (their architecture must equal member 0's, checked below).
    traces = [first] + [_trace_modes(m, is_leaf, detect=False)[0] for m in models[1:]]
    for mode in (True, False):
        _check_same_architecture(models, [t.graphs[mode] for t in traces], is_leaf)
        _check_same_constants([t.constants[mode] for t in traces])
    return _build(models, first, is_leaf, per_member, fused_inputs)


def fuse_template(template: nn.Module, num_members: int, *, leaf_modules: Iterable[type[nn.Module]] = ()
                  ) -> FusedModel:
    """``num_members`` members of ``template``'s architecture fused as :func:`fuse` fuses them, from one trace of
    ``template``: every member holds ``template``'s tensors (parameters keep their attributes, e.g. µP shapes),
    to be overwritten with each member's own (``all_tensors(fused)[name][i]``). For members known to share one architecture
    (e.g. built from one template), where :func:`fuse` would trace and compare every member."""
    _check_member_count(num_members, "hydro.binder.fuse_template")
    return trace_template(template, leaf_modules=leaf_modules).fuse(num_members)


def _check_member_count(num_members: int, owner: str) -> None:
    if isinstance(num_members, bool) or not isinstance(num_members, int) or num_members < 1:
        raise FuseError(f"{owner}: needs num_members >= 1, got {num_members!r}")


@dataclass(frozen=True)
class TracedTemplate:
    """One member architecture traced for fusing (:func:`trace_template`), for any number of members."""

    template: nn.Module
    traced: _Traced
    tracer_leaves: tuple[type[nn.Module], ...]
    per_member: dict[str, str]

    def fuse(self, num_members: int) -> FusedModel:
        """As :func:`fuse_template` (``template`` itself is not traced again)."""
        _check_member_count(num_members, "hydro.binder.TracedTemplate.fuse")
        return _build([self.template] * num_members, self.traced,
                      _leaf_predicate(self.tracer_leaves, frozenset(self.per_member)), self.per_member,
                      fused_inputs=False)


def trace_template(template: nn.Module, *, leaf_modules: Iterable[type[nn.Module]] = ()) -> TracedTemplate:
    """``template`` traced once for :func:`fuse_template` (its ``fuse(n)`` fuses ``n`` members of it: the members
    hold ``template``'s tensors as they are at that call)."""
    if not isinstance(template, nn.Module):
        raise FuseError(f"hydro.binder.trace_template: needs an nn.Module, got {type(template).__name__}")
    _check_no_hooks(template, 0)
    tracer_leaves = leaf_module_types(leaf_modules, "hydro.fuse")
    traced, per_member = _trace_until_stateless(template, tracer_leaves)
    return TracedTemplate(template, traced, tracer_leaves, per_member)


def leaf_module_types(leaf_modules: Iterable[type[nn.Module]], owner: str) -> tuple[type[nn.Module], ...]:
    """``leaf_modules`` as a tuple of ``nn.Module`` classes; ``owner`` (e.g. ``"hydro.fuse"``) names the caller
    in the ``FuseError`` for anything else (a common slip: an instance instead of its class)."""
    leaves = tuple(leaf_modules)
    for leaf in leaves:
        if not (isinstance(leaf, type) and issubclass(leaf, nn.Module)):
            name = type(leaf).__name__
            fix = f"pass the class: leaf_modules=[{name}]" if isinstance(leaf, nn.Module) else "pass nn.Module classes"
            raise FuseError(f"{owner}: leaf_modules must be nn.Module classes, got {leaf!r}. Fix: {fix}")
    return leaves


def _require_fused(fused: FusedModel, owner: str) -> None:
    if not isinstance(fused, FusedModel):
        raise TypeError(f"{owner} needs the FusedModel that hydro.fuse returned, got {type(fused).__name__}")


def unfuse(fused: FusedModel) -> list[nn.Module]:
    """The members as independent modules of the original class, holding their current weights."""
    _require_fused(fused, "hydro.unfuse")
    template = fused._template[0]
    state = fused.state_dict()
    device = next((t.device for t in state.values()), torch.device("cpu"))
    members = []
    fused_params = dict(fused.named_parameters(remove_duplicate=False))
    for i in range(fused.num_members):
        member = copy.deepcopy(template).to(device)
        member.load_state_dict({k: v[i] for k, v in state.items()})
        for name, param in member.named_parameters(remove_duplicate=False):  # e.g. µP shapes (deepcopy drops them)
            param.__dict__.update(fused_params[name].__dict__)
        members.append(member.train(fused.training))
    return members


@torch.no_grad()
def keep_members(fused: FusedModel, members: Sequence[int], optimizer=None, schedulers: Iterable = ()) -> None:
    """Keep only ``members`` (positions in the current fused model), in place, with their weights, running
    statistics, gradients and — when given — optimizer state and LR-scheduler state. Every argument is checked
    before anything is sliced."""
    _require_fused(fused, "hydro.keep_members")
    index = _member_index(members, fused.num_members)
    schedulers = list(schedulers)
    _check_optimizer(fused, optimizer, schedulers)
    seen: set[int] = set()
    for module in fused.modules():
        for name, param in module._parameters.items():
            if param is not None and id(param) not in seen:
                seen.add(id(param))
                param.data = param.data.index_select(0, index.to(param.device))
                if param.grad is not None:
                    param.grad = param.grad.index_select(0, index.to(param.device))
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.index_select(0, index.to(buf.device))
        if hasattr(module, "num_members"):
            module.num_members = len(index)
    fused.member_ids = [fused.member_ids[i] for i in index.tolist()]
    if optimizer is not None:
        optimizer.keep_members(index)
    for scheduler in schedulers:
        scheduler.keep_members(index)


def _member_index(members: Sequence[int], count: int) -> Tensor:
    given = list(members)
    try:  # integers of any kind (numpy, 0-d tensors), never floats or bools
        positions = [operator.index(m) for m in given if not isinstance(m, bool)]
    except TypeError:
        positions = []
    if not positions or len(positions) != len(given) or len(set(positions)) != len(positions) \
            or not all(0 <= m < count for m in positions):
        raise ValueError(f"hydro.keep_members: members must be distinct positions (ints) in [0, {count}), "
                         f"got {given}")
    return torch.tensor(positions, dtype=torch.long)


def _check_optimizer(fused: FusedModel, optimizer, schedulers: list) -> None:
    """The optimizer must be a ``hydro.optim`` one over ``fused``'s parameters with as many members, and each
    scheduler a ``hydro.optim.lr_scheduler`` one of that optimizer (else slicing would leave them out of step)."""
    owner = "hydro.keep_members"
    if optimizer is not None:
        if not hasattr(optimizer, "keep_members"):
            raise TypeError(f"{owner}: optimizer must be a hydro.optim optimizer (its state is sliced per member), "
                            f"got {type(optimizer).__module__}.{type(optimizer).__name__}")
        own = {id(p) for p in fused.parameters()}
        if any(id(p) not in own for group in optimizer.param_groups for p in group["params"]):
            raise ValueError(f"{owner}: the optimizer holds parameters that are not this fused model's; pass the "
                             f"optimizer built on this model's parameters")
        if optimizer.num_members != fused.num_members:
            raise ValueError(f"{owner}: the optimizer holds {optimizer.num_members} members, the model "
                             f"{fused.num_members}; slice them together, in the same keep_members call")
    for scheduler in schedulers:
        if not hasattr(scheduler, "keep_members"):
            raise TypeError(f"{owner}: schedulers must be hydro.optim.lr_scheduler schedulers, got "
                            f"{type(scheduler).__module__}.{type(scheduler).__name__}")
        if optimizer is None or scheduler.optimizer is not optimizer:
            raise ValueError(f"{owner}: {type(scheduler).__name__} schedules another optimizer than the one given; "
                             f"pass the optimizer it schedules too")


# --- tracing and checks -------------------------------------------------------------------------------

class _Tracer(torch.fx.Tracer):
    """torch.fx's tracer with our leaves; also records which modules' forward switch gradient recording
    (``torch.no_grad()``, ``enable_grad``, ``set_grad_enabled``), which a graph cannot express."""

    def __init__(self, is_leaf) -> None:
        super().__init__()
        self.is_leaf = is_leaf
        self.scopes = [""]
        self.grad_mode_scopes: set[str] = set()

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self.is_leaf(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward, args, kwargs):
        self.scopes.append(self.path_of_module(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.scopes.pop()

    def trace(self, root, concrete_args=None):
        original, thread = torch._C._set_grad_enabled, threading.get_ident()

        def record(mode: bool) -> None:
            if threading.get_ident() == thread:
                self.grad_mode_scopes.add(self.scopes[-1])
            original(mode)

        torch._C._set_grad_enabled = record
        try:
            return super().trace(root, concrete_args)
        finally:
            torch._C._set_grad_enabled = original


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _leaf_predicate(leaf_types: tuple[type[nn.Module], ...], leaf_paths: frozenset[str] = frozenset()):
    """Which submodules are fused as a whole: registered layers, ``leaf_types``, the submodules at
    ``leaf_paths`` and torch.nn's own layers; everything else is traced into."""
    default = torch.fx.Tracer().is_leaf_module

    def is_leaf(m: nn.Module, qualified_name: str = "") -> bool:
        if qualified_name in leaf_paths or isinstance(m, leaf_types) or is_registered(m):
            return True
        return default(m, qualified_name) and not isinstance(m, _CONTAINERS)  # containers are never called

    return is_leaf


class StateChange(enum.Enum):
    """How a forward pass changes a module's state, or does what a graph cannot record (see :func:`fuse`)."""

    IN_PLACE = "updates its tensor '{name}' in place"
    GRAD_MODE = "switches gradient recording ({name})"
    REASSIGNED = "assigns a new value to its parameter or buffer '{name}'"
    ATTRIBUTE = "changes its Python attribute '{name}'"


@dataclass(frozen=True)
class _Change:
    module: str  # path of the module whose state changes ("" = the model)
    name: str  # the tensor or attribute (relative to ``module``)
    kind: StateChange

    def describe(self, model: nn.Module) -> str:
        where = f"module '{self.module}' ({type(model.get_submodule(self.module)).__name__})" if self.module \
            else f"the model ({type(model).__name__}) itself"
        return f"{where} {self.kind.value.format(name=self.name)} in forward"


@dataclass
class _Traced:
    """A member's graph and forward's tensor constants in each training mode (``True``: train)."""

    graphs: dict[bool, torch.fx.Graph]
    constants: dict[bool, dict[str, Tensor]]


def _trace_until_stateless(model: nn.Module, leaf_types) -> tuple[_Traced, dict[str, str]]:
    """``model`` traced in both modes with every submodule that updates its state in place run as a whole
    (member by member), and those submodules' paths with the reason. Raises ``FuseError`` for state changes
    that cannot be kept per member."""
    per_member: dict[str, str] = {}
    while True:
        is_leaf = _leaf_predicate(leaf_types, frozenset(per_member))
        traced, changes = _trace_modes(model, is_leaf)
        if not changes:
            return traced, per_member
        for change in changes:
            if change.kind not in (StateChange.IN_PLACE, StateChange.GRAD_MODE):
                fix = ("update it in place instead (self.x.add_(1), self.x.copy_(new)): such a submodule is run "
                       "member by member" if change.kind is StateChange.REASSIGNED else
                       "keep that state in a buffer (register_buffer) updated in place, in a submodule: such a "
                       "submodule is run member by member")
                raise FuseError(f"hydro.fuse: {change.describe(model)}; the fused model cannot keep a copy per member "
                                f"(tracing runs that Python code once). Fix: {fix}")
            owner = change.module
            while owner and is_leaf(model.get_submodule(owner), owner):
                owner = owner.rpartition(".")[0]  # the change is made by code that runs in an enclosing module
            if not owner:
                what = ("a graph cannot express that in the model's own forward" if change.kind is StateChange.GRAD_MODE
                        else "state changes of the model's own forward cannot be applied per member")
                raise FuseError(f"hydro.fuse: {change.describe(model)}; {what}. Fix: move that code (and the state "
                                f"it updates) into a submodule: it is then run member by member, exactly")
            per_member[owner] = f"{change.kind.value.format(name=change.name)} in forward: run member by member"


def _trace_modes(model: nn.Module, is_leaf, detect: bool = True) -> tuple[_Traced, list[_Change]]:
    """``model`` traced in training and in eval mode on a copy (tracing runs forward's Python code, which
    may change the module it runs on), and — if ``detect`` — the state changes that tracing revealed."""
    traced, changes = _Traced({}, {}), []
    twin = copy.deepcopy(model)
    for mode in (True, False):
        twin.train(mode)
        tensors = all_tensors(twin)
        identities = {name: id(t) for name, t in tensors.items()}
        versions = {name: t._version for name, t in tensors.items()}
        attributes = set(twin.__dict__)
        tracer = _Tracer(is_leaf)
        try:
            graph = tracer.trace(twin)
        except Exception as error:  # torch.fx raises many types; all mean "not traceable as written"
            raise FuseError(f"hydro.fuse: torch.fx cannot trace {type(model).__name__}.forward: "
                            f"{type(error).__name__}: {error}. {_TRACE_HELP}") from error
        constants = {name: twin.__dict__.pop(name) for name in set(twin.__dict__) - attributes
                     if name.startswith("_tensor_constant")}
        traced.graphs[mode], traced.constants[mode] = graph, constants
        if detect:
            changes += _changed_state(model, twin, identities, versions)
            changes += _mutations_in_graph(graph, twin, constants)
            changes += [_Change(path, "torch.no_grad/enable_grad", StateChange.GRAD_MODE)
                        for path in sorted(tracer.grad_mode_scopes)]
    return traced, list(dict.fromkeys(changes))


def _split(name: str) -> tuple[str, str]:
    owner, _, attr = name.rpartition(".")
    return owner, attr


def _changed_state(model: nn.Module, twin: nn.Module, identities: dict[str, int],
                   versions: dict[str, int]) -> list[_Change]:
    """State of ``twin`` (a traced copy of ``model``) that tracing changed by running forward's code."""
    changes = []
    for name, original in all_tensors(model).items():
        owner, attr = _split(name)
        now = getattr(twin.get_submodule(owner), attr, None)
        if not isinstance(now, Tensor) or id(now) != identities[name]:
            changes.append(_Change(owner, attr, StateChange.REASSIGNED))
        elif now._version != versions[name] or not _same_values(now, original):
            changes.append(_Change(owner, attr, StateChange.IN_PLACE))
    for path, module in model.named_modules():
        before, after = _plain_attributes(module), _plain_attributes(twin.get_submodule(path))
        changes += [_Change(path, key, StateChange.ATTRIBUTE) for key in sorted({*before, *after})
                    if not _same_attribute(before.get(key, _MISSING), after.get(key, _MISSING))]
    return changes


_MISSING = object()


def _plain_attributes(module: nn.Module) -> dict[str, object]:
    """A module's public Python attributes (plain values, or the type and length of containers)."""
    def summary(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return (type(value).__name__, len(value)) if isinstance(value, (list, dict, set, tuple)) else type(value)

    return {k: summary(v) for k, v in vars(module).items() if not k.startswith("_") and k != "training"}


def _same_attribute(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)  # NaN stays NaN


def _same_values(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(((a == b) | (a != a) & (b != b)).all()) if a.is_floating_point() else torch.equal(a, b)


# Operations whose result is a view of (or is) their first argument: an in-place update of the result
# updates the tensor it was taken from.
_ALIASING = frozenset({
    "getitem", "view", "view_as", "reshape", "narrow", "select", "t", "transpose", "permute", "squeeze",
    "unsqueeze", "expand", "expand_as", "detach", "flatten", "unflatten", "diagonal", "as_strided", "chunk",
    "split", "unbind", "contiguous", "movedim", "swapaxes", "real", "imag",
})
_ALIASING_ATTRIBUTES = frozenset({"data", "T", "mT", "H", "mH", "real", "imag"})
_IN_PLACE_OPERATORS = frozenset({operator.setitem, operator.iadd, operator.isub, operator.imul, operator.itruediv,
                                 operator.ifloordiv, operator.imod, operator.ipow, operator.iand, operator.ior,
                                 operator.ixor, operator.ilshift, operator.irshift, operator.imatmul})


def _op_name(node: Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _mutated_argument(node: Node):
    """The value an operation updates in place (the first argument of ``x.add_(...)``, ``x[i] = v``,
    ``x += v``, or ``out=``), or ``None``."""
    if node.op not in ("call_method", "call_function"):
        return None
    if "out" in node.kwargs:
        return node.kwargs["out"]
    name = _op_name(node)
    in_place = (node.op == "call_function" and node.target in _IN_PLACE_OPERATORS) \
        or (name.endswith("_") and not name.startswith("_"))
    return node.args[0] if in_place and node.args else None


def _aliased_root(value) -> Node | None:
    """The ``get_attr`` node ``value`` is a view of, or ``None``."""
    while isinstance(value, Node):
        if value.op == "get_attr":
            return value
        name = _op_name(value)
        aliasing = (name in _ALIASING or (name.endswith("_") and not name.startswith("_"))
                    or (value.target is getattr and value.args[1] in _ALIASING_ATTRIBUTES))
        if value.op not in ("call_method", "call_function") or not aliasing or not value.args:
            return None
        value = value.args[0]
    return None


def _mutations_in_graph(graph: torch.fx.Graph, twin: nn.Module, constants: dict[str, Tensor]) -> list[_Change]:
    """In-place updates, in ``graph``, of the traced module's parameters and buffers (also through
    ``.data`` or views, which torch.fx may record as tensor constants sharing their storage)."""
    storages = {t.untyped_storage().data_ptr(): name for name, t in all_tensors(twin).items() if t.numel()}
    changes = []
    for node in graph.nodes:
        root = _aliased_root(_mutated_argument(node))
        if root is None:
            continue
        name = root.target
        if name in constants:
            name = storages.get(constants[name].untyped_storage().data_ptr(), name)
        changes.append(_Change(*_split(name), StateChange.IN_PLACE))
    return changes


def _check_no_hooks(model: nn.Module, index: int) -> None:
    """Forward hooks and parametrizations act outside ``forward``: the fused layers would not apply them."""
    for path, module in model.named_modules():
        where = f"hydro.fuse: member {index}, " + (f"module '{path}' ({type(module).__name__})" if path else
                                                  f"the model ({type(module).__name__})")
        if parametrize.is_parametrized(module):
            raise FuseError(f"{where} is parametrized (torch.nn.utils.parametrize, e.g. parametrizations."
                            f"spectral_norm), which the fused layers would not apply. Fix: fuse the model without "
                            f"parametrizations (parametrize.remove_parametrizations) or compute the transform in "
                            f"forward")
        hooks = [name for kind, name in (("_forward_pre_hooks", "pre-hooks"), ("_forward_hooks", "hooks"))
                 if getattr(module, kind, None)]
        if hooks:
            raise FuseError(f"{where} has forward {' and '.join(hooks)} (register_forward_hook, spectral_norm, "
                            f"weight_norm, ...), which the fused model would not run. Fix: remove them before "
                            f"fusing, or move what they do into forward")


def _leaves(model: nn.Module, is_leaf) -> dict[str, nn.Module]:
    found: dict[str, nn.Module] = {}

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = prefix + name
            if is_leaf(child, path):
                found[path] = child
            else:
                walk(child, path + ".")

    walk(model, "")
    return found


def _describe(module: nn.Module | None) -> str:
    return "nothing" if module is None else f"{type(module).__name__}({module.extra_repr()})"


def _shapes(module: nn.Module) -> dict[str, tuple]:
    return {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items()}


def _check_same_architecture(models: list[nn.Module], graphs: list[torch.fx.Graph], is_leaf) -> None:
    ref_leaves, ref_graph = _leaves(models[0], is_leaf), _graph_signature(graphs[0])
    ref_ties = _ties(models[0])
    advice = ("Members of one fused model must share one architecture; group configurations that change "
              "the architecture into separate fused models.")
    for i, model in enumerate(models[1:], start=1):
        where = f"hydro.fuse: member {i} differs from member 0"
        if type(model) is not type(models[0]):
            raise FuseError(f"{where}: it is a {type(model).__name__}, member 0 a {type(models[0]).__name__}. {advice}")
        leaves = _leaves(model, is_leaf)
        for path in list(ref_leaves) + [p for p in leaves if p not in ref_leaves]:
            a, b = ref_leaves.get(path), leaves.get(path)
            if type(a) is not type(b) or _describe(a) != _describe(b):
                raise FuseError(f"{where} at module '{path}': {_describe(b)} vs {_describe(a)}. {advice}")
            shapes_a, shapes_b = _shapes(a), _shapes(b)
            if shapes_a != shapes_b:
                key = next(k for k in {**shapes_a, **shapes_b} if shapes_a.get(k) != shapes_b.get(k))
                raise FuseError(f"{where} at module '{path}' ({type(a).__name__}): tensor '{key}' is "
                                f"{shapes_b.get(key)} vs {shapes_a.get(key)}. {advice}")
        shapes_a, shapes_b = _shapes(models[0]), _shapes(model)
        if shapes_a != shapes_b:
            key = next(k for k in {**shapes_a, **shapes_b} if shapes_a.get(k) != shapes_b.get(k))
            raise FuseError(f"{where} in tensor '{key}': {shapes_b.get(key)} vs {shapes_a.get(key)}. {advice}")
        if _ties(model) != ref_ties:
            raise FuseError(f"{where} in which parameters are shared (tied): {_ties(model)} vs {ref_ties}. {advice}")
        for a, b in zip(ref_graph, _graph_signature(graphs[i])):
            if a != b:
                raise FuseError(f"{where} in forward at node '{a[0]}': {b[1:]} vs {a[1:]}. {advice}")


def _check_same_constants(constants: list[dict[str, Tensor]]) -> None:
    """Tensor constants created in forward are shared by all members, so they must be equal."""
    for i, own in enumerate(constants[1:], start=1):
        for name, value in own.items():
            ref = constants[0][name]
            if not (isinstance(value, Tensor) and value.shape == ref.shape and torch.equal(value, ref)):
                raise FuseError(f"hydro.fuse: member {i} differs from member 0 in a tensor constant of its forward "
                                f"({name}, shape {tuple(value.shape)}); make it a buffer so each member keeps its own")


def _graph_signature(graph: torch.fx.Graph) -> list[tuple]:
    def show(arg):
        return torch.fx.node.map_aggregate(arg, lambda a: f"%{a.name}" if isinstance(a, Node) else a)

    return [(n.name, n.op, getattr(n.target, "__name__", n.target), repr(show(n.args)), repr(show(n.kwargs)))
            for n in graph.nodes]


def _ties(model: nn.Module) -> list[list[str]]:
    """Groups of names under which one parameter object appears more than once."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


# --- building the fused model ---------------------------------------------------------------------------

def _make_twin(fused: FusedModel, path: str, modules: list[nn.Module]) -> nn.Module:
    twin, fallback = fuse_layer(modules)
    if fallback:
        fused.fallbacks[path] = fallback
    return twin


def _build(models: list[nn.Module], traced: _Traced, is_leaf, per_member: dict[str, str],
           fused_inputs: bool) -> FusedModel:
    fused = FusedModel(len(models))
    distinct = {id(m): all_tensors(m) for m in models}  # (one model F times: fuse_template)
    member_tensors = [distinct[id(m)] for m in models]

    def stack(name: str, tensor: Tensor) -> Tensor:
        return torch.stack([t[name].detach() for t in member_tensors])

    def leaf(path: str, child: nn.Module) -> nn.Module | None:
        if not is_leaf(child, path):
            return None
        modules = [child] * len(models) if len(distinct) == 1 else [m.get_submodule(path) for m in models]
        if path not in per_member:
            return _make_twin(fused, path, modules)
        twin = VmapModule(modules[0], len(models), mode="loop")
        load_stacked(twin, modules)
        fused.fallbacks[path] = per_member[path]
        return twin

    mirror(models[0], stack, fused, make_module=leaf)
    _tie(fused, _ties(models[0]))
    graphs, constants = _graphs_by_mode(traced)
    for name, value in constants.items():  # tensor constants of the members' forward, shared by all members
        setattr(fused, name, value)
    fused.graphs = _rewrite(graphs, fused, models, member_tensors[0].keys(), fused_inputs)
    forwards = {id(g): type(torch.fx.GraphModule(fused, g)).forward for g in fused.graphs.values()}
    fused._forward_fns = {mode: forwards[id(g)] for mode, g in fused.graphs.items()}
    fused._template = (copy.deepcopy(models[0]).to("cpu"),)
    return fused


def _graphs_by_mode(traced: _Traced) -> tuple[dict[bool, torch.fx.Graph], dict[str, Tensor]]:
    """One graph for both modes where training and eval trace alike, else both (the eval graph's tensor
    constants renamed ``_eval...``), and the constants they use."""
    train, evaluate = traced.graphs[True], traced.graphs[False]
    train_constants, eval_constants = traced.constants[True], traced.constants[False]
    if _graph_signature(train) == _graph_signature(evaluate) and train_constants.keys() == eval_constants.keys() \
            and all(_same_values(v, eval_constants[k]) for k, v in train_constants.items()):
        return {True: train, False: train}, train_constants
    evaluate = copy.deepcopy(evaluate)  # renamed below; a traced template's graph is fused again
    for node in evaluate.nodes:
        if node.op == "get_attr" and node.target in eval_constants:
            node.target = "_eval" + node.target
    return {True: train, False: evaluate}, {**train_constants, **{"_eval" + k: v for k, v in eval_constants.items()}}


def _tie(fused: FusedModel, ties: list[list[str]]) -> None:
    for group in ties:
        shared = fused.get_parameter(group[0])
        for name in group[1:]:
            _set_path(fused, name, shared)


def _set_path(root: nn.Module, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, value)


def _rewrite(graphs: dict[bool, torch.fx.Graph], fused: FusedModel, models: list[nn.Module],
             stacked: Iterable[str], fused_inputs: bool) -> dict[bool, torch.fx.Graph]:
    """The members' graph of each mode with per-member semantics on fused values (see
    :mod:`hydro.nn.functional`). Both modes share the fused layers, so a layer takes a shared input only
    where every call in both graphs passes one."""
    unique = {id(g): g for g in graphs.values()}
    flows = {key: _data_flow(g, models[0], set(stacked), fused_inputs) for key, g in unique.items()}
    all_shared_sites: dict[str, bool] = {}
    for _, shared_sites in flows.values():
        for target, shared in shared_sites.items():
            all_shared_sites[target] = all_shared_sites.get(target, True) and shared
    for key, g in unique.items():  # layers given per-member (fused) masks or extra arguments anywhere
        is_fused = flows[key][0]
        for node in g.nodes:
            if node.op != "call_module" or not is_fused[node]:
                continue
            module = fused.get_submodule(node.target)
            takes_shared = getattr(module, "supports_shared_input", False) and all_shared_sites[node.target]
            if not isinstance(module, ELEMENTWISE) and not takes_shared \
                    and _fused_non_data_args(module, node, is_fused):
                module = VmapModule(models[0].get_submodule(node.target), len(models))
                load_stacked(module, [m.get_submodule(node.target) for m in models])
                _set_path(fused, node.target, module)
                fused.fallbacks[node.target] = "per-member (fused) mask or extra argument: fused with torch.vmap"
    rewritten = {key: _emit(g, fused, flows[key][0], all_shared_sites) for key, g in unique.items()}
    return {mode: rewritten[id(g)] for mode, g in graphs.items()}


def _data_flow(graph: torch.fx.Graph, ref: nn.Module, stacked: set[str],
               fused_inputs: bool) -> tuple[dict[Node, bool], dict[str, bool]]:
    """Which values are fused ``[F, ...]``, and for each layer whether every call passes shared inputs."""
    is_fused: dict[Node, bool] = {}
    all_shared_sites: dict[str, bool] = {}
    for node in graph.nodes:
        any_fused = any(is_fused[a] for a in node.all_input_nodes)
        if node.op == "placeholder":
            is_fused[node] = fused_inputs
        elif node.op == "get_attr":
            is_fused[node] = node.target in stacked
        elif node.op == "call_module":
            module = ref.get_submodule(node.target)
            keeps_shared = isinstance(module, ELEMENTWISE) or (not all_tensors(module) and not isinstance(module, RANDOM))
            is_fused[node] = any_fused or not keeps_shared
            all_shared_sites[node.target] = all_shared_sites.get(node.target, True) and not any_fused
        elif node.op in ("call_function", "call_method"):
            is_fused[node] = any_fused and not _is_meta(node)
        else:
            is_fused[node] = False
    return is_fused, all_shared_sites


def _emit(graph: torch.fx.Graph, fused: FusedModel, is_fused: dict[Node, bool],
          all_shared_sites: dict[str, bool]) -> torch.fx.Graph:
    new = torch.fx.Graph()
    env: dict[Node, Node] = {}
    expanded: dict[Node, Node] = {}
    count_node: list[Node] = []

    def value(a: Node) -> Node:
        return env[a]

    def as_fused(a):
        if not isinstance(a, Node) or is_fused[a]:
            return torch.fx.node.map_arg(a, value)
        if a not in expanded:
            if not count_node:
                count_node.append(new.get_attr("num_members"))
            expanded[a] = new.call_function(expand_members, (env[a], count_node[0]))
        return expanded[a]

    for node in graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            env[node] = new.node_copy(node, value)
        elif node.op == "call_module":
            module = fused.get_submodule(node.target)
            if isinstance(module, ELEMENTWISE):
                env[node] = new.node_copy(node, value)
            elif not is_fused[node]:  # a stateless layer on shared inputs: the original layer, once
                env[node] = new.call_module(node.target + ".op", *_mapped(node, value))
            elif getattr(module, "supports_shared_input", False) and all_shared_sites[node.target]:
                module.shared_input = True
                env[node] = new.node_copy(node, value)
            else:
                args, kwargs = _expand_data_args(module, node, as_fused, value)
                env[node] = new.call_module(node.target, args, kwargs)
        elif node.op in ("call_function", "call_method"):
            if not any(is_fused[a] for a in node.all_input_nodes):
                env[node] = new.node_copy(node, value)
                continue
            fn = node.target if node.op == "call_function" else trialwise_fn.method_caller(node.target)
            meta = _meta_function(node)
            if meta is None:
                dims = lambda a: _in_dims(a, is_fused)  # noqa: E731
                meta = trialwise_fn.trialwise(fn, dims(node.args), {k: dims(v) for k, v in node.kwargs.items()})
            env[node] = new.call_function(meta, *_mapped(node, value))
        elif node.op == "output":
            new.output(torch.fx.node.map_aggregate(node.args[0], as_fused))
    new.lint()
    return new


def _mapped(node: Node, value) -> tuple[tuple, dict]:
    return torch.fx.node.map_arg(node.args, value), torch.fx.node.map_arg(node.kwargs, value)


def _data_arg_names(module: nn.Module) -> list[str] | None:
    data = getattr(module, "data_args", None)
    return None if data is None else list(inspect.signature(module.forward).parameters)[:data]


def _fused_non_data_args(module: nn.Module, node: Node, is_fused: dict[Node, bool]) -> bool:
    names = _data_arg_names(module)
    if names is None:
        return False
    extra = [*node.args[len(names):], *(v for k, v in node.kwargs.items() if k not in names)]
    found: list[Node] = []
    torch.fx.node.map_arg(extra, found.append)
    return any(is_fused[n] for n in found)


def _expand_data_args(module: nn.Module, node: Node, as_fused, value) -> tuple[tuple, dict]:
    """Shared values passed as member data to a fused layer become ``[F, ...]`` views; the rest as is."""
    names = _data_arg_names(module)
    if names is None:
        return tuple(as_fused(a) for a in node.args), {k: as_fused(v) for k, v in node.kwargs.items()}
    args = tuple(as_fused(a) if i < len(names) else torch.fx.node.map_arg(a, value) for i, a in enumerate(node.args))
    kwargs = {k: as_fused(v) if k in names else torch.fx.node.map_arg(v, value) for k, v in node.kwargs.items()}
    return args, kwargs


def _in_dims(arg, is_fused: dict[Node, bool]):
    """vmap ``in_dims`` mirroring ``arg``: 0 for fused nodes, ``None`` for anything else."""
    if isinstance(arg, Node):
        return 0 if is_fused[arg] else None
    if isinstance(arg, tuple):
        return tuple(_in_dims(a, is_fused) for a in arg)
    if isinstance(arg, list):
        return [_in_dims(a, is_fused) for a in arg]
    if isinstance(arg, dict):
        return {k: _in_dims(v, is_fused) for k, v in arg.items()}
    return None


def _is_meta(node: Node) -> bool:
    return _meta_function(node) is not None


def _meta_function(node: Node):
    """The member-semantics replacement of a shape query on a fused tensor, or ``None``."""
    if node.op == "call_method":
        return trialwise_fn.META_METHODS.get(node.target)
    if node.target is getattr:
        return trialwise_fn.member_getattr if node.args[1] in trialwise_fn.META_ATTRIBUTES else None
    return trialwise_fn.META_FUNCTIONS.get(node.target)
