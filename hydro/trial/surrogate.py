"""The one place that builds member models: the user's full-size model, or its µP version (Model Shrinker); and
the µP members of one fused trial at once, from one shrunk template per architecture and scale.

A member is seeded, built at full size by the user's factory (its initialisation draws from torch's RNG) and
shrunk (the shrunk layers draw again). :class:`SurrogateTemplate` gives the same members bit for bit without
initialising a full-size model or tracing each member: per member, the factory runs on the meta device (no
tensors) while its random draws are recorded, the draws are replayed on a scratch buffer (the RNG advances
exactly as the full-size initialisation advances it), and only the shrunk layers are built and copied into
the fused model. A template checks this once against a member built the plain way and is used only where
the two agree exactly (and where every tensor of the surrogate belongs to a shrunk layer).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils._device import DeviceContext
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from hydro.binder import FusedModel, fuse_template
from hydro.nn.registry import all_tensors
from hydro.optim.dynamo_guard import guards_skipped
from hydro.shrink import shrink
from hydro.shrink.shrink import ShrinkRecipe, shrink_recipe

logger = logging.getLogger(__name__)


def build_member(model_factory: Callable[[Mapping], nn.Module], config: Mapping, scale: int,
                 mup: bool | None = None, shrink_options: Mapping | None = None) -> nn.Module:
    """``model_factory(config)`` as written (``scale == 1``, no µP), or in µP with its widths divided by
    ``scale`` via ``hydro.shrink``. ``mup`` defaults to ``scale > 1``; ``scale=1, mup=True`` is the full-size
    target of a surrogate run: the model as written (same parameters and function) with the µP shapes through
    which the surrogates' hyperparameters transfer (every multiplier 1). ``shrink_options``: keywords for
    ``hydro.shrink`` (``TuneSpec.shrink_options()``)."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1 (1 = full size), got {scale}")
    model = model_factory(config)
    if not (scale > 1 if mup is None else mup):
        if scale != 1:
            raise ValueError(f"scale={scale} shrinks the model, which needs µP (mup=True)")
        return model
    return shrink(model, scale, **(shrink_options or {}))


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


_RandomOp = tuple[torch._ops.OpOverload, tuple, dict]


class _RandomDraws(TorchDispatchMode):
    """Records the random operations (``nondeterministic_seeded`` aten ops) run inside, tensors as their specs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_RandomOp] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            spec = lambda v: _TensorSpec(tuple(v.shape), v.dtype) if isinstance(v, Tensor) else v  # noqa: E731
            self.ops.append((func, tree_map(spec, args), tree_map(spec, kwargs)))
        return func(*args, **kwargs)


class _Scratch:
    """Replays recorded random draws on the CPU: uniform draws of float32 tensors (one 32-bit Mersenne Twister
    output per element) advance torch's generator state directly, other draws run again on scratch buffers."""

    def __init__(self) -> None:
        self.buffers: dict[torch.dtype, Tensor] = {}

    def tensor(self, spec: _TensorSpec) -> Tensor:
        numel = torch.Size(spec.shape).numel()
        buffer = self.buffers.get(spec.dtype)
        if buffer is None or buffer.numel() < numel:
            buffer = self.buffers[spec.dtype] = torch.empty(numel, dtype=spec.dtype)
        return buffer[:numel].view(spec.shape)

    def replay(self, ops: Sequence[_RandomOp]) -> None:
        """Run ``ops`` again on the CPU: torch's global RNG advances as it did when they were recorded."""
        def real(value):
            if isinstance(value, _TensorSpec):
                return self.tensor(value)
            return torch.device("cpu") if isinstance(value, torch.device) else value

        pending = 0  # uniform float32 draws not yet applied
        for func, args, kwargs in ops:
            if func is torch.ops.aten.uniform_.default and args[0].dtype == torch.float32:
                pending += torch.Size(args[0].shape).numel()
                continue
            _advance_mt19937(pending)
            pending = 0
            kwargs = {k: ("cpu" if k == "device" else v) for k, v in tree_map(real, kwargs).items()}
            func(*tree_map(real, args), **kwargs)
        _advance_mt19937(pending)


# torch's CPU generator state (CPUGeneratorImplState): int32 `left` at byte 8, uint64 `next` at 16, then the
# Mersenne Twister's 624 words, one per uint64.
_LEFT, _NEXT, _KEY, _WORDS = 8, 16, 24, 624


