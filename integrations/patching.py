"""Instance patches that can always be undone, declared per framework as a table.

Every adapter wraps a few methods of the framework objects it was given (never a class,
never a module). Each wrap is a :class:`Layer` placed in the object's own ``__dict__``:

* the wrapper takes ``*args, **kwargs`` and always calls the method it wrapped;
* removing it takes out only ckptprof's layer: if nothing was placed over it, the
  attribute is put back exactly as it was (the instance entry deleted, or the previous
  one restored — never ``delattr``, which a ``Mock`` turns into "attribute deleted");
  if the user or another library put its own wrapper over ours, theirs stays and ours
  becomes a pass-through. ckptprof's own layers stacked on one attribute (two adapters
  on one object) come off in any order: a layer left as a pass-through under another of
  ckptprof's is skipped when that one comes off, so the last one out leaves the
  attribute as it was before the first;
* a copy of the object (``pickle``, ``copy.deepcopy``; Ray Tune pickles Trainers) gets
  the attribute as it would without ckptprof: the copy's own method (or the value that
  was there before ckptprof's layers), never a wrapper calling into the original;
* a target that is missing, cannot be patched, or whose leading parameters changed is
  left alone with one warning naming the framework, its version and the phase that will
  be missing; the job runs unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("ckptprof")

_MISSING = object()
# targets already warned about in this process (one warning each, not one per trainer)
_WARNED: set[str] = set()


@dataclass(frozen=True)
class Target:
    """One method an adapter wraps.

    Args:
        owner: dotted path from the instrumented object to the object holding the method
            (``"strategy"``, ``"checkpoint_engine"``; ``""`` for the instrumented object).
        name: the method.
        wrapper: name of the adapter method that makes the wrapper from the original.
        phase: what ckptprof cannot trace without it (for the warning).
        params: the leading parameter names the method must still take (its signature
            is checked before wrapping); None to skip the check.
        when: name of an adapter predicate ``(root) -> bool``; the target applies only
            when it returns True (e.g. only with an ``AsyncCheckpointIO``).
    """

    owner: str
    name: str
    wrapper: str
    phase: str
    params: tuple[str, ...] | None = None
    when: str | None = None

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}" if self.owner else self.name


class Layer:
    """ckptprof's wrapper on one attribute of one object."""

    def __init__(self, obj: Any, name: str, original: Callable, previous: Any) -> None:
        self.obj = obj
        self.name = name
        self.original = original
        self.previous = previous
        self.active = True
        self.function: Callable | None = None

    def remove(self) -> None:
        """Take ckptprof's layer out (see the module docstring); idempotent."""
        self.active = False
        namespace = vars(self.obj)
        if namespace.get(self.name, _MISSING) is not self.function:
            return  # something was placed over ours, or replaced it: theirs stays
        previous = self.previous
        while _layer_of(previous) is not None and not _layer_of(previous).active:
            previous = _layer_of(previous).previous  # ours, already taken out: skipped
        if previous is _MISSING:
            del namespace[self.name]
        else:
            namespace[self.name] = previous

    def underneath(self) -> Any:
        """What the attribute was before any of ckptprof's layers (``_MISSING``: none)."""
        previous = self.previous
        while _layer_of(previous) is not None:
            previous = _layer_of(previous).previous
        return previous


class LayerFunction:
    """The callable a :class:`Layer` places: ``body`` while the layer is active, else
    the wrapped method alone. Copied or pickled (with its object or alone), it becomes
    what the attribute is without ckptprof (see the module docstring)."""

    def __init__(self, layer: Layer, body: Callable, original: Callable) -> None:
        self.__ckptprof_layer__ = layer
        self._body = body
        self._original = original
        functools.update_wrapper(self, original, updated=())

    def __call__(self, *args, **kwargs):
        if self.__ckptprof_layer__.active:
            return self._body(*args, **kwargs)
        return self._original(*args, **kwargs)

    def __reduce_ex__(self, protocol):
        layer = self.__ckptprof_layer__
        below = layer.underneath()
        if below is _MISSING:
            # the copy's own attribute: its object is being rebuilt (memoized, its state
            # not yet set), so the lookup finds the class's method, bound to the copy
            return getattr, (layer.obj, layer.name)
        return _same, (below,)

    def __repr__(self) -> str:
        return f"<ckptprof layer over {self._original!r}>"


def _same(value: Any) -> Any:
    return value


def _layer_of(value: Any) -> Layer | None:
    return value.__ckptprof_layer__ if isinstance(value, LayerFunction) else None


def framework_version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "(version unknown)"


