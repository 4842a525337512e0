"""The context-attribution method registry: every method is one registered scoring function.

A method is ``score(oracle, settings, gen) -> np.ndarray`` of k segment scores (larger = more
attributed), reading the model only through ``oracle`` (:class:`plantbench.suites.context.oracle.Oracle`:
``logp(masks)``, ``candidates(masks)``), with the suite's :class:`~plantbench.suites.context.settings.
Settings` and a seeded generator ``gen`` of its own. Register a method with one decorator line in
its own module of this package::

    @register("loo", "leave-one-out", scale="nats", interface="mass")
    def score(oracle, settings, gen): ...

A *learned* method (AT2) registers ``learn`` too: its ``score`` then returns the query's record
(its features and its own training labels), and after every query has been seen
``learn(records, folds, settings)`` returns every query's segment scores, each fitted only on the
records of the other fold (cross-fitting over facts: a context is never scored by weights
learned from its own ablations or its fact's other query).

``interface`` is the seed's source-separation rule the method is read through:
``contrastive`` (positive normalized score against the no-context baseline: ContextCite,
TracLLM) or ``mass`` (above-uniform share of the positive mass: AttriBoT, TokenSHAP).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plantbench.errors import ConfigError

ScoreFn = Callable[[Any, Any, np.random.Generator], Any]
LearnFn = Callable[[dict[str, Any], dict[str, int], Any], dict[str, np.ndarray]]
INTERFACES = ("contrastive", "mass")
BUILTIN_MODULES = ("contextcite", "attribot", "tracllm", "tokenshap", "at2", "attntrace")


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    scale: str
    interface: str
    fn: ScoreFn
    learn: LearnFn | None = None


_REGISTRY: dict[str, Method] = {}


def register(
    name: str, description: str, *, scale: str, interface: str, learn: LearnFn | None = None
) -> Callable[[ScoreFn], ScoreFn]:
    if interface not in INTERFACES:
        raise ValueError(f"interface must be one of {INTERFACES}, got {interface!r}")

    def deco(fn: ScoreFn) -> ScoreFn:
        _REGISTRY[name] = Method(name, description, scale, interface, fn, learn)
        return fn

    return deco


def _load() -> None:
    for mod in BUILTIN_MODULES:
        importlib.import_module(f"{__package__}.{mod}")


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def get(name: str) -> Method:
    _load()
    if name not in _REGISTRY:
        raise ConfigError(
            f"config key 'context.methods': {name!r} is not a registered context method "
            f"(registered: {', '.join(_REGISTRY)})"
        )
    return _REGISTRY[name]