def _advance_mt19937(draws: int) -> None:
    """Advance torch's CPU generator by ``draws`` 32-bit outputs (numpy's Mersenne Twister is the same generator,
    several times faster at skipping outputs than torch at drawing them)."""
    if not draws:
        return
    state = torch.get_rng_state().numpy().copy()
    left = int(state[_LEFT:_LEFT + 4].view(np.int32)[0])
    position = _WORDS if left == 1 else int(state[_NEXT:_NEXT + 8].view(np.uint64)[0])
    generator = np.random.MT19937()
    generator.state = {"bit_generator": "MT19937", "state": {
        "key": state[_KEY:_KEY + 8 * _WORDS].view(np.uint64).astype(np.uint32), "pos": position}}
    generator.random_raw(draws, output=False)
    after = generator.state["state"]
    state[_KEY:_KEY + 8 * _WORDS] = after["key"].astype(np.uint64).view(np.uint8)
    position = int(after["pos"])
    state[_LEFT:_LEFT + 4] = np.array([1 if position == _WORDS else _WORDS + 1 - position], np.int32).view(np.uint8)
    state[_NEXT:_NEXT + 8] = np.array([position], np.uint64).view(np.uint8)
    torch.set_rng_state(torch.from_numpy(state))


class _ReadKeys(dict):
    """A configuration that records which of its keys were read (``None``: all of them, e.g. by iteration)."""

    def __init__(self, config: Mapping) -> None:
        super().__init__(config)
        self.read: set | None = set()

    def __getitem__(self, key):
        if self.read is not None:
            self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if self.read is not None:
            self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        if self.read is not None:
            self.read.add(key)
        return super().__contains__(key)



def _reading_all(name: str):
    method = getattr(dict, name)

    def read_all(self, *args, **kwargs):
        self.read = None
        return method(self, *args, **kwargs)

    return read_all


for _name in ("__iter__", "keys", "items", "values", "__eq__", "__ne__", "__repr__", "__reduce_ex__", "copy",
              "__or__", "__ror__", "pop", "popitem", "setdefault", "update", "__setitem__", "__delitem__"):
    setattr(_ReadKeys, _name, _reading_all(_name))  # anything that may see every value: the factory read them all


def _signature(model: nn.Module) -> list[tuple]:
    """A model's architecture as far as building members goes: module types, tensor names, shapes and dtypes."""
    return [(path, type(module)) for path, module in model.named_modules()] + \
        [(name, tuple(t.shape), t.dtype) for name, t in all_tensors(model).items()]


class NotFromTemplate(Exception):
    """A member cannot be built from the template (its configuration builds another architecture, or its
    factory does not run on the meta device): build it the plain way."""


