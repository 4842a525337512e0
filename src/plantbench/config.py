"""Load, merge and validate the study configuration.

The schema (``schemas/config.schema.yaml``, linked from ``workflow/schemas/``) is the single
definition of every knob. Errors are one line: the key, what is wrong, the allowed values.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from plantbench import layout, userpaths
from plantbench.errors import ConfigError
from plantbench.hashing import hash_bytes

SCHEMA_NAME = "config.schema.yaml"


def schema() -> dict[str, Any]:
    text = resources.files("plantbench").joinpath("schemas", SCHEMA_NAME).read_text()
    return yaml.safe_load(text)


# train.* keys that say how to run, not what to compute: left out of the training's config hash
TRAIN_EXECUTION_KEYS = ("threads", "devices", "compile")


def train_recipe(cfg: dict[str, Any]) -> dict[str, Any]:
    """The ``train`` section without its execution keys: what the weights depend on."""
    return {k: v for k, v in cfg["train"].items() if k not in TRAIN_EXECUTION_KEYS}


def builtin_methods() -> tuple[str, ...]:
    """The built-in attribution methods (the schema's ``$defs.builtin_methods``): the registry
    loads one module of each name, and a plug-in may not reuse one."""
    return tuple(schema()["$defs"]["builtin_methods"]["enum"])


def schema_path() -> Path:
    return Path(str(resources.files("plantbench").joinpath("schemas", SCHEMA_NAME)))


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``over`` into ``base`` the way Snakemake merges ``--configfile`` files."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _key_path(err: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in err.absolute_path]
    return ".".join(parts) if parts else "(top level)"


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _yaml_spelling(text: str, integer: bool) -> str:
    """How to write the number ``text`` so that YAML 1.1 (PyYAML) reads it as a number."""
    value = float(text)
    if integer:
        return str(int(value))
    mantissa, _, exponent = text.lower().partition("e")
    if not exponent:
        return text
    if "." not in mantissa:
        mantissa += ".0"
    if exponent[0] not in "+-":
        exponent = "+" + exponent
    spelled = f"{mantissa}e{exponent}"
    return spelled if isinstance(yaml.safe_load(spelled), float) else repr(value)


def _number_hint(value: Any, expected: Any) -> str:
    """The fix for a number that arrived as a string (YAML 1.1 reads ``3e-3`` as one)."""
    wants = set(expected) if isinstance(expected, list) else {expected}
    if not isinstance(value, str) or not wants & {"number", "integer"}:
        return ""
    text = value.strip()
    if not _NUMBER.fullmatch(text):
        return ""
    integer = "number" not in wants
    if integer and not float(text).is_integer():
        return ""
    spelled = _yaml_spelling(text, integer)
    if spelled == text:
        return "; write it without quotes"
    return f"; YAML reads {text} as a string: write {spelled}"


def describe_error(err: jsonschema.ValidationError) -> str:
    """Turn a jsonschema error into one line: key, problem, allowed values."""
    key = _key_path(err)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        where = key if key != "(top level)" else "config"
        name = (
            f"{where}.{extra[0]}" if where != "config" and extra else (extra[0] if extra else where)
        )
        return f"unknown config key '{name}'; allowed keys here: {', '.join(allowed)}"
    if v == "enum":
        allowed = ", ".join(json.dumps(x) for x in err.validator_value)
        return (
            f"config key '{key}' = {json.dumps(err.instance)} is not allowed; use one of: {allowed}"
        )
    if v == "required":
        have = err.instance if isinstance(err.instance, dict) else {}
        missing = next((r for r in err.validator_value if r not in have), "?")
        where = f"{key}.{missing}" if key != "(top level)" else missing
        return f"config is missing a required key: '{where}'; add it (see config.yaml)"
    if v == "type":
        return (
            f"config key '{key}' = {json.dumps(err.instance)} has the wrong type; "
            f"expected {err.validator_value}" + _number_hint(err.instance, err.validator_value)
        )
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return f"config key '{key}' = {err.instance} is out of range; it must be {op} {err.validator_value}"
    shown = f"config key '{key}' = {json.dumps(err.instance)}"
    if v == "minItems":
        return f"{shown} has too few items; give at least {err.validator_value}"
    if v == "maxItems":
        return f"{shown} has too many items; give at most {err.validator_value}"
    if v == "uniqueItems":
        return f"{shown} repeats an item; list each one once"
    if v == "minLength":
        return f"{shown} is too short; give at least {err.validator_value} character(s)"
    if v == "pattern":
        return f"{shown} is not allowed; it must match {err.validator_value}"
    return f"config key '{key}': {err.message}"


def validate(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Validate against the schema, then the cross-key rules and the results folder's place.
    Returns a plain copy."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(list(e.absolute_path)), e.path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(describe_error(best))
    out = json.loads(json.dumps(cfg))
    _check_semantics(out)
    check_results_location(out["results"])
    return out


def _check_semantics(cfg: dict[str, Any]) -> None:
    """The rules one key's schema cannot say: each names the keys involved and the fix."""
    _check_model(cfg["model"])
    _check_batches(cfg["train"])
    _check_spans(cfg)
    _check_prefix(cfg)
    _check_grid_fits(cfg)
    _check_corpus(cfg["corpus"])
    _check_tracin(cfg)
    _check_methods(cfg["methods"])
    _check_haystack(cfg["analysis"])


def _check_model(m: dict[str, Any]) -> None:
    if m["n_embd"] % m["n_head"]:
        raise ConfigError(
            f"config key 'model.n_embd' = {m['n_embd']} must be divisible by "
            f"'model.n_head' = {m['n_head']}; change one of them"
        )
    if (m["n_embd"] // m["n_head"]) % 2:
        raise ConfigError(
            "config key 'model.n_embd' / 'model.n_head' must be even (rotary embeddings); "
            "change model.n_embd or model.n_head"
        )


def _check_batches(t: dict[str, Any]) -> None:
    if t["batch_windows"] % t["micro_batch_windows"]:
        raise ConfigError(
            f"config key 'train.batch_windows' = {t['batch_windows']} must be a multiple of "
            f"'train.micro_batch_windows' = {t['micro_batch_windows']}"
        )
    if t["batch_windows"] % (t["devices"] * t["micro_batch_windows"]):
        raise ConfigError(
            f"config key 'train.batch_windows' = {t['batch_windows']} must be a multiple of "
            f"'train.devices' x 'train.micro_batch_windows' = {t['devices']} x "
            f"{t['micro_batch_windows']} (each process takes batch_windows / devices windows)"
        )


POSITION_ORDER = ("early", "middle", "late")


def _check_spans(cfg: dict[str, Any]) -> None:
    """Every used position has a span [start, end) with start < end; the spans come in the
    order early, middle, late and do not overlap (one may start where the previous ends)."""
    spans = cfg["stream"]["position_spans"]
    used = [p for p in POSITION_ORDER if p in cfg["facts"]["positions"]]
    for pos in used:
        span = spans.get(pos)
        if span is None:
            raise ConfigError(
                f"config key 'stream.position_spans.{pos}' is missing; give [start, end] fractions"
            )
        if not span[0] < span[1]:
            raise ConfigError(
                f"config key 'stream.position_spans.{pos}' = {span} must have start < end "
                "(fractions of the stream)"
            )
    for before, after in pairwise(used):
        (lo_a, hi_a), lo_b = spans[before], spans[after][0]
        key_a, key_b = f"'stream.position_spans.{before}'", f"'stream.position_spans.{after}'"
        if lo_b < lo_a:
            raise ConfigError(
                f"config key {key_b} = {spans[after]} starts before {key_a} = {spans[before]}; "
                f"the spans must come in the order {', '.join(used)}"
            )
        if lo_b < hi_a:
            raise ConfigError(
                f"config keys {key_a} = {spans[before]} and {key_b} = {spans[after]} overlap; "
                f"make them disjoint (start {after} at or after {hi_a})"
            )


def _check_prefix(cfg: dict[str, Any]) -> None:
    t = cfg["train"]
    if int(t.get("prefix_steps", 0)) >= int(t["steps"]):
        raise ConfigError(
            f"config key 'train.prefix_steps' = {t['prefix_steps']} leaves no paired part of "
            f"train.steps = {t['steps']} (the grid is read after the prefix); lower "
            "train.prefix_steps or raise train.steps"
        )


def _check_grid_fits(cfg: dict[str, Any]) -> None:
    """The planted documents of each position must fit its span of the paired part, and every
    document, episode and recall window the paired part (pure arithmetic, so a grid that
    cannot fit stops the run before anything is written)."""
    f = cfg["facts"]
    paired = len(layout.paired_windows(cfg))
    per_position = layout.planted_per_position(cfg)
    for pos in f["positions"]:
        span = len(layout.span_windows(cfg, pos))
        if per_position > span:
            raise ConfigError(
                f"the fact grid does not fit in the stream: position '{pos}' needs {per_position} "
                f"windows but its span has {span} of the paired part's {paired} "
                "((train.steps - train.prefix_steps) x train.batch_windows); raise train.steps or "
                "lower facts.n_docs / facts.facts_per_cell"
            )
    counts = layout.pool_counts(cfg)
    documents = counts["planted"] + counts["distractor"]
    if documents > paired:
        raise ConfigError(
            f"the fact grid does not fit in the stream: {counts['planted']} planted and "
            f"{counts['distractor']} distractor windows exceed the paired part's {paired} windows; "
            "raise train.steps or lower facts.distractors_per_entity"
        )
    share = layout.episode_share(cfg)
    episodes = layout.episode_count(cfg, layout.n_windows(cfg))
    if episodes and documents + episodes >= paired:
        raise ConfigError(
            f"config key 'stream.episode_share' = {share} asks for {episodes} episode windows, but "
            f"the paired part's {paired} windows already hold {documents} planted and distractor "
            "documents and the background needs at least one; lower stream.episode_share"
        )
    recall = layout.recall_counts(cfg)["paired"]
    if recall and documents + episodes + recall >= paired:
        raise ConfigError(
            f"config key 'stream.recall.paired_share' asks for {recall} recall windows, but the "
            f"paired part's {paired} windows already hold {documents + episodes} documents and "
            "episodes and the background needs at least one; lower stream.recall.paired_share"
        )


def _check_corpus(c: dict[str, Any]) -> None:
    if c["min_doc_chars"] > c["max_doc_chars"]:
        raise ConfigError("config key 'corpus.min_doc_chars' must be <= 'corpus.max_doc_chars'")
    for i, src in enumerate(c["sources"]):
        if src["kind"] != "stdlib" and "path" not in src:
            raise ConfigError(
                f"config key 'corpus.sources.{i}.path' is missing; a '{src['kind']}' source "
                "needs a local path"
            )


def n_checkpoints(t: Mapping[str, Any]) -> int:
    """How many HF checkpoints pretraining saves: every ``checkpoint_every_steps`` and the last
    step (the count of :func:`plantbench.layout.checkpoint_steps`)."""
    return len(layout.checkpoint_steps(t))


def _check_tracin(cfg: dict[str, Any]) -> None:
    t, k = cfg["train"], int(cfg["features"]["tracin_checkpoints"])
    have = n_checkpoints(t)
    if k > have:
        raise ConfigError(
            f"config key 'features.tracin_checkpoints' = {k} asks for more checkpoints than the "
            f"{have} that train.steps = {t['steps']} with train.checkpoint_every_steps = "
            f"{t['checkpoint_every_steps']} saves; lower features.tracin_checkpoints to {have} "
            "or lower train.checkpoint_every_steps"
        )


DEFAULT_HAYSTACK: tuple[float, ...] = (0.25, 0.5, 1.0)


def haystack_fractions(cfg: Mapping[str, Any]) -> list[float]:
    """``analysis.haystack``: the nested shares of the pool's background graded (default
    :data:`DEFAULT_HAYSTACK`; the last is always 1.0, the whole pool)."""
    return [float(f) for f in cfg["analysis"].get("haystack", DEFAULT_HAYSTACK)]


def _check_haystack(a: dict[str, Any]) -> None:
    """The haystack shares rise strictly and end at the whole pool (the schema keeps each in
    (0, 1])."""
    if "haystack" not in a:
        return
    fractions = [float(f) for f in a["haystack"]]
    rising = all(x < y for x, y in pairwise(fractions))
    if not rising or fractions[-1] != 1.0:
        raise ConfigError(
            f"config key 'analysis.haystack' = {json.dumps(a['haystack'])} must rise strictly "
            "and end at 1.0 (the whole pool); list the background shares in ascending order "
            "with 1.0 last, e.g. [0.25, 0.5, 1.0]"
        )


# names a csv reader (pandas' defaults) takes for a missing value: no method may be called one
CSV_MISSING = frozenset(
    {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN"}
    | {"<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"}
)


def _check_methods(methods: dict[str, Any]) -> None:
    enabled, plugins = list(methods["enabled"]), list(methods["plugins"])
    if not enabled and not plugins:
        raise ConfigError(
            "config key 'methods.enabled' is empty and 'methods.plugins' lists none: there is no "
            "method to score; enable at least one (e.g. [bm25]) or add a plug-in"
        )
    seen: set[str] = set()
    for i, plugin in enumerate(plugins):
        name, key = plugin["name"], f"methods.plugins.{i}"
        if name in seen:
            raise ConfigError(
                f"config key '{key}.name' = '{name}' is used by another plug-in; "
                "give every plug-in its own name"
            )
        if name in CSV_MISSING:
            raise ConfigError(
                f"config key '{key}.name' = '{name}' reads back from a csv table as a missing "
                "value; give the plug-in another name"
            )
        if name in builtin_methods():
            raise ConfigError(
                f"config key '{key}.name' = '{name}' is a built-in method; "
                "give the plug-in another name"
            )
        if name in enabled:
            raise ConfigError(
                f"config key '{key}.name' = '{name}' is also in 'methods.enabled'; plug-ins are "
                "scored without being enabled: remove it from methods.enabled"
            )
        seen.add(name)
        _check_plugin_file(f"{key}.path", plugin["path"])


def _defines_score(tree: ast.Module) -> bool:
    """Whether a module binds ``score`` at its top level (or may do so dynamically)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.asname or a.name.split(".")[0] for a in node.names]
        else:
            continue
        if "score" in names or "*" in names or "__getattr__" in names:
            return True
    return False


PLUGIN_FILE = "the plug-in's .py file"


def _check_plugin_file(key: str, path: str) -> None:
    """A plug-in is an existing Python file with a top-level ``score`` (read, not run)."""
    p = userpaths.check(path, userpaths.FILE, userpaths.config_key(key), PLUGIN_FILE)
    if p.suffix != ".py":
        raise ConfigError(
            f"config key '{key}' = '{path}' is not a Python file; give the path of a .py file"
        )
    try:
        tree = ast.parse(p.read_bytes(), filename=str(p))
    except (SyntaxError, ValueError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        raise ConfigError(
            f"config key '{key}' = '{path}' is not valid Python{where}; fix the file"
        ) from None
    if not _defines_score(tree):
        raise ConfigError(
            f"config key '{key}' = '{path}' defines no function score(ctx, query_rows, "
            "pool_rows); add one (see tests/plugins/oracle_method.py)"
        )


RUN_CONFIG = "config.json"  # what marks a folder as a run's results folder
_RUN_KEYS = frozenset({"results", "seed", "facts", "train"})
_RUN_CONFIG_MAX_BYTES = 10_000_000


def _read_run_config(path: Path) -> dict[str, Any] | None:
    """The plantbench config in ``path`` (not, e.g., a checkpoint's config.json), or None."""
    try:
        if not path.is_file() or path.stat().st_size > _RUN_CONFIG_MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and _RUN_KEYS <= data.keys() else None


def _names_folder(results: Any, folder: Path) -> bool:
    """Whether a ``results`` value (relative to an unknown working directory) names ``folder``."""
    if not isinstance(results, str) or not results:
        return False
    p = Path(results).expanduser()
    if p.is_absolute():
        return p.resolve() == folder
    parts = Path(os.path.normpath(p)).parts
    return ".." not in parts and folder.parts[-len(parts) :] == parts


def _is_run_folder(folder: Path) -> bool:
    """A run's results folder: its config.json is a plantbench config that names the folder as
    ``results`` or sits next to a finished artifact (a config file passed with -c does not)."""
    data = _read_run_config(folder / RUN_CONFIG)
    if data is None:
        return False
    if _names_folder(data["results"], folder):
        return True
    try:
        return any((child / "meta.json").is_file() for child in folder.iterdir())
    except OSError:
        return False


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(path.relative_to(Path.cwd().resolve())) or "."
    except ValueError:
        return str(path)


def _nested_run(root: Path) -> Path | None:
    """The first results folder of another run below ``root`` (hidden folders and finished
    artifacts, which hold only their own files, are not searched)."""
    for here, dirs, files in os.walk(root):
        folder = Path(here)
        if folder != root and RUN_CONFIG in files and _is_run_folder(folder):
            return folder
        if "meta.json" in files or "shard.json" in files:
            dirs[:] = []
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return None


def check_results_location(results: str | Path) -> None:
    """Results folders never nest: ``results`` is not inside another run's results folder (an
    ancestor holding a run's config.json, see :func:`_is_run_folder`) and holds no other run
    below it. The repository's
    own ``results/`` (README.md and reference/ only) is not a run."""
    root = Path(results).expanduser().resolve()
    is_file = (
        p for p in root.parents if userpaths.problem(p, userpaths.FOLDER) == userpaths.IS_FILE
    )
    blocker = next(is_file, None)
    if blocker is not None:
        raise ConfigError(
            f"config key 'results' = '{results}' lies under '{_shown(blocker)}', which is a file, "
            "not a folder; choose a results folder whose parents are folders"
        )
    if userpaths.problem(root, userpaths.FOLDER) == userpaths.IS_FILE:
        raise ConfigError(
            userpaths.message(
                results,
                userpaths.IS_FILE,
                userpaths.config_key("results"),
                "a folder for the outputs",
            )
        )
    for parent in root.parents:
        if _is_run_folder(parent):
            raise ConfigError(
                f"config key 'results' = '{results}' is inside the results folder of another run "
                f"('{_shown(parent)}'); results folders must not nest: choose a folder outside it"
            )
    nested = _nested_run(root) if root.is_dir() else None
    if nested is not None:
        raise ConfigError(
            f"config key 'results' = '{results}' holds the results folder of another run "
            f"('{_shown(nested)}'); results folders must not nest: move that run out "
            "(make clean-results) or choose another folder"
        )


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (plain
    PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise _DuplicateKey(None, None, f"key '{key}' is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _file_text(path: Path) -> str:
    """The text of the config file ``path``, or one line saying why it cannot be read."""
    readable = userpaths.check(path, userpaths.FILE, "config file", "a YAML config file")
    try:
        return readable.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file '{path}' is not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"config file '{path}' cannot be read ({exc.strerror}); fix its permissions"
        ) from None


def _read_yaml(path: Path) -> Any:
    text = _file_text(path)
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else "?"
        raise ConfigError(
            f"config file '{path}' gives {exc.problem.removesuffix(' is given twice')} twice "
            f"(line {line}); keep only one of them"
        ) from None


def load(paths: list[str | Path], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read YAML/JSON config files in order (later ones deep-merge over earlier) and validate."""
    cfg: dict[str, Any] = {}
    for p in paths:
        cfg = deep_merge(cfg, read_file(p))
    if overrides:
        cfg = deep_merge(cfg, overrides)
    return validate(cfg)


def read_file(p: str | Path) -> dict[str, Any]:
    """One config file as a mapping: the CLI's and the Snakefile's reader (a folder, a missing
    file, non-UTF-8 text, invalid YAML, a key given twice or a non-mapping is one line)."""
    path = Path(p)
    try:
        data = _read_yaml(path) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(
            f"config file '{path}' is not valid YAML: {exc}".splitlines()[0]
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file '{path}' must hold a mapping of keys, not {type(data).__name__}"
        )
    return data


def _retyped(value: Any, raw: Any) -> Any:
    """``value`` with every string that Snakemake's ``--config`` parser left untyped (it reads
    ``key={a: 10}`` with YAML's base loader: all strings) read as YAML, as a config file would."""
    if isinstance(value, dict) and isinstance(raw, Mapping):
        return {k: _retyped(v, raw.get(k)) for k, v in value.items()}
    if isinstance(value, list) and isinstance(raw, list) and len(value) == len(raw):
        return [_retyped(v, r) for v, r in zip(value, raw, strict=True)]
    if isinstance(value, str) and value == raw:
        try:
            return yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError:
            return value
    return value


# the Snakefile's ``configfile:``, which Snakemake looks for in the working directory (-d)
WORKFLOW_CONFIG = "config.yaml"
_WORKFLOW_CONFIG_LINE = re.compile(
    rf"^configfile:\s*[\"']{re.escape(WORKFLOW_CONFIG)}[\"']\s*$", re.M
)


def _copy_command(workdir: Path) -> str:
    from plantbench.paths import CHECKOUT

    return f"cp {shlex.quote(str(CHECKOUT / WORKFLOW_CONFIG))} {shlex.quote(str(workdir))}"


def _workflow_config_problem(
    workdir: Path, cause: str = userpaths.MISSING, lacking: Sequence[str] = ()
) -> str:
    """The workflow's config file cannot be read in ``workdir``: which file, where, why, and
    the fix (where --configfile files were given instead: the top-level keys they leave out)."""
    from plantbench.paths import CHECKOUT

    copy = f"copy the checkout's config.yaml there ({_copy_command(workdir)})"
    fix = f"{copy} or pass --configfile FILE"
    if lacking:
        more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
        first = shlex.quote(str(CHECKOUT / WORKFLOW_CONFIG))
        fix = (
            f"without it the config lacks '{lacking[0]}'{more}: {copy} or give it first: "
            f"--configfile {first} FILE ..."
        )
    what = "the workflow's config file"
    noun = "a YAML config file"
    return userpaths.message(WORKFLOW_CONFIG, cause, what, noun, missing=fix, base=workdir)


def _check_workflow_config(cfg: Mapping[str, Any]) -> None:
    """Snakemake skips a missing workflow config file when --configfile is given: the keys it
    gives are then missing, and the error names the file (not only the first key)."""
    lacking = [k for k in schema()["required"] if k not in cfg]
    if lacking and userpaths.problem(WORKFLOW_CONFIG, userpaths.FILE) == userpaths.MISSING:
        raise ConfigError(_workflow_config_problem(Path.cwd(), lacking=lacking))


def from_snakemake(
    config: Mapping[str, Any], files: list[str | Path], cli: Mapping[str, Any]
) -> dict[str, Any]:
    """The Snakefile's config, read as the CLI reads it: every config file through
    :func:`read_file` (a key given twice is refused, not the last one kept), the values of
    ``--config key={a: 10}`` typed as YAML, then :func:`validate` (keys missing because the
    workflow's config file is not in the working directory: one line naming that file)."""
    for f in files:
        read_file(f)
    typed = {k: _retyped(v, cli[k]) if k in cli else v for k, v in config.items()}
    _check_workflow_config(typed)
    return validate(typed)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(cfg: Mapping[str, Any], keys: list[str] | None = None) -> str:
    """Hash of the whole config, or of the named top-level sections only."""
    sub = cfg if keys is None else {k: cfg[k] for k in keys}
    return hash_bytes(canonical_json(sub).encode())


# not part of the study's identity: where it is written, and how many replicates of it run
# (replicate 0 is the same study, with the same hashes, whatever the count)
# not the study's definition: where it goes, how many replicate pairs, which one, and the opt-in
# random twins (extra twins of the same study; their own steps record random_twins.*)
NOT_STUDY = ("results", "replicates", "replicate", "random_twins")


def study_hash(cfg: Mapping[str, Any]) -> str:
    """Hash of everything that defines the study: the whole config except the output folder
    the replicate count and the random twins (:data:`NOT_STUDY`)."""
    return config_hash(cfg, sorted(k for k in cfg if k not in NOT_STUDY))


# a top-level key as Snakemake's --config parser accepts it (snakemake.cli.parse_config)
_SNAKEMAKE_KEY = re.compile(r"[a-zA-Z_][\w-]*\w$")


def _nested_spelling(key: str, value: str) -> str | None:
    """``a.b.c=v`` written as Snakemake's --config takes it, ``a={b: {c: v}}``, if every part
    of the dotted key is a plain name."""
    first, *rest = key.split(".")
    if not rest or not all(re.fullmatch(r"[A-Za-z_][\w-]*", part) for part in (first, *rest)):
        return None
    inner = value or "null"
    for part in reversed(rest):
        inner = f"{{{part}: {inner}}}"
    return f"{first}={inner}"


def check_snakemake_args(config: Sequence[str] | None, configfiles: Sequence[str | Path]) -> None:
    """Refuse in one line what Snakemake's own command-line parsing (before the Snakefile runs)
    would stop with a traceback: a ``--config`` entry that is not ``key=value`` with a top-level
    key (a dotted ``train.steps=10``), and a ``--configfile`` that :func:`read_file` cannot read
    (a folder, a missing file, non-UTF-8 text, invalid YAML, a key given twice)."""
    for entry in config or ():
        key, eq, value = entry.partition("=")
        if not eq:
            raise ConfigError(
                f"--config entry '{entry}' is not key=value; write --config {entry}=VALUE"
            )
        if _SNAKEMAKE_KEY.match(key):
            continue
        nested = _nested_spelling(key, value)
        if nested is not None:
            raise ConfigError(
                f"--config {entry} names a nested key, but Snakemake's --config takes top-level "
                f"keys only; write --config '{nested}' or set it in a --configfile"
            )
        raise ConfigError(
            f"--config key '{key}' is not a top-level key name (two or more characters: a letter "
            "or _, then letters, digits, _ or -); write the key as it is in config.yaml"
        )
    for f in configfiles:
        read_file(f)


def check_configfile_flags(argv: Sequence[str]) -> None:
    """Refuse ``--configfile a.yaml --configfile b.yaml``: Snakemake keeps only the last flag's
    files (argparse), so ``a.yaml`` would be dropped without a word; one flag takes them all."""
    flags = [a for a in argv if a.split("=", 1)[0].startswith("--configf")]
    if len(flags) > 1:
        raise ConfigError(
            f"--configfile is given {len(flags)} times, and Snakemake reads only the last one's "
            "files; give them all after one flag, in merge order: --configfile a.yaml b.yaml"
        )


def check_workflow_config_present(argv: Sequence[str], configfiles: Sequence[str | Path]) -> None:
    """The Snakefile's config file in the working directory (``-d``, default: here), which
    Snakemake reads unless it is missing and --configfile is given: missing without
    --configfile, a folder or unreadable, it would stop with a WorkflowError or a traceback that
    names no fix. Only for a Snakefile that reads it (``configfile: "config.yaml"``), found as
    Snakemake finds it."""
    from snakemake.cli import get_argument_parser, resolve_snakefile

    args = get_argument_parser().parse_known_args(list(argv))[0]
    snakefile = resolve_snakefile(args.snakefile, allow_missing=True)
    try:
        text = "" if snakefile is None else Path(snakefile).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return  # Snakemake names a missing or unreadable Snakefile itself
    workdir = Path(args.directory or ".").resolve()
    cause = userpaths.problem(WORKFLOW_CONFIG, userpaths.FILE, base=workdir)
    skipped = cause == userpaths.MISSING and bool(configfiles)
    if cause is not None and not skipped and _WORKFLOW_CONFIG_LINE.search(text):
        raise ConfigError(_workflow_config_problem(workdir, cause))


def exit_on_bad_snakemake_args(
    config: Sequence[str] | None,
    configfiles: Sequence[str | Path],
    argv: Sequence[str] | None = None,
) -> None:
    """:func:`check_snakemake_args` for the workflow profile (profiles/default), which Snakemake
    evaluates while it parses its command line: the error as the Snakefile prints it, and exit 1;
    also :func:`check_workflow_config_present`. ``argv``: the raw command line (default
    ``sys.argv[1:]``), for :func:`check_configfile_flags` and the working directory (``-d``)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_snakemake_args(config, configfiles)
        check_configfile_flags(argv)
        check_workflow_config_present(argv, configfiles)
    except ConfigError as exc:
        print(f"plantbench: config error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
