"""Which sizes of a model are widths: data-flow analysis of its torch.fx graph.

Every width field of a layer (a Linear's ``in``/``out``, a Conv's channels, a norm's features, ...) starts
in a group of its own. Data flow merges groups: a layer's input field joins the group of the value it
consumes, element-wise operations, residual additions and reshapes join the groups of all their inputs (a
flatten after a conv keeps the channels' group: channels x spatial scales like the channels). Groups that
reach the model's inputs (placeholders) or outputs are fixed; every other group that holds a layer field is
a width, divided by the scale. Input and output layers thus follow from the data flow, not from the order
in which modules are defined. A layer, function or parameter without a rule whose value joins a width
group is an error (it would need its own shrink rule), or — with ``keep_unruled`` — keeps that group at
full width (listed in ``WidthPlan.kept``).
"""
from __future__ import annotations

import operator
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx import Node

from .errors import ShrinkError
from .report import KeptWidth
from .rules import RULES, rule_for

# Element-wise operations, activations, transposes, indexing: the result has the input's width and feature size.
_SIZE_KEEPING_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pos, operator.pow,
    operator.iadd, operator.isub, operator.imul, operator.itruediv,
    torch.add, torch.sub, torch.mul, torch.div, torch.neg, torch.relu, torch.tanh, torch.sigmoid, torch.exp,
    torch.abs, torch.clamp, torch.sqrt, torch.rsqrt, torch.transpose, torch.permute, torch.squeeze,
    torch.unsqueeze, torch.softmax, torch.log_softmax, torch.dropout,
    F.relu, F.relu6, F.gelu, F.silu, F.elu, F.leaky_relu, F.tanh, F.sigmoid, F.softplus, F.mish, F.hardswish,
    F.dropout, F.dropout1d, F.dropout2d, F.softmax, F.log_softmax, F.normalize,
    F.avg_pool1d, F.avg_pool2d, F.max_pool1d, F.max_pool2d, F.adaptive_avg_pool1d, F.adaptive_avg_pool2d,
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, operator.getitem,
}
_SIZE_KEEPING_METHODS = {
    "add", "sub", "mul", "div", "neg", "relu", "tanh", "sigmoid", "exp", "abs", "clamp", "pow", "sqrt", "rsqrt",
    "softmax", "log_softmax", "permute", "transpose", "contiguous", "squeeze", "unsqueeze", "float", "double",
    "half", "to", "type_as", "clone", "detach", "masked_fill", "add_", "mul_",
}
# Shape changes and reductions: the result's width is the input's width, its feature size may differ.
_RESHAPE_FUNCTIONS = {torch.flatten, torch.reshape, torch.cat, torch.concat, torch.stack, torch.mean, torch.sum}
_RESHAPE_METHODS = {"view", "reshape", "flatten", "unflatten", "expand", "mean", "sum"}
_LITERAL_SHAPE_METHODS = {"view", "reshape", "expand", "unflatten"}
_REDUCTIONS = {torch.mean, torch.sum, "mean", "sum"}  # without a dim: a scalar, no width
_QUERY_METHODS = {"size", "dim", "numel", "nelement", "ndimension", "get_device", "is_contiguous"}
_QUERY_ATTRIBUTES = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad"}
_SIZE_CHANGING_LEAVES = (nn.Flatten, nn.Unflatten)


