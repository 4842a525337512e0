"""The method registry: every attribution method is one registered scoring function.

Writing a method
----------------
A method is a function ``score(ctx, query_rows, pool_rows) -> np.ndarray``:

- ``ctx`` is a :class:`plantbench.attribution.methods.scoring_context.Context`: the model's pool table
  (``ctx.pool``), the queries (``ctx.queries``), the config, lazily loaded and checked features
  (``ctx.texts()``, ``ctx.query_texts()``, ``ctx.vectors("hidden" | "embed")``,
  ``ctx.query_grads(ckpt)``, ``ctx.pool_grads(ckpt, pool_rows)``, ``ctx.curvature(ckpt)``,
  ``ctx.tracin()`` = [(checkpoint, learning rate)], ``ctx.ekfac(ckpt=final)``,
  ``ctx.trackstar()`` = (pool, query) TrackStar features, ``ctx.final``) and ``ctx.cache``, a dict for
  anything the method wants to compute once (an index, preconditioned query gradients).
- ``query_rows`` / ``pool_rows`` are int64 arrays of row positions in ``ctx.queries`` /
  ``ctx.pool`` (the scoring engine passes tiles: consecutive rows, at most
  ``scoring.query_block`` x ``scoring.pool_block``).
- It returns a ``[len(query_rows), len(pool_rows)]`` array; larger = more attributed to that
  window. Non-finite values are stored as NaN and rank lowest.

Register a built-in method with one decorator line in its own module under
``plantbench/attribution/methods/``::

    @register("grad_dot", "dot product of projected loss gradients", needs=("grads",))
    def score(ctx, query_rows, pool_rows): ...

``needs`` names the features the method reads (:data:`FEATURES`); the Snakefile turns them into
the score rule's inputs (:func:`required_files`).

Plug-ins
--------
Your own method is a Python file, listed in the config::

    methods:
      plugins: [{name: mine, path: my_method.py}]   # path relative to the working directory

The file defines ``score(ctx, query_rows, pool_rows)`` as above and may define ``DESCRIPTION``
(one line), ``NEEDS`` (a list from :data:`FEATURES`, default none) and ``SCALE`` (one line on the
scores' scale and sign). The workflow then scores and grades ``mine`` like any built-in method.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plantbench import layout, userpaths
from plantbench.config import PLUGIN_FILE, builtin_methods
from plantbench.errors import ConfigError, PlantbenchError

ScoreFn = Callable[[Any, np.ndarray, np.ndarray], np.ndarray]

# Feature kinds a method can need (what plantbench.layout.feature_files maps to files).
FEATURES = {
    "text": "decoded pool window text (stream + tokenizer)",
    "hidden": "final-checkpoint hidden states of pool windows and queries",
    "embed": "text-encoder embeddings of pool windows and queries",
    "grads": "projected gradients at the final checkpoint (pool + queries)",
    "grads_tracin": "projected gradients at every TracIn checkpoint (pool + queries)",
    "curvature": "damped projected Fisher at the final checkpoint",
    "curvature_tracin": "damped projected Fisher at every TracIn checkpoint",
    "ekfac": "EK-FAC influence of every query on every pool window (final checkpoint)",
    "ekfac_tracin": "EK-FAC influence of every query on every pool window, every TracIn checkpoint",
    "trackstar": "TrackStar features (optimizer-corrected, projected, whitened, unit) of the "
    "pool windows and queries at the final checkpoint",
}


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    score: ScoreFn
    needs: tuple[str, ...] = ()
    scale: str = ""
    source: str = field(default="builtin")


_REGISTRY: dict[str, Method] = {}
_loaded_builtins = False


def register(
    name: str, description: str, *, needs: tuple[str, ...] | list[str] = (), scale: str = ""
) -> Callable[[ScoreFn], ScoreFn]:
    """Decorator: register ``fn`` as method ``name`` (one line of ``description``)."""

    def deco(fn: ScoreFn) -> ScoreFn:
        _add(Method(name, description, fn, tuple(needs), scale, source=fn.__module__), where=name)
        return fn

    return deco


def _add(m: Method, where: str) -> None:
    bad = [n for n in m.needs if n not in FEATURES]
    if bad:
        raise ConfigError(
            f"method '{where}' needs unknown features {bad}; known: {', '.join(FEATURES)}"
        )
    old = _REGISTRY.get(m.name)
    if old is not None and old.source != m.source:
        raise ConfigError(
            f"method name '{m.name}' is already registered (by {old.source}); pick another name"
        )
    _REGISTRY[m.name] = m


def _load_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        for mod in builtin_methods():
            importlib.import_module(f"plantbench.attribution.methods.{mod}")
        _loaded_builtins = True


def load_plugin(name: str, path: str | Path) -> Method:
    """Register the ``score`` function of the Python file ``path`` as method ``name``."""
    _load_builtins()
    what = f"methods.plugins: plug-in '{name}' file"
    p = userpaths.check(path, userpaths.FILE, what, PLUGIN_FILE)
    spec = importlib.util.spec_from_file_location(f"plantbench_plugin_{name}", p)
    if spec is None or spec.loader is None:
        raise ConfigError(
            f"methods.plugins: cannot import plug-in '{name}' from '{p}' (not a Python file?)"
        )
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(
            f"methods.plugins: plug-in '{name}' ('{p}') failed to import: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(module, "score", None)
    if not callable(fn):
        raise ConfigError(
            f"methods.plugins: '{p}' defines no function score(ctx, query_rows, pool_rows)"
        )
    source = f"plugin:{p.resolve()}"
    if name in _REGISTRY and _REGISTRY[name].source != source:
        raise ConfigError(
            f"methods.plugins: name '{name}' is already a registered method; "
            "give the plug-in another name"
        )
    m = Method(
        name,
        _text_declaration(module, "DESCRIPTION", f"plug-in {p.name}", name, p),
        _guarded(name, p, fn),
        _needs_declaration(module, name, p),
        _text_declaration(module, "SCALE", "", name, p),
        source=source,
    )
    _add(m, where=f"{name} ({p})")
    return m


def _text_declaration(module: Any, attr: str, default: str, name: str, p: Path) -> str:
    """A plug-in's ``DESCRIPTION`` or ``SCALE``: a string (its first line is kept)."""
    value = getattr(module, attr, default)
    if not isinstance(value, str):
        raise ConfigError(
            f"methods.plugins: plug-in '{name}' ('{p}') sets {attr} = {value!r}; "
            f"make {attr} one line of text (a str)"
        )
    return (value.splitlines() or [""])[0]


