"""Checks of a Ray Tune ``param_space`` that need Ray's search-space types, made before any trial starts: a batch
size must be sampled as an integer (Hydro groups members by it and a ``DataLoader`` takes whole samples); and the
values the space samples, for :func:`hydro.trial.check.check_group_by`."""
from __future__ import annotations

from collections.abc import Mapping

from ray.tune.search.sample import Categorical, Domain, Float, Quantized

from hydro.checks import is_whole
from hydro.tune.search.random_search import RandomSearch

BATCH_SIZE_KEY = "batch_size"
INTEGER_DOMAINS = ("tune.choice([16, 32, 64, 128])", "tune.qrandint(16, 128, 16)", "tune.lograndint(16, 129)")


def check_batch_size_space(param_space: Mapping) -> None:
    """Raise ``ValueError`` when ``param_space["batch_size"]`` can give a non-integer batch size: a float range
    (``tune.uniform``, ``tune.loguniform``, ...; a quantized one with an integer step is whole), a float constant, or
    a choice or grid with a non-integer value. A ``tune.sample_from`` function is checked per member, when drawn
    (:func:`hydro.trial.check.check_member`)."""
    if not isinstance(param_space, Mapping) or BATCH_SIZE_KEY not in param_space:
        return
    value = param_space[BATCH_SIZE_KEY]
    if isinstance(value, Float):
        sampler = value.get_sampler()
        if isinstance(sampler, Quantized) and is_whole(sampler.q):
            return
        problem = f"is a float range [{value.lower}, {value.upper}], which samples non-integer batch sizes"
    elif isinstance(value, Categorical) or (isinstance(value, Mapping) and "grid_search" in value):
        values = value.categories if isinstance(value, Categorical) else value["grid_search"]
        wrong = [v for v in values if not is_whole(v)]
        if not wrong:
            return
        problem = f"offers non-integer batch sizes {wrong}"
    elif isinstance(value, Domain) or is_whole(value):
        return  # integer domains, and sample_from (checked per member)
    else:
        problem = f"is {value!r}, not an integer"
    raise ValueError(f"hydro: param_space['batch_size'] {problem}: Hydro would train with them truncated to integers "
                     f"and report the untruncated values. Sample integers instead, e.g. {', '.join(INTEGER_DOMAINS)}")


def other_values(param_space: dict, config: Mapping, seed: int, draws: int = 8) -> dict:
    """Per top-level key of ``config``, the first value other than ``config``'s in ``draws`` configurations drawn
    from ``param_space`` (keys that kept one value are left out)."""
    search, values = RandomSearch(param_space, seed=seed + 1), {}
    for draw in range(draws):
        for key, value in search.suggest(f"check{draw}").items():
            if key not in values and value != config.get(key):
                values[key] = value
    return values
