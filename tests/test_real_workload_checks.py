"""Checks before Ray starts for what real workloads bring: a key that changes the architecture but is missing from
``TuneSpec.group_by`` (found by building members of two different sampled configurations, named with the user's
values), and batch sizes that are not integers (per member, as a searcher draws them)."""
from __future__ import annotations

import pytest
from ray import tune

from hydro.trial.check import WorkloadError, check_group_by, check_member
from hydro.tune.run import prepare
from hydro.tune.search.space_check import check_batch_size_space
from tests.tune.real_workloads import dropout_not_grouped, width_not_grouped
from tests.tune.workload import spec


def test_a_width_outside_group_by_is_named_with_the_users_widths():
    workload, space = width_not_grouped()
    with pytest.raises(WorkloadError) as raised:
        prepare(workload, space, scale=4)  # the surrogates' widths would be 8 and 16
    message = str(raised.value)
    assert "TuneSpec.group_by misses 'width'" in message and "TuneSpec(group_by=['width'])" in message
    assert ("width=32 vs width=64" in message or "width=64 vs width=32" in message) and "8" not in message.split("(")[1]
    assert "lr" not in message.split("Fix")[0]  # the learning rate differs too, and fuses


def test_keys_in_group_by_and_keys_that_fuse_pass():
    workload, space = width_not_grouped(group_by=["width"])
    prepare(workload, space, scale=4)
    check_group_by(spec(), {"lr": 0.1, "momentum": 0.9}, {"lr": 0.01, "momentum": 0.0}, mup=False)


def test_a_dropout_p_outside_group_by_is_named():
    workload, space = dropout_not_grouped()
    config = {"lr": 0.1, "momentum": 0.9, "p": 0.1}
    with pytest.raises(WorkloadError, match=r"misses 'p'.*\(p=0.1 vs p=0.3\)"):
        check_group_by(workload, config, {"lr": 0.01, "p": 0.3}, mup=False)


def test_only_a_key_that_alone_breaks_fusion_is_blamed():
    """A value that fails to build on its own (a configuration error, rejected per member) is not a group_by
    miss."""
    workload = spec(model=lambda config: width_not_grouped()[0].model(config) if config["width"] > 0 else 1 / 0)
    check_group_by(workload, {"lr": 0.1, "momentum": 0.9, "width": 32}, {"width": -1}, mup=False)


@pytest.mark.parametrize("value", [tune.quniform(16, 128, 16), tune.qrandint(16, 128, 16), tune.lograndint(16, 129),
                                   tune.choice([16, 32.0]), {"grid_search": [16, 64]}, 64, 64.0,
                                   tune.sample_from(lambda _: 32)])
def test_integer_batch_size_domains_pass(value):
    check_batch_size_space({"batch_size": value})


def test_a_member_with_a_non_integer_batch_size_is_rejected():
    assert check_member(spec(), {"lr": 0.1, "momentum": 0.9, "batch_size": 97.7}) == \
        "ValueError: batch_size must be an integer >= 1, got 97.7"
    assert check_member(spec(), {"lr": 0.1, "momentum": 0.9, "batch_size": 64.0}) is None