class _Groups:
    """Union-find over width groups; a group is fixed if any of its members is."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.is_fixed: list[bool] = []

    def new(self, fixed: bool = False) -> int:
        self.parent.append(len(self.parent))
        self.is_fixed.append(fixed)
        return len(self.parent) - 1

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[b] = a
            self.is_fixed[a] = self.is_fixed[a] or self.is_fixed[b]
        return a

    def fix(self, g: int) -> None:
        self.is_fixed[self.find(g)] = True


@dataclass
class WidthPlan:
    """The result: ``layers[path][field]`` is the group of each rule layer's field; ``tensors[name]`` the
    dimension to scale of each parameter/buffer used directly in forward; ``scaled(group)``."""

    groups: _Groups
    layers: dict[str, dict[str, int]] = field(default_factory=dict)
    tensors: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (group, dim)
    kept: list[KeptWidth] = field(default_factory=list)  # groups kept at full width for want of a rule

    def scaled(self, group: int) -> bool:
        return not self.groups.is_fixed[self.groups.find(group)] and self.groups.find(group) in self._width_roots()

    def _width_roots(self) -> set[int]:
        return {self.groups.find(g) for fields in self.layers.values() for g in fields.values()}

    def scaled_fields(self, path: str) -> frozenset[str]:
        return frozenset(f for f, g in self.layers[path].items() if self.scaled(g))

    def members(self, group: int) -> Iterator[tuple[str, str]]:
        """``(layer path, field)`` of every layer field in ``group``."""
        root = self.groups.find(group)
        return ((p, f) for p, fields in self.layers.items() for f, g in fields.items() if self.groups.find(g) == root)


@dataclass
class _Pending:
    """A check that needs the final groups: raise ``message`` if ``groups`` hold a width."""

    groups: list[int]
    message: str
    sizes: frozenset[int] = frozenset()  # for literal reshapes: only sizes of the group's fields matter
    keepable: str = ""  # what has no rule, if keeping its groups at full width resolves the check


def trace(model: nn.Module) -> torch.fx.Graph:
    """``model``'s fx graph with torch.nn layers as leaves."""
    try:
        return torch.fx.Tracer().trace(model)
    except Exception as error:  # torch.fx raises many types; all mean "not traceable as written"
        raise ShrinkError(f"hydro.shrink: torch.fx cannot trace {type(model).__name__}.forward: "
                          f"{type(error).__name__}: {error}. Fix: make forward free of Python control flow on tensor "
                          f"values") from error


def analyse(model: nn.Module, graph: torch.fx.Graph, fixed: Collection[str] = (),
            fixed_fields: Collection[tuple[str, str]] = (), keep_unruled: bool = False) -> WidthPlan:
    """Width groups of ``model`` from ``graph``; ``fixed``: module paths kept at full width;
    ``fixed_fields``: ``(path, field)`` widths kept at full size; ``keep_unruled``: widths coupled to a layer
    or operation without a rule are kept at full width (``WidthPlan.kept``) instead of refused."""
    return _Analysis(model, set(fixed), set(fixed_fields), keep_unruled).run(graph)


