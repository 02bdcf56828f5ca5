"""The patch layer every adapter uses: faithful unwrap, no double wrap, one warning."""

from __future__ import annotations

import copy
import itertools
import logging
import pickle
from unittest import mock

import pytest

from ckptprof.integrations.patching import Patcher, is_ours


class Loader:
    def load(self, path, map_location=None):
        return f"loaded {path}"


def counting(calls: list):
    def make(original):
        def wrapped(*args, **kwargs):
            calls.append(args)
            return original(*args, **kwargs)

        return wrapped

    return make


@pytest.fixture
def patcher():
    return Patcher("testframework", "pytest", "1.0 to 9.9")


def test_unwrap_puts_the_attribute_back_exactly(patcher):
    obj, calls = Loader(), []
    patcher.wrap(obj, "load", counting(calls), params=("path",))
    assert is_ours(vars(obj)["load"]) and obj.load("a") == "loaded a" and calls == [("a",)]
    patcher.unwrap_all()
    assert "load" not in vars(obj) and obj.load("b") == "loaded b" and calls == [("a",)]


def test_an_instance_attribute_of_its_own_is_restored(patcher):
    obj = Loader()
    own = mock.Mock(return_value="own")
    obj.load = own
    patcher.wrap(obj, "load", counting([]))
    assert obj.load("x") == "own"
    patcher.unwrap_all()
    assert vars(obj)["load"] is own


def test_wrapping_twice_wraps_once(patcher):
    obj, calls = Loader(), []
    patcher.wrap(obj, "load", counting(calls))
    patcher.wrap(obj, "load", counting(calls))
    obj.load("a")
    assert calls == [("a",)] and len(patcher.layers) == 1


def test_a_layer_placed_over_ours_stays_and_ours_becomes_a_pass_through(patcher):
    obj, calls = Loader(), []
    patcher.wrap(obj, "load", counting(calls))
    users = mock.Mock(wraps=obj.load)  # the user (or another library) wraps after us
    obj.load = users
    patcher.unwrap_all()
    assert obj.load is users  # theirs is not destroyed
    assert obj.load("z") == "loaded z" and users.call_count == 1
    assert calls == []  # and ours no longer records anything


def test_a_magicmock_keeps_its_methods(patcher):
    """delattr on a Mock marks the attribute deleted; the layer never uses it."""
    io = mock.MagicMock()
    child = io.save_checkpoint
    patcher.wrap(io, "save_checkpoint", counting([]))
    io.save_checkpoint({}, "p")
    patcher.unwrap_all()
    assert io.save_checkpoint is child and child.call_count == 1
    io.save_checkpoint({}, "q")  # no AttributeError
    assert child.call_count == 2


def test_a_missing_or_changed_target_is_one_warning_naming_version_and_phase(patcher, caplog):
    obj = Loader()
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        for _ in range(3):
            layer = patcher.wrap(obj, "gone", counting([]), label="Loader.gone", phase="fetch")
            assert layer is None
        changed = patcher.wrap(obj, "load", counting([]), label="Loader.load", params=("file",))
        assert changed is None
    messages = [r.getMessage() for r in caplog.records]
    gone = [m for m in messages if "Loader.gone" in m]
    assert len(gone) == 1 and "is not there" in gone[0] and "fetch will not be traced" in gone[0]
    assert "testframework" in gone[0] and "1.0 to 9.9" in gone[0]
    assert "training is not affected" in gone[0]
    assert any("Loader.load no longer takes (file, …)" in m for m in messages)
    assert "load" not in vars(obj) and obj.load("a") == "loaded a"


def test_a_property_on_the_class_is_left_alone(patcher, caplog):
    class WithProperty:
        @property
        def load(self):
            return lambda path: path

    obj = WithProperty()
    with caplog.at_level(logging.WARNING, logger="ckptprof"):
        assert patcher.wrap(obj, "load", counting([]), label="WithProperty.load") is None
    assert "cannot be wrapped on its instance" in caplog.text
    assert vars(obj) == {} and obj.load("x") == "x"


def test_a_scoped_layer_over_a_kept_one_goes_away_alone(patcher):
    obj, outer, inner = Loader(), [], []
    patcher.wrap(obj, "load", counting(outer))
    with patcher.scoped(obj, "load", counting(inner)):
        obj.load("a")
    obj.load("b")
    assert inner == [("a",)] and outer == [("a",), ("b",)]
    patcher.unwrap_all()
    assert "load" not in vars(obj)


def own_load(path, map_location=None):
    """An instance attribute of the user's own, under ckptprof's layers."""
    return f"own {path}"


@pytest.mark.parametrize("own", [False, True], ids=["class-method", "own-attribute"])
@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_stacked_layers_of_ckptprof_come_off_in_any_order(order, own):
    """Taken off in placement order, the upper layer put the lower, dead one back: the
    attribute stayed, one dead layer deeper per run."""
    obj = Loader()
    if own:
        obj.load = own_load
    before = dict(vars(obj))
    patchers = [Patcher("testframework", "pytest", "1.0 to 9.9") for _ in range(3)]
    calls = [[] for _ in patchers]
    for patcher, seen in zip(patchers, calls, strict=True):
        patcher.wrap(obj, "load", counting(seen))
    with patchers[0].scoped(obj, "load", counting([])):  # a call's own layer on top
        obj.load("a")
    assert calls == [[("a",)]] * 3
    removed = set()
    for index in order:
        patchers[index].unwrap_all()
        removed.add(index)
        obj.load(f"after {index}")
        traced = [(f"after {index}",) in seen for seen in calls]
        assert traced == [i not in removed for i in range(3)]  # the others still trace
    assert vars(obj) == before and all(vars(obj)[k] is v for k, v in before.items())


@pytest.mark.parametrize("own", [False, True], ids=["class-method", "own-attribute"])
@pytest.mark.parametrize("layers", [1, 2])
def test_a_copy_gets_the_attribute_it_would_have_without_ckptprof(layers, own):
    """A deep copy's wrapper called the original's method; a pickle raised."""
    obj = Loader()
    if own:
        obj.load = own_load
    patchers = [Patcher("testframework", "pytest", "1.0 to 9.9") for _ in range(layers)]
    calls: list = []
    for patcher in patchers:
        patcher.wrap(obj, "load", counting(calls))
    for copy_of in (copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))):
        twin = copy_of(obj)
        if own:
            assert vars(twin)["load"] is own_load
        else:
            assert twin.load.__self__ is twin and twin.load.__func__ is Loader.load
        assert twin.load("c") in ("loaded c", "own c") and calls == []
        alone = copy_of(vars(obj)["load"])  # the layer copied by itself
        assert not hasattr(alone, "__ckptprof_layer__") and alone("d") in ("loaded d", "own d")
    assert is_ours(vars(obj)["load"])  # the original keeps ckptprof's layer
    for patcher in patchers:
        patcher.unwrap_all()
