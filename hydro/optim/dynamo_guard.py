"""``torch.optim``'s guards against ``torch.compile``, without importing ``torch._dynamo`` while nothing compiles.

``torch.optim.Optimizer``'s ``add_param_group``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` are wrapped
by ``torch._disable_dynamo``, which imports ``torch._dynamo`` on the first call (in the driver's workload check and
in every new trial process, on their critical path) only so that dynamo does not trace them. Until
``torch._dynamo`` is loaded nothing can be compiling and the guard has nothing to do, so calling the function it
wraps is the same; once it is loaded, the methods run as torch wrote them.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator

import torch

GUARDED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")
# torch._disable_dynamo's cache of the disabled function, an attribute of the function it wraps (torch/_compile.py)
_CACHE = "__dynamo_disable"


def dynamo_loaded() -> bool:
    """Whether ``torch._dynamo`` has been imported in this process (nothing compiles before)."""
    return "torch._dynamo" in sys.modules


def unguarded(name: str) -> Callable:
    """``torch.optim.Optimizer.<name>`` (one of :data:`GUARDED`), without its dynamo guard while
    ``torch._dynamo`` is not loaded, as torch wrote it once it is."""
    method = getattr(torch.optim.Optimizer, name)
    return method if dynamo_loaded() else getattr(method, "__wrapped__", method)


def optimizers_unguarded() -> contextlib.AbstractContextManager[None]:
    """Within: any ``torch.optim`` optimizer (e.g. one a user's factory builds) calls the :data:`GUARDED` methods
    without their dynamo guard, while ``torch._dynamo`` is not loaded (see :func:`guards_skipped`)."""
    return guards_skipped(getattr(torch.optim.Optimizer, name) for name in GUARDED)


@contextlib.contextmanager
def guards_skipped(guarded: Iterable[Callable]) -> Iterator[None]:
    """Within: the ``guarded`` functions (wrapped by ``torch._disable_dynamo``) call the functions they wrap
    directly while ``torch._dynamo`` is not loaded. Sets the guard's cache to the function itself and removes it
    after; a torch that keeps no such cache imports ``torch._dynamo`` as before."""
    functions = [] if dynamo_loaded() else [getattr(fn, "__wrapped__", None) for fn in guarded]
    set_here = [fn for fn in functions if fn is not None and getattr(fn, _CACHE, None) is None]
    for fn in set_here:
        setattr(fn, _CACHE, fn)
    try:
        yield
    finally:
        for fn in set_here:
            if getattr(fn, _CACHE, None) is fn:
                delattr(fn, _CACHE)