class _Analysis:
    def __init__(self, model: nn.Module, fixed: set[str], fixed_fields: set[tuple[str, str]],
                 keep_unruled: bool) -> None:
        self.model, self.fixed, self.fixed_fields, self.keep_unruled = model, fixed, fixed_fields, keep_unruled
        self.plan = WidthPlan(_Groups())
        self.tags: dict[Node, int | dict[int, int]] = {}  # width group of each value (per element of tuples)
        self.sizes: dict[Node, int] = {}  # feature size of a value, where known
        self.origin: dict[Node, str] = {}  # the parameter/buffer a value is (a view of)
        self.attr_uses: list[tuple[Node, str, int]] = []  # (value, tensor name, feature size it is combined with)
        self.pending: list[_Pending] = []

    def run(self, graph: torch.fx.Graph) -> WidthPlan:
        groups = self.plan.groups
        for node in graph.nodes:
            if node.op == "placeholder":
                self.tags[node] = groups.new(fixed=True)
            elif node.op == "get_attr":
                value = _attribute(self.model, node.target)
                if isinstance(value, Tensor):
                    self.tags[node], self.origin[node] = groups.new(), node.target
            elif node.op == "call_module":
                self._module(node)
            elif node.op in ("call_function", "call_method"):
                self._function(node)
            elif node.op == "output":
                for arg in node.all_input_nodes:
                    for g in self._all_tags(arg):
                        groups.fix(g)
        self._resolve()
        return self.plan

    # --- per node -------------------------------------------------------------------------------------------

    def _tag(self, node) -> int | None:
        tag = self.tags.get(node) if isinstance(node, Node) else None
        return tag if isinstance(tag, int) else None

    def _all_tags(self, node: Node) -> list[int]:
        return _leaf_tags(self.tags.get(node))

    def _module(self, node: Node) -> None:
        path, groups = node.target, self.plan.groups
        module = self.model.get_submodule(path)
        rule = rule_for(module)
        reason = None
        if rule is not None:
            try:
                sizes = rule.fields(module)
            except ValueError as error:
                rule, reason = None, str(error)
        if rule is not None:
            fields = self.plan.layers.setdefault(
                path, {f: groups.new(fixed=path in self.fixed or (path, f) in self.fixed_fields) for f in sizes})
            for i, (name, width_field) in enumerate(rule.inputs):
                arg = node.args[i] if i < len(node.args) else node.kwargs.get(name)
                for value in _flat([arg]) if width_field is not None else ():
                    if self._tag(value) is not None:
                        groups.union(fields[width_field], self._tag(value))
            out = fields[rule.output]
            self.tags[node] = out if rule.output_tree is None else _tree_tags(rule.output_tree, out)
            self.sizes[node] = sizes[rule.output]
        elif not any(True for _ in module.parameters()) and not any(True for _ in module.buffers()):
            self._pass_through(node, keeps_size=not isinstance(module, _SIZE_CHANGING_LEAVES))
        else:
            what = f"layer '{path}' ({type(module).__name__})"
            why = f" ({reason})" if reason else ""
            self._opaque(node, f"{what} has no shrink rule{why}", path, f"{what}: no shrink rule{why}",
                         f"keep it at full width with hydro.shrink(model, scale, fixed=['{path}']) (the widths it "
                         f"touches then stay fixed), or build it from supported layers "
                         f"({', '.join(sorted({t.__name__ for t in RULES}))})")

    def _function(self, node: Node) -> None:
        target, method = node.target, node.op == "call_method"
        tagged = [a for a in node.all_input_nodes if a in self.tags]
        if not tagged:
            return
        if (method and target in _QUERY_METHODS) or (target is getattr and node.args[1] in _QUERY_ATTRIBUTES):
            return
        if target is operator.getitem and isinstance(self.tags.get(node.args[0]), dict):
            tag = self.tags[node.args[0]].get(node.args[1])
            if tag is not None:
                self.tags[node] = tag
                self.sizes[node] = self.sizes[node.args[0]]
            return
        if target is F.scaled_dot_product_attention:
            q, k, v = (node.args + (None,) * 3)[:3]
            if all(self._tag(t) is not None for t in (q, k, v)):
                self.plan.groups.union(self._tag(q), self._tag(k))
                self.tags[node], self.sizes[node] = self._tag(v), self.sizes.get(v)
                return
        if target in _REDUCTIONS and len(node.args) == 1 and "dim" not in node.kwargs:
            return
        if (target in _SIZE_KEEPING_METHODS) if method else (target in _SIZE_KEEPING_FUNCTIONS):
            self._pass_through(node, keeps_size=True)
        elif (target in _RESHAPE_METHODS) if method else (target in _RESHAPE_FUNCTIONS):
            self._pass_through(node, keeps_size=False)
            if node in self.tags and ((method and target in _LITERAL_SHAPE_METHODS) or target is torch.reshape):
                self._check_literals(node)
        else:
            name = target if method else getattr(target, "__name__", str(target))
            what = f"operation '{name}' (fx node '{node.name}')"
            self._opaque(node, f"{what} has no shrink rule", None, f"{what}: no shrink rule",
                         "express it with supported layers: nn.Linear instead of matmul/F.linear with a parameter, "
                         "nn.MultiheadAttention or F.scaled_dot_product_attention for attention")

    def _pass_through(self, node: Node, *, keeps_size: bool) -> None:
        """The node's value has the width of all its (tensor) inputs, which therefore agree."""
        tagged = [a for a in node.all_input_nodes if self._tag(a) is not None]
        if not tagged:
            return
        root = tagged[0]
        for other in tagged[1:]:
            self.plan.groups.union(self._tag(root), self._tag(other))
        self.tags[node] = self.plan.groups.find(self._tag(root))
        known = [self.sizes[a] for a in tagged if a in self.sizes and a not in self.origin]
        if keeps_size and known:
            self.sizes[node] = known[0]
        if keeps_size and len(tagged) == 1 and root in self.origin:
            self.origin[node] = self.origin[root]
        for a in tagged:
            if a in self.origin and known:
                self.attr_uses.append((a, self.origin[a], known[0]))

    def _check_literals(self, node: Node) -> None:
        literals = frozenset(v for v in _flat(node.args[1:]) if isinstance(v, int) and v > 1)
        if literals:
            self.pending.append(_Pending(
                [self.tags[node]], f"fx node '{node.name}' ({node.target}) reshapes a width-scaled tensor with the "
                f"literal size(s) {{sizes}} of the full-width model. Fix: compute sizes from the tensor (x.size(), "
                f"-1, flatten) instead of writing them as numbers", literals))

    def _opaque(self, node: Node, what: str, path: str | None, cause: str, fix: str) -> None:
        groups = self.plan.groups
        inputs = [g for a in node.all_input_nodes for g in self._all_tags(a)]
        out = groups.new()
        self.tags[node] = out
        if path is not None and path in self.fixed:
            for g in (*inputs, out):
                groups.fix(g)
            return
        self.pending.append(_Pending(inputs + [out], f"{what}, but its width is coupled to the scaled width of "
                                                     f"{{coupled}}. Fix: {fix}", keepable=cause))

    # --- after the walk ---------------------------------------------------------------------------------------

    def _resolve(self) -> None:
        plan = self.plan
        for check in self.pending:
            kept: list[str] = []
            for g in check.groups:
                if not plan.scaled(g):
                    continue
                members = list(plan.members(g))
                sizes = {field_size(self.model, p, f) for p, f in members}
                if check.sizes and not check.sizes & sizes:
                    continue
                if check.keepable and self.keep_unruled:
                    plan.groups.fix(g)
                    kept += [f"'{p}'.{f}" for p, f in members]
                    continue
                coupled = ", ".join(f"'{p}'.{f}" for p, f in members[:3])
                raise ShrinkError("hydro.shrink: " + check.message.format(coupled=coupled,
                                                                         sizes=sorted(check.sizes & sizes)))
            if kept:
                plan.kept.append(KeptWidth(check.keepable, tuple(kept)))
        for node, name, size in self.attr_uses:
            if not plan.scaled(self.tags[node]):
                continue
            shape = _attribute(self.model, name).shape
            dims = [d for d, n in enumerate(shape) if n == size]
            if not dims:
                raise ShrinkError(f"hydro.shrink: tensor '{name}' {tuple(shape)} is combined with a width of size "
                                  f"{size} but has no dimension of that size. Fix: make it a layer (e.g. nn.Embedding) "
                                  f"or keep the neighbouring layers fixed")
            previous = plan.tensors.setdefault(name, (self.tags[node], dims[-1]))
            if previous[1] != dims[-1]:
                raise ShrinkError(f"hydro.shrink: tensor '{name}' is used with widths in dimensions {previous[1]} and "
                                  f"{dims[-1]}; only one dimension of a tensor used in forward can be a width")
        if not any(plan.scaled(g) for fields in plan.layers.values() for g in fields.values()):
            raise ShrinkError(f"hydro.shrink: {type(self.model).__name__} has no width to shrink. Fix: tune it at "
                              f"full size (scale=1; hydro tune --scale 1). Every layer size is tied by the data flow "
                              f"to the model's input or output sizes, or no layer has a shrink rule")


def _tree_tags(tree: dict, tag: int) -> dict:
    """``tree`` (a :attr:`Rule.output_tree`) with ``tag`` for every ``True``."""
    return {k: _tree_tags(v, tag) if isinstance(v, dict) else tag for k, v in tree.items()}


def _leaf_tags(tag) -> list[int]:
    """The groups of a value's tag: one group, a (nested) dict of them for tuples, or none."""
    if isinstance(tag, dict):
        return [g for value in tag.values() for g in _leaf_tags(value)]
    return [] if tag is None else [tag]


def field_size(model: nn.Module, path: str, width_field: str) -> int:
    """The size of field ``width_field`` of the rule layer at ``path``."""
    module = model.get_submodule(path)
    return rule_for(module).fields(module)[width_field]


def _attribute(model: nn.Module, target: str):
    value = model
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _flat(args) -> Iterator:
    for a in args:
        if isinstance(a, (tuple, list)):
            yield from _flat(a)
        else:
            yield a
