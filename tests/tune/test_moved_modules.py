"""Run folders saved before the Ray package's modules moved into feature wings still unpickle: their old import
paths give the modules that now hold the classes."""
import importlib
import pickle

import pytest

import hydro.tune
from hydro.tune.moved_modules import MOVED
from hydro.tune.search.searcher import SearchState


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_module_at_its_new_path(old):
    assert importlib.import_module(old) is importlib.import_module(MOVED[old])


def test_a_searcher_state_pickled_under_the_old_path_loads():
    state = SearchState.__new__(SearchState)
    blob = pickle.dumps(state, protocol=0)
    assert b"hydro.tune.search.searcher" in blob
    old = blob.replace(b"hydro.tune.search.searcher", b"hydro.tune.searcher")
    assert type(pickle.loads(old)) is SearchState


def test_no_old_path_is_a_module_of_its_own():
    """An alias must not hide a module file that exists at that path."""
    package = hydro.tune.__path__[0]
    clashes = [old for old in MOVED if importlib.machinery.PathFinder.find_spec(old.rpartition(".")[2], [package])]
    assert not clashes, f"old paths that are modules again: {clashes}"