def _needs_declaration(module: Any, name: str, p: Path) -> tuple[str, ...]:
    """A plug-in's ``NEEDS``: a list or tuple of feature names from :data:`FEATURES` (a bare
    string is refused, not split into letters)."""
    value = getattr(module, "NEEDS", ())
    ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    if not ok:
        hint = f"[{value!r}]" if isinstance(value, str) else "a list of feature names"
        raise ConfigError(
            f"methods.plugins: plug-in '{name}' ('{p}') sets NEEDS = {value!r}; write NEEDS = "
            f"{hint} (known: {', '.join(FEATURES)})"
        )
    return tuple(value)


def _tile(rows: np.ndarray) -> str:
    return f"{int(rows[0])}-{int(rows[-1])}" if len(rows) else "none"


def _guarded(name: str, p: Path, fn: ScoreFn) -> ScoreFn:
    """``fn`` behind the plug-in boundary: an exception or a return that is not numbers becomes
    one line naming the plug-in, the query tile and the fix."""

    def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
        where = (
            f"plug-in '{name}' ('{p}') on the tile of query rows {_tile(query_rows)} x "
            f"pool rows {_tile(pool_rows)}"
        )
        try:
            out = fn(ctx, query_rows, pool_rows)
        except PlantbenchError:
            raise
        except Exception as exc:
            said = (str(exc).splitlines() or [""])[0]
            raise PlantbenchError(
                f"{where} raised {type(exc).__name__}: {said}; fix score() in '{p}' and rerun"
            ) from None
        try:
            return np.asarray(out, dtype=np.float64)
        except (TypeError, ValueError):
            raise PlantbenchError(
                f"{where} returned {type(out).__name__} that is not numbers; make score() return "
                f"a [{len(query_rows)}, {len(pool_rows)}] array of floats"
            ) from None

    return score


def load_plugins(cfg: dict[str, Any]) -> list[Method]:
    """Register every plug-in listed in ``methods.plugins``."""
    return [load_plugin(p["name"], p["path"]) for p in cfg["methods"].get("plugins", [])]


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get(name: str) -> Method:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"unknown method '{name}'; registered methods: {', '.join(available())} "
            "(add your own with methods.plugins)"
        ) from None


def enabled(cfg: dict[str, Any]) -> list[str]:
    """Methods the workflow scores: ``methods.enabled`` then every plug-in (checked)."""
    load_plugins(cfg)
    names = list(cfg["methods"]["enabled"])
    for n in names:
        get(n)
    names += [p["name"] for p in cfg["methods"].get("plugins", []) if p["name"] not in names]
    return names


def code_file(name: str) -> Path:
    """The Python file that scores ``name``: its plug-in file or its built-in module."""
    m = get(name)
    if m.source.startswith("plugin:"):
        return Path(m.source.removeprefix("plugin:"))
    return Path(str(importlib.import_module(m.source).__file__))


def code_hash(name: str) -> str:
    """xxh3 of the file that scores ``name`` (recorded in its scores; a change reruns them)."""
    from plantbench.hashing import hash_file

    path = userpaths.check(
        code_file(name), userpaths.FILE, f"method '{name}': its code file", PLUGIN_FILE
    )
    return hash_file(path)


def describe() -> list[tuple[str, str]]:
    return [(n, _REGISTRY[n].description) for n in available()]


# what makes a method a gradient method (the fidelity stage grades those)
GRADIENT_NEEDS = frozenset({"grads", "grads_tracin"})


def gradient_methods(cfg: dict[str, Any]) -> list[str]:
    """The enabled methods that read projected gradients, in config order (the fidelity stage
    grades them; none: no fidelity stage)."""
    load_plugins(cfg)
    return [m for m in enabled(cfg) if GRADIENT_NEEDS & set(get(m).needs)]


def method_inputs(cfg: dict[str, Any], method: str, model: str) -> list[str]:
    """The feature files ``method`` reads for ``model`` (the score rule's inputs)."""
    load_plugins(cfg)
    return layout.feature_files(cfg, model, get(method).needs)


def ekfac_checkpoints(cfg: dict[str, Any]) -> list[str]:
    """The checkpoints at which an enabled method needs an EK-FAC fit: the final one
    (``ekfac``), the other TracIn checkpoints (``ekfac_tracin``). Their ``grads_pool`` jobs also
    sum EK-FAC's Kronecker factors (:mod:`plantbench.attribution.ekfac.factors`)."""
    load_plugins(cfg)
    needs = {n for m in enabled(cfg) for n in get(m).needs}
    final = layout.final_checkpoint(cfg)
    out = [final] if "ekfac" in needs else []
    if "ekfac_tracin" in needs:
        out += [c for c in layout.tracin_checkpoints(cfg) if c != final]
    return out
