"""Config lineage: every artifact records the config values its outputs depend on, and every
step refuses inputs made under other values.

An artifact's ``meta.json`` (a gradient shard's ``shard.json``) carries ``lineage``: the rule
that made it and, key by key, the values of the config keys that rule depends on
(:data:`plantbench.stages.STAGES`' ``sections``, flattened to dotted keys; a replicate's index
where it has one). A step declares itself (:func:`begin`, from the CLI); from then on every
artifact it reads is compared with the config at hand as it is opened (:func:`check_read`, from
the readers), before the step writes its outputs, and the first key that differs stops it with
one line naming the artifact, the key, both values and the fix. The report reads through the
same readers; ``verify`` applies the same comparison (:func:`problem`) to every artifact of the
run.
An artifact made before lineage was recorded carries none and is not judged here (its hashes
still are).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from plantbench import replicates
from plantbench.config import NOT_STUDY
from plantbench.errors import ArtifactError
from plantbench.stages import ALL, BY_RULE

log = logging.getLogger(__name__)

KEY = "lineage"
META_FILES = ("meta.json", "shard.json")  # an artifact's record; a gradient shard's
REPLICATE = "replicate"

# how a step runs, not what it makes (its artifacts are bitwise the same at any value)
EXECUTION_ONLY = ("train.threads", "train.prefix_threads", "train.state_every_steps")

_current: dict[str, Any] | None = None  # the record of the step this process runs
_step: tuple[Mapping[str, Any], str] | None = None  # its config and rule


class LineageError(ArtifactError):
    """An input artifact was made under config values other than the ones at hand."""


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for k in sorted(value):
            _flatten(value[k], f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def _pick(cfg: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def config_values(cfg: Mapping[str, Any], rule: str) -> dict[str, Any]:
    """The config values ``rule``'s outputs depend on, by dotted key (its sections flattened;
    the output folder and the replicate count are never part of it)."""
    stage = BY_RULE[rule]
    keys = sorted(k for k in cfg if k not in NOT_STUDY) if stage.sections == ALL else stage.sections
    out: dict[str, Any] = {}
    for key in keys:
        found, value = _pick(cfg, key.removesuffix("?"))
        if found:
            _flatten(value, key.removesuffix("?"), out)
    for key in EXECUTION_ONLY:
        out.pop(key, None)
    if stage.per_replicate and stage.sections != ALL:
        out[REPLICATE] = int(cfg.get(REPLICATE, 0))
    return out


def record(cfg: Mapping[str, Any], rule: str) -> dict[str, Any]:
    """What an artifact of ``rule`` made under ``cfg`` records (``meta.json``'s ``lineage``)."""
    return {"rule": rule, "config": config_values(cfg, rule)}


def begin(cfg: Mapping[str, Any], rule: str) -> None:
    """Declare the step this process runs: the artifacts it writes record ``record(cfg, rule)``."""
    global _current, _step
    _current, _step = record(cfg, rule), (cfg, rule)


def end() -> None:
    """The step is over: nothing more is recorded or checked for it."""
    global _current, _step
    _current = _step = None


def current() -> dict[str, Any] | None:
    """The record of the step this process runs (None outside a workflow step)."""
    return _current


_ABSENT = object()  # a key one side does not set


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(not set)"
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def differences(made: Mapping[str, Any], want: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Every key whose recorded value differs from the one at hand: (key, made, at hand)."""
    keys = sorted(set(made) | set(want))
    return [
        (k, made.get(k, _ABSENT), want.get(k, _ABSENT))
        for k in keys
        if made.get(k, _ABSENT) != want.get(k, _ABSENT)
    ]


def problem(cfg: Mapping[str, Any], meta: Mapping[str, Any], where: str) -> str | None:
    """None when the artifact at ``where`` was made under ``cfg``'s values for its rule (or
    records no lineage); else one sentence naming the first key that differs and both values."""
    rec = meta.get(KEY)
    if not isinstance(rec, Mapping) or rec.get("rule") not in BY_RULE:
        return None
    diff = differences(rec.get("config") or {}, config_values(cfg, rec["rule"]))
    if not diff:
        return None
    key, made, here = diff[0]
    more = f" (and {len(diff) - 1} more key{'s' if len(diff) > 2 else ''})" if len(diff) > 1 else ""
    return (
        f"'{where}' was made (rule {rec['rule']}) with {key} = {_show(made)}, but the config "
        f"at hand has {key} = {_show(here)}{more}"
    )


def fix(rule: str, config_copy: Path) -> str:
    """What to do about an artifact of ``rule`` made under other values."""
    return (
        f"rerun from that step with this config (snakemake reruns it; by hand: snakemake "
        f"--forcerun {rule}), or run with the config it was made with ('{config_copy}')"
    )


def check_read(meta: Mapping[str, Any], where: str | Path) -> None:
    """Called by every reader of an artifact's record (:func:`plantbench.io.read_meta`, a
    gradient shard's open): refuse an input made under other config values than the step's
    (its own earlier outputs, which it rebuilds, are the step's to judge)."""
    if _step is None:
        return
    cfg, rule = _step
    rec = meta.get(KEY)
    if isinstance(rec, Mapping) and rec.get("rule") == rule:
        return
    if not BY_RULE[rule].per_replicate:  # a step over every replicate (the summary, the report)
        cfg = {**cfg, REPLICATE: replicate_of(cfg, where)}
    found = problem(cfg, meta, str(where))
    if found is not None:
        raise LineageError(
            f"step '{rule}' refuses an input: {found}; {fix(rec['rule'], _config_copy(cfg))}"
        )


def replicate_of(cfg: Mapping[str, Any], where: str | Path) -> int:
    """The replicate whose folder ``where`` lies in (``results/replicates/<r>/``; anything else
    under the results folder is replicate 0's, anything outside it the config's own)."""
    try:
        rel = Path(where).resolve().relative_to(Path(cfg["results"]).resolve())
    except ValueError:
        return int(cfg.get(REPLICATE, 0))
    return replicates.split_name(rel.as_posix())[0]


def _config_copy(cfg: Mapping[str, Any]) -> Path:
    return Path(cfg["results"]) / "config.json"


def artifact_records(paths: Any, rule: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every finished artifact of ``rule`` on disk under ``paths`` with its record file's JSON
    (hidden and partial folders left out)."""
    base = paths.root if BY_RULE[rule].per_replicate else paths.shared
    for pattern in BY_RULE[rule].folders:
        for folder in sorted(base.glob(pattern)):
            if any(part.startswith(".") for part in folder.relative_to(base).parts):
                continue
            for name in META_FILES:
                meta = _read(folder / name)
                if meta is not None:
                    yield folder, meta
                    break


def newest_record(paths: Any, rule: str) -> dict[str, Any] | None:
    """The lineage record of ``rule``'s most recently written artifact (replicate 0's; None
    when it has none, or records none)."""
    best: tuple[float, dict[str, Any]] | None = None
    for folder, meta in artifact_records(paths, rule):
        rec = meta.get(KEY)
        stamp = max(f.stat().st_mtime for f in map(folder.joinpath, META_FILES) if f.is_file())
        if isinstance(rec, dict) and (best is None or stamp > best[0]):
            best = (stamp, rec)
    return None if best is None else best[1]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None
