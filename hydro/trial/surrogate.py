"""The one place that builds member models: the user's full-size model, or its µP version (Model Shrinker); and
the µP members of one fused trial at once, from one shrunk template per architecture and scale.

A µP surrogate (scale > 1) draws only the random numbers it keeps. Its shrunk layers are built anew at their own
sizes (torch's initialisation, then µP's rescaling; :func:`hydro.shrink`), and where every tensor of the surrogate
belongs to such a layer they draw first from torch's RNG as it was when the member's build began (its seed): the
full-size model's initialisation, which the surrogate does not use, is undone. Where the surrogate takes tensors
from the full-size model (parameters sliced in ``forward``, layers without a width kept as they are), the full-size
model draws first and the shrunk layers after it. :class:`SurrogateTemplate` builds members of the first kind
without initialising a full-size model or tracing each member: the factory runs on the meta device (no tensors)
once per distinct value of the configuration keys it reads, only to check the architecture, and only the shrunk
layers are built and copied into the fused model.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence

import torch
from torch import Tensor, nn
from torch.utils._device import DeviceContext

from hydro.binder import FusedModel, TracedTemplate, trace_template
from hydro.nn.registry import all_tensors
from hydro.optim.dynamo_guard import guards_skipped
from hydro.shrink.shrink import ShrinkRecipe, shrink_recipe

logger = logging.getLogger(__name__)


def build_member(model_factory: Callable[[Mapping], nn.Module], config: Mapping, scale: int,
                 mup: bool | None = None, shrink_options: Mapping | None = None) -> nn.Module:
    """``model_factory(config)`` as written (``scale == 1``, no µP), or in µP with its widths divided by
    ``scale`` via ``hydro.shrink``. ``mup`` defaults to ``scale > 1``; ``scale=1, mup=True`` is the full-size
    target of a surrogate run: the model as written (same parameters and function) with the µP shapes through
    which the surrogates' hyperparameters transfer (every multiplier 1). ``shrink_options``: keywords for
    ``hydro.shrink`` (``TuneSpec.shrink_options()``).

    Random draws (torch's CPU RNG as of the call): the model's own initialisation, then at ``scale > 1`` the shrunk
    layers'; except where the surrogate keeps no tensor of the full-size model: then its shrunk layers draw from
    the RNG as of the call and the full-size initialisation's draws are undone (the RNG is left after the shrunk
    layers' draws)."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1 (1 = full size), got {scale}")
    start = torch.get_rng_state()
    model = model_factory(config)
    if not (scale > 1 if mup is None else mup):
        if scale != 1:
            raise ValueError(f"scale={scale} shrinks the model, which needs µP (mup=True)")
        return model
    recipe = shrink_recipe(model, scale, **(shrink_options or {}))
    if scale > 1 and _only_rebuilt(recipe):
        torch.set_rng_state(start)
        tensors = all_tensors(recipe.surrogate)
        with torch.no_grad():
            for name, value in _rebuilt_tensors(recipe).items():
                tensors[name].copy_(value)
    return recipe.surrogate


def _only_rebuilt(recipe: ShrinkRecipe) -> bool:
    """Whether every tensor of the recipe's surrogate belongs to a rebuilt (shrunk) layer."""
    return recipe.rebuilt_tensor_names() == set(all_tensors(recipe.surrogate))


def _rebuilt_tensors(recipe: ShrinkRecipe) -> dict[str, Tensor]:
    """The recipe's shrunk layers drawn again from torch's RNG, as tensors by qualified name (read them before the
    next call: layers are reset in place)."""
    return {f"{path}.{name}": tensor for path, layer in recipe.rebuild().items()
            for name, tensor in all_tensors(layer).items()}


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
    """A model's architecture as far as building members goes: per module its type, ``extra_repr`` and plain
    attributes (e.g. a dropout probability, read in ``forward``), then tensor names, shapes and dtypes."""
    return [(path, type(module), module.extra_repr(), _settings(module)) for path, module in model.named_modules()] + \
        [(name, tuple(t.shape), t.dtype) for name, t in all_tensors(model).items()]


def _settings(module: nn.Module) -> list[tuple[str, object]]:
    """A module's public attributes that are neither tensors nor modules, by name."""
    return sorted(((k, v) for k, v in vars(module).items() if not k.startswith("_")
                   and not isinstance(v, (Tensor, nn.Module))), key=lambda item: item[0])


def _same(a: list[tuple], b: list[tuple]) -> bool:
    """``a == b``, false where comparing raises (e.g. an array-valued attribute)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (any value's __eq__ may raise)
        return False


class NotFromTemplate(Exception):
    """A member cannot be built from the template (its configuration builds another architecture, or its
    factory does not run on the meta device): build it the plain way."""


class SurrogateTemplate:
    """One µP surrogate architecture (a factory, a group of configurations, a scale), shrunk once.

    ``recipe``: how ``hydro.shrink`` built it (every tensor of its surrogate in a shrunk layer); ``signature``: the
    full-size model's architecture. Members come out bit for bit as ``build_member`` builds them after
    ``torch.manual_seed`` of their seed."""

    def __init__(self, model_factory: Callable[[Mapping], nn.Module], recipe: ShrinkRecipe,
                 signature: list[tuple]) -> None:
        self.model_factory, self.recipe, self.signature = model_factory, recipe, signature
        self.checked: list[tuple[frozenset | None, list]] = []  # (keys read, their values) of this architecture
        self.traced: dict[tuple[type[nn.Module], ...], TracedTemplate] = {}  # by leaf modules

    def fuse(self, num_members: int, leaf_modules: Sequence[type[nn.Module]]) -> FusedModel:
        """``num_members`` members of this architecture fused (``hydro.binder.fuse_template``; traced once per
        ``leaf_modules``), holding the template surrogate's values."""
        key = tuple(leaf_modules)
        if key not in self.traced:
            self.traced[key] = trace_template(self.recipe.surrogate, leaf_modules=key)
        return self.traced[key].fuse(num_members)

    @classmethod
    def make(cls, model_factory: Callable[[Mapping], nn.Module], config: Mapping, scale: int,
             shrink_options: Mapping) -> tuple[SurrogateTemplate | None, str]:
        """The template of ``config``'s architecture at ``scale`` (its full-size model built and shrunk on the meta
        device: no random draws; the template's surrogate holds zeros), or ``None`` and why where members must be
        built the plain way."""
        try:
            full, keys = _on_meta(model_factory, config)
            recipe = shrink_recipe(full, scale, **shrink_options)
        except NotFromTemplate as error:
            return None, str(error)
        except Exception as error:  # noqa: BLE001 (the plain build raises it again, or succeeds on real tensors)
            return None, f"hydro.shrink fails on the meta device ({type(error).__name__}: {error})"
        if not _only_rebuilt(recipe):
            return None, "some of the surrogate's tensors are taken from the full-size model (sliced or kept as is)"
        template = cls(model_factory, recipe.materialised("cpu"), _signature(full))
        template.checked.append((keys, _values(config, keys)))
        return template, ""

    def check(self, config: Mapping) -> None:
        """Raises :class:`NotFromTemplate` where ``model_factory(config)`` builds another architecture than the
        template's, or cannot run on the meta device (it runs there once per distinct value of the configuration
        keys it reads)."""
        if any(values == _values(config, keys) for keys, values in self.checked):
            return
        model, keys = _on_meta(self.model_factory, config)
        if not _same(_signature(model), self.signature):
            raise NotFromTemplate("the configuration builds another architecture than the template's")
        self.checked.append((keys, _values(config, keys)))

    def member_tensors(self, seed: int) -> dict[str, Tensor]:
        """The tensors of the member of ``seed`` (qualified names; read them before the next call): torch's CPU
        generator seeded with ``seed``, then the shrunk layers drawn."""
        torch.default_generator.manual_seed(seed)
        return _rebuilt_tensors(self.recipe)


def _on_meta(model_factory: Callable[[Mapping], nn.Module], config: Mapping) -> tuple[nn.Module, frozenset | None]:
    """``model_factory(config)`` built on the meta device (torch's RNG is left as it was), and the configuration
    keys it read (``None``: all). Raises :class:`NotFromTemplate` where it cannot run there."""
    seen = _ReadKeys(config)
    try:
        with guards_skipped([DeviceContext.__torch_function__]), torch.random.fork_rng(devices=[]), \
                torch.device("meta"):
            model = model_factory(seen)  # (guards_skipped: the mode needs no torch._dynamo before it loads)
    except Exception as error:  # a factory may need real values (data-dependent initialisation): plain build
        raise NotFromTemplate(f"the model factory does not run on the meta device ({type(error).__name__}: "
                              f"{error})") from error
    if not isinstance(model, nn.Module):
        raise NotFromTemplate(f"the model factory returned a {type(model).__name__}, not an nn.Module")
    return model, None if seen.read is None else frozenset(seen.read)


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
    not any member's); ``None`` where they must be built the plain way (no usable template). ``group``: the
    configurations' group key; a template is made once per (factory, group, scale, options) in this process."""
    key = (model_factory, group, scale, tuple(sorted(shrink_options.items())))
    if key not in _TEMPLATES:
        template, reason = SurrogateTemplate.make(model_factory, configs[0], scale, shrink_options)
        if reason:
            logger.info("members of group %s at scale %d are built one by one: %s", group, scale, reason)
        _TEMPLATES[key] = template
    template = _TEMPLATES[key]
    if template is None:
        return None
    if len(seeds) != len(configs):
        raise ValueError(f"fused_surrogates: {len(configs)} configurations but {len(seeds)} seeds")
    for i, config in enumerate(configs):
        try:
            template.check(config)
        except NotFromTemplate as error:
            logger.info("member %d of group %s is built the plain way: %s", i, group, error)
            return None
    fused = template.fuse(len(configs), leaf_modules)
    stacked = all_tensors(fused)
    with torch.no_grad():
        for i, seed in enumerate(seeds):
            for name, tensor in template.member_tensors(seed).items():
                stacked[name][i].copy_(tensor)
    after = torch.get_rng_state()
    torch.manual_seed(seeds[-1])  # every device's generator as the last member's seeding left it
    torch.set_rng_state(after)
    return fused, template.recipe.surrogate
