"""Load, merge and validate the study configuration.

The schema (``schemas/config.schema.yaml``, linked from ``workflow/schemas/``) is the single
definition of every knob. Errors are one line: the key, what is wrong, the allowed values.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .errors import ConfigError
from .hashing import hash_bytes

SCHEMA_NAME = "config.schema.yaml"


def schema() -> dict[str, Any]:
    text = resources.files("plantbench").joinpath("schemas", SCHEMA_NAME).read_text()
    return yaml.safe_load(text)


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
        return f"config is missing a required key: {err.message}" + (
            f" (under '{key}')" if key != "(top level)" else ""
        )
    if v == "type":
        return (
            f"config key '{key}' = {json.dumps(err.instance)} has the wrong type; "
            f"expected {err.validator_value}"
        )
    if v in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[v]
        return f"config key '{key}' = {err.instance} is out of range; it must be {op} {err.validator_value}"
    return f"config key '{key}': {err.message}"


def validate(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Validate against the schema, then the cross-key rules. Returns a plain copy."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(list(e.absolute_path)), e.path))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise ConfigError(describe_error(best))
    out = json.loads(json.dumps(cfg))
    _check_semantics(out)
    return out


def _check_semantics(cfg: dict[str, Any]) -> None:
    m, t, s = cfg["model"], cfg["train"], cfg["stream"]
    if m["n_embd"] % m["n_head"]:
        raise ConfigError(
            f"config key 'model.n_embd' = {m['n_embd']} must be divisible by "
            f"'model.n_head' = {m['n_head']}; change one of them"
        )
    if (m["n_embd"] // m["n_head"]) % 2:
        raise ConfigError(
            "config key 'model.n_embd' / 'model.n_head' must be even (rotary embeddings)"
        )
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
    for pos in cfg["facts"]["positions"]:
        span = s["position_spans"].get(pos)
        if span is None:
            raise ConfigError(
                f"config key 'stream.position_spans.{pos}' is missing; give [start, end] fractions"
            )
        if not span[0] < span[1]:
            raise ConfigError(
                f"config key 'stream.position_spans.{pos}' = {span} must have start < end (fractions of the stream)"
            )
    _check_grid_fits(cfg)
    c = cfg["corpus"]
    if c["min_doc_chars"] > c["max_doc_chars"]:
        raise ConfigError("config key 'corpus.min_doc_chars' must be <= 'corpus.max_doc_chars'")
    for i, src in enumerate(c["sources"]):
        if src["kind"] != "stdlib" and "path" not in src:
            raise ConfigError(
                f"config key 'corpus.sources.{i}.path' is missing; a '{src['kind']}' source needs a local path"
            )


def _check_grid_fits(cfg: dict[str, Any]) -> None:
    """The planted documents of each position must fit its span of the stream (pure arithmetic,
    so a grid that cannot fit stops the run before anything is written)."""
    f, t = cfg["facts"], cfg["train"]
    n = int(t["steps"]) * int(t["batch_windows"])
    per_position = len(f["domains"]) * int(f["facts_per_cell"]) * sum(int(x) for x in f["n_docs"])
    for pos in f["positions"]:
        lo, hi = cfg["stream"]["position_spans"][pos]
        span = int(hi * n // 1) - int(lo * n // 1)
        if per_position > span:
            raise ConfigError(
                f"the fact grid does not fit in the stream: position '{pos}' needs {per_position} "
                f"windows but its span has {span} of the {n} (train.steps x train.batch_windows); "
                "raise train.steps or lower facts.n_docs / facts.facts_per_cell"
            )
    n_facts = (
        len(f["domains"]) * len(f["n_docs"]) * len(f["positions"]) * 2 * int(f["facts_per_cell"])
    )
    planted = per_position * len(f["positions"])
    if planted + n_facts * int(f["distractors_per_entity"]) > n:
        raise ConfigError(
            f"the fact grid does not fit in the stream: {planted} planted and "
            f"{n_facts * int(f['distractors_per_entity'])} distractor windows exceed the {n} windows; "
            "raise train.steps or lower facts.distractors_per_entity"
        )


def load(paths: list[str | Path], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read YAML/JSON config files in order (later ones deep-merge over earlier) and validate."""
    cfg: dict[str, Any] = {}
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ConfigError(f"config file '{path}' does not exist; pass an existing --configfile")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(
                f"config file '{path}' is not valid YAML: {exc}".splitlines()[0]
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"config file '{path}' must hold a mapping of keys, not {type(data).__name__}"
            )
        cfg = deep_merge(cfg, data)
    if overrides:
        cfg = deep_merge(cfg, overrides)
    return validate(cfg)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_hash(cfg: Mapping[str, Any], keys: list[str] | None = None) -> str:
    """Hash of the whole config, or of the named top-level sections only."""
    sub = cfg if keys is None else {k: cfg[k] for k in keys}
    return hash_bytes(canonical_json(sub).encode())


def study_hash(cfg: Mapping[str, Any]) -> str:
    """Hash of everything that defines the study: the whole config except the output folder."""
    return config_hash(cfg, sorted(k for k in cfg if k != "results"))