class SurrogateTemplate:
    """One µP surrogate architecture (a factory, a group of configurations, a scale), shrunk once.

    ``recipe``: how ``hydro.shrink`` built it; ``signature``: the full-size model's architecture. Members come
    out bit for bit as ``build_member`` builds them after ``torch.manual_seed`` of their seed."""

    def __init__(self, model_factory: Callable[[Mapping], nn.Module], recipe: ShrinkRecipe,
                 signature: list[tuple]) -> None:
        self.model_factory, self.recipe, self.signature = model_factory, recipe, signature
        self.scratch = _Scratch()
        self.recorded: list[tuple[frozenset | None, list, list[_RandomOp]]] = []  # (keys read, their values, draws)

    @classmethod
    def measure(cls, model_factory: Callable[[Mapping], nn.Module], config: Mapping, scale: int,
                shrink_options: Mapping, seed: int) -> tuple[SurrogateTemplate | None, str]:
        """The template of ``config``'s architecture at ``scale``, checked against the member of ``seed`` built
        the plain way (``None`` where they differ or where the template cannot build members), and why no
        template (``""`` when there is one). Torch's RNG is left as after the plain member."""
        torch.manual_seed(seed)
        full = model_factory(config)
        after_full = torch.get_rng_state()
        recipe = shrink_recipe(full, scale, **shrink_options)
        after = torch.get_rng_state()
        template = cls(model_factory, recipe, _signature(full))
        member = recipe.surrogate
        reason = ""
        if recipe.rebuilt_tensor_names() != set(all_tensors(member)):
            reason = "some of the surrogate's tensors are copied or sliced from the full-size model"
        else:
            try:
                torch.manual_seed(seed)
                template.advance(config)
                if not torch.equal(torch.get_rng_state(), after_full):
                    reason = "replaying the full-size initialisation's random draws does not advance the RNG alike"
                else:
                    rebuilt = template.member_tensors()
                    same = torch.equal(torch.get_rng_state(), after) and all(
                        t.dtype == rebuilt[name].dtype and torch.equal(t, rebuilt[name])
                        for name, t in all_tensors(member).items())
                    reason = "" if same else "the member built from the template differs from the plain one"
            except NotFromTemplate as error:
                reason = str(error)
        torch.set_rng_state(after)
        return (None if reason else template), reason

    def advance(self, config: Mapping) -> None:
        """Advance torch's RNG as ``model_factory(config)`` does, without building it: the factory's random draws
        recorded on the meta device (once per distinct value of the configuration keys it reads) and replayed.
        Raises :class:`NotFromTemplate` for another architecture or a factory that needs real tensors."""
        for keys, values, ops in self.recorded:
            if values == _values(config, keys):
                self.scratch.replay(ops)
                return
        seen = _ReadKeys(config)
        try:
            with guards_skipped([DeviceContext.__torch_function__, _RandomDraws.__torch_dispatch__]), \
                    torch.random.fork_rng(devices=[]), torch.device("meta"), _RandomDraws() as draws:
                model = self.model_factory(seen)  # (guards_skipped: these modes need no torch._dynamo before it loads)
        except Exception as error:  # a factory may need real values (data-dependent initialisation): plain build
            raise NotFromTemplate(f"the model factory does not run on the meta device ({type(error).__name__}: "
                                  f"{error})") from error
        if not isinstance(model, nn.Module) or _signature(model) != self.signature:
            raise NotFromTemplate("the configuration builds another architecture than the template's")
        if any(isinstance(v, torch.Generator) for op in draws.ops for v in tree_flatten(op[1:])[0]):
            raise NotFromTemplate("the model factory draws from its own torch.Generator")
        keys = None if seen.read is None else frozenset(seen.read)
        self.recorded.append((keys, _values(config, keys), draws.ops))
        self.scratch.replay(draws.ops)

    def member_tensors(self) -> dict[str, Tensor]:
        """The shrunk layers' tensors of the member whose full-size draws were just replayed (qualified names)."""
        return {f"{path}.{name}": tensor for path, layer in self.recipe.rebuild().items()
                for name, tensor in all_tensors(layer).items()}


def _values(config: Mapping, keys: frozenset | None) -> list:
    """The values of ``keys`` in ``config`` (every key: ``None``), missing keys as a marker."""
    chosen = sorted(config, key=repr) if keys is None else sorted(keys, key=repr)
    return [(repr(k), repr(config[k]) if k in config else None) for k in chosen] + ([len(config)] if keys is None else [])


_TEMPLATES: dict[Hashable, SurrogateTemplate | None] = {}  # per process: (factory, group, scale, options) -> template


def templates_in_process() -> int:
    """How many surrogate templates :func:`fused_surrogates` holds in this process (a reused worker's are kept)."""
    return len(_TEMPLATES)


def fused_surrogates(model_factory: Callable[[Mapping], nn.Module], configs: Sequence[Mapping], seeds: Sequence[int],
                     scale: int, shrink_options: Mapping, group: Hashable,
                     leaf_modules: Sequence[type[nn.Module]] = ()) -> tuple[FusedModel, nn.Module] | None:
    """The µP members of ``configs`` (one group: one architecture) at ``scale > 1``, fused, each bit for bit the
    member ``build_member`` builds after ``torch.manual_seed(seeds[i])`` (torch's RNG is left as after the last
    one), and the template's own member-shaped surrogate (its architecture and parameter names; its values are
    not any member's); ``None`` where they must be built the plain way (no usable template). ``group``: the configurations'
    group key; a template is made once per (factory, group, scale, options) in this process."""
    key = (model_factory, group, scale, tuple(sorted(shrink_options.items())))
    if key not in _TEMPLATES:
        template, reason = SurrogateTemplate.measure(model_factory, configs[0], scale, shrink_options, seeds[0])
        if reason:
            logger.info("members of group %s at scale %d are built one by one: %s", group, scale, reason)
        _TEMPLATES[key] = template
    template = _TEMPLATES[key]
    if template is None:
        return None
    fused = fuse_template(template.recipe.surrogate, len(configs), leaf_modules=leaf_modules)
    stacked = all_tensors(fused)
    with torch.no_grad():
        for i, (config, seed) in enumerate(zip(configs, seeds, strict=True)):
            torch.manual_seed(seed)
            try:
                template.advance(config)
            except NotFromTemplate as error:
                logger.info("member %d of group %s is built the plain way: %s", i, group, error)
                return None
            for name, tensor in template.member_tensors().items():
                stacked[name][i].copy_(tensor)
    return fused, template.recipe.surrogate