def leading_params_match(fn: Callable, params: tuple[str, ...]) -> bool:
    """Whether ``fn`` still takes ``params`` first (True when it cannot be told)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    positional = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    takes_anything = any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values())
    if takes_anything and len(positional) < len(params):
        return positional == list(params[: len(positional)])
    return positional[: len(params)] == list(params)


def argument(args: tuple, kwargs: dict, name: str, index: int, default: Any = None) -> Any:
    """The call's value of parameter ``name`` (at position ``index``), without binding."""
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


def replace_argument(
    args: tuple, kwargs: dict, name: str, index: int, value: Any
) -> tuple[tuple, dict]:
    """The call's ``args, kwargs`` with parameter ``name`` (at ``index``) set to ``value``."""
    if name not in kwargs and len(args) > index:
        return (*args[:index], value, *args[index + 1 :]), kwargs
    return args, {**kwargs, name: value}


def resolve(root: Any, owner: str) -> Any:
    """The object at ``owner`` (a dotted path) from ``root``; None when absent."""
    obj = root
    for part in filter(None, owner.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class Patcher:
    """The layers one adapter placed, removable all at once.

    Args:
        framework: the framework's name, for warnings.
        distribution: its package name (for its version in warnings).
        known: the versions the table is known to fit (e.g. ``"2.2 to 2.6"``).
    """

    def __init__(self, framework: str, distribution: str, known: str) -> None:
        self.framework = framework
        self.distribution = distribution
        self.known = known
        self.layers: list[Layer] = []

    def warn(self, label: str, phase: str, why: str) -> None:
        """One warning per target per process: what is missing and that the job is fine."""
        key = f"{self.framework}:{label}"
        if key in _WARNED:
            return
        _WARNED.add(key)
        version = framework_version(self.distribution)
        log.warning(
            "ckptprof: %s %s: %s %s, so %s will not be traced (ckptprof's patch table fits %s "
            "%s); training is not affected.",
            self.framework,
            version,
            label,
            why,
            phase,
            self.framework,
            self.known,
        )

    def wrap(
        self,
        obj: Any,
        name: str,
        make: Callable[[Callable], Callable],
        *,
        label: str | None = None,
        phase: str = "a phase",
        params: tuple[str, ...] | None = None,
    ) -> Layer | None:
        """Wrap ``obj.name`` with ``make(original)`` on this instance; once per object."""
        label = label or name
        for layer in self.layers:
            if layer.obj is obj and layer.name == name and layer.active:
                return layer  # already ours: never double-wrapped
        return self._place(obj, name, make, label, phase, params, keep=True)

    @contextlib.contextmanager
    def scoped(
        self,
        obj: Any,
        name: str,
        make: Callable[[Callable], Callable],
        *,
        label: str | None = None,
        phase: str = "a phase",
        params: tuple[str, ...] | None = None,
    ) -> Iterator[Layer | None]:
        """Like :meth:`wrap`, for one call of the framework: removed when the block ends
        (it may sit over one of ckptprof's own layers, e.g. a timer around it)."""
        layer = self._place(obj, name, make, label or name, phase, params, keep=False)
        try:
            yield layer
        finally:
            if layer is not None:
                layer.remove()

    def unwrap_all(self) -> None:
        """Remove every layer, newest first; safe to call twice."""
        while self.layers:
            self.layers.pop().remove()

    def _place(self, obj, name, make, label, phase, params, keep: bool) -> Layer | None:
        if obj is None:
            self.warn(label, phase, "is not there")
            return None
        original = getattr(obj, name, _MISSING)
        if original is _MISSING or not callable(original):
            self.warn(label, phase, "is not there")
            return None
        if params is not None and not leading_params_match(original, params):
            self.warn(label, phase, f"no longer takes ({', '.join(params)}, …)")
            return None
        try:
            namespace = vars(obj)
        except TypeError:
            self.warn(label, phase, "cannot be wrapped on its instance")
            return None
        layer = Layer(obj, name, original, namespace.get(name, _MISSING))
        wrapper = LayerFunction(layer, make(original), original)
        layer.function = wrapper
        namespace[name] = wrapper
        if getattr(obj, name, None) is not wrapper:  # e.g. a property on the class wins
            layer.remove()
            self.warn(label, phase, "cannot be wrapped on its instance")
            return None
        if keep:
            self.layers.append(layer)
        return layer

    @property
    def attached(self) -> bool:
        return bool(self.layers)


def is_ours(value: Any) -> bool:
    """Whether ``value`` is an active ckptprof layer."""
    layer = getattr(value, "__ckptprof_layer__", None)
    return isinstance(layer, Layer) and layer.active


__all__ = [
    "Layer",
    "LayerFunction",
    "Patcher",
    "Target",
    "argument",
    "is_ours",
    "leading_params_match",
    "replace_argument",
    "resolve",
]
