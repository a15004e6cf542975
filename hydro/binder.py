"""Trial Binder: ``F`` models of one architecture trained as one fused model, and back.

``fuse`` traces the members with torch.fx, checks they share one architecture, replaces every layer by
its fused twin (``hydro.nn``) holding the members' weights stacked along a leading trial dimension, and
rewrites the functions the forward calls so they act member by member. The fused model takes the
members' shared batch ``[N, ...]`` and returns ``[F, N, ...]``; its ``state_dict`` has the members' keys
with every tensor stacked, so member ``i`` is ``{k: v[i]}``.
"""
from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Sequence

import torch
import torch.fx
from torch import Tensor, nn
from torch.fx import Node

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
    ``fallbacks`` maps layers fused with the generic vmap fallback to the reason."""

    def __init__(self, num_members: int) -> None:
        super().__init__()
        self.num_members = num_members
        self.member_ids: list[int] = list(range(num_members))
        self.fallbacks: dict[str, str] = {}

    def forward(self, *args, **kwargs):
        return self._forward_fn(self, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}"


def fuse(models: Sequence[nn.Module], *, leaf_modules: Iterable[type[nn.Module]] = (),
         fused_inputs: bool = False) -> FusedModel:
    """Fuse independently built models of one architecture (each keeps its own weights).

    ``leaf_modules``: classes fused as a whole with ``torch.vmap`` instead of being traced into.
    ``fused_inputs``: the fused model takes per-member inputs ``[F, N, ...]`` instead of a shared batch.
    """
    models = list(models)
    if not models or not all(isinstance(m, nn.Module) for m in models):
        raise FuseError("hydro.fuse needs a non-empty sequence of nn.Module members")
    tracer_leaves = tuple(leaf_modules)
    graphs, constants = zip(*(_trace(m, tracer_leaves) for m in models))
    is_leaf = _leaf_predicate(tracer_leaves)
    _check_same_architecture(models, list(graphs), is_leaf)
    _check_same_constants(list(constants))
    return _build(models, graphs[0], constants[0], is_leaf, fused_inputs)


def unfuse(fused: FusedModel) -> list[nn.Module]:
    """The members as independent modules of the original class, holding their current weights."""
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
    statistics, gradients and — when given — optimizer state and LR-scheduler state."""
    index = _member_index(members, fused.num_members)
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
    index = torch.as_tensor(list(members), dtype=torch.long)
    if index.dim() != 1 or len(index) == 0 or len(set(index.tolist())) != len(index) \
            or index.min() < 0 or index.max() >= count:
        raise ValueError(f"members must be distinct positions in [0, {count}), got {list(members)}")
    return index


# --- tracing and checks -------------------------------------------------------------------------------

class _Tracer(torch.fx.Tracer):
    def __init__(self, leaf_types: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self.leaf_types = leaf_types

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return _leaf_predicate(self.leaf_types)(m, module_qualified_name)


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _leaf_predicate(leaf_types: tuple[type[nn.Module], ...]):
    default = torch.fx.Tracer().is_leaf_module

    def is_leaf(m: nn.Module, qualified_name: str = "") -> bool:
        if isinstance(m, leaf_types) or is_registered(m):
            return True
        return default(m, qualified_name) and not isinstance(m, _CONTAINERS)  # containers are never called

    return is_leaf


def _trace(model: nn.Module, leaf_types) -> tuple[torch.fx.Graph, dict[str, Tensor]]:
    """The member's graph and the tensor constants of its forward. torch.fx stores those constants as
    attributes of the traced module; they are taken off again, so tracing leaves the member as it was."""
    before = set(model.__dict__)
    try:
        graph = _Tracer(leaf_types).trace(model)
    except Exception as error:  # torch.fx raises many types; all mean "not traceable as written"
        raise FuseError(f"hydro.fuse: torch.fx cannot trace {type(model).__name__}.forward: "
                        f"{type(error).__name__}: {error}. {_TRACE_HELP}") from error
    finally:
        added = {name: model.__dict__.pop(name) for name in set(model.__dict__) - before}
    return graph, added


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


def _build(models: list[nn.Module], graph: torch.fx.Graph, constants: dict[str, Tensor], is_leaf,
           fused_inputs: bool) -> FusedModel:
    fused = FusedModel(len(models))
    member_tensors = [all_tensors(m) for m in models]

    def stack(name: str, tensor: Tensor) -> Tensor:
        return torch.stack([t[name].detach() for t in member_tensors])

    def leaf(path: str, child: nn.Module) -> nn.Module | None:
        return _make_twin(fused, path, [m.get_submodule(path) for m in models]) if is_leaf(child, path) else None

    mirror(models[0], stack, fused, make_module=leaf)
    _tie(fused, _ties(models[0]))
    for name, value in constants.items():  # tensor constants of the members' forward, shared by all members
        setattr(fused, name, value)
    new_graph = _rewrite(graph, fused, models, member_tensors[0].keys(), fused_inputs)
    fused.graph = new_graph
    fused._forward_fn = type(torch.fx.GraphModule(fused, new_graph)).forward
    fused._template = (copy.deepcopy(models[0]).to("cpu"),)
    return fused


def _tie(fused: FusedModel, ties: list[list[str]]) -> None:
    for group in ties:
        shared = fused.get_parameter(group[0])
        for name in group[1:]:
            _set_path(fused, name, shared)


def _set_path(root: nn.Module, path: str, value) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, value)


def _rewrite(graph: torch.fx.Graph, fused: FusedModel, models: list[nn.Module], stacked: Iterable[str],
             fused_inputs: bool) -> torch.fx.Graph:
    """The members' graph with per-member semantics on fused values (see :mod:`hydro.nn.functional`)."""
    ref, stacked = models[0], set(stacked)
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
                if _fused_non_data_args(module, node, is_fused):  # e.g. a mask computed from member state
                    module = VmapModule(ref.get_submodule(node.target), len(models))
                    load_stacked(module, [m.get_submodule(node.target) for m in models])
                    _set_path(fused, node.target, module)
                    fused.fallbacks[node.target] = "per-member (fused) mask or extra argument: fused with torch.vmap"
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
