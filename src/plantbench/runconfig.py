"""The config a run's jobs read, and what each rule's jobs depend on.

A job must read the config it was scheduled with, whatever happens to the results folder while it
waits. So the workflow never hands a job a mutable file: when the run starts (Snakemake's
``onstart``, after the lock is taken; never in a dry run, lint or report call, nor in a call the
lock refuses) the resolved config is written once to ``<results>/.plantbench/config/<hash>.json``,
named by the xxh3 of its content, and every job of that run reads that file. Another invocation
with other settings writes another file and cannot touch this run's. ``<results>/config.json``
is a copy for people (``plantbench verify -c results/config.json``); no job reads it.

Which config a rule depends on is :data:`RULE_SECTIONS` (the sections of :mod:`plantbench.stages`): top-level sections or single keys
(``train.steps``; ``analysis.haystack?``: an optional key, hashed only when the config sets it,
so adding the key with its default value reruns nothing else). Their hash is the rule's ``params`` entry, so a change reruns exactly the rules
that use it (changing ``train.lr`` retrains, it does not rebuild the stream).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plantbench.config import canonical_json, config_hash
from plantbench.errors import ConfigError
from plantbench.hashing import hash_bytes
from plantbench.stages import ALL, STAGES

RUN_DIR = ".plantbench"  # hidden: verify and the stage folders ignore it

_ALL = ALL
# the config keys each rule depends on: the stage catalogue's sections
RULE_SECTIONS: dict[str, tuple[str, ...]] = {s.rule: s.sections for s in STAGES}


def job_config_path(cfg: Mapping[str, Any]) -> Path:
    """Where the jobs of a run with config ``cfg`` read it (named by the config's hash)."""
    return Path(cfg["results"]) / RUN_DIR / "config" / f"{config_hash(cfg)}.json"


def startup_write(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds it (True: written). A write that fails
    (a full disk, a read-only results folder) is one line naming the file, the cause and the fix,
    not a traceback from a rules file."""
    from plantbench import io
    from plantbench.errors import PlantbenchError, describe_os_error

    try:
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            return False
        io.write_text(path, text)
    except OSError as exc:
        exc.filename = exc.filename or str(path)
        raise PlantbenchError(describe_os_error(exc, "the workflow's start-up")) from None
    return True


def write_run_config(cfg: Mapping[str, Any]) -> Path:
    """Write the run's job config (once; it never changes) and the human copy ``config.json``."""
    from plantbench import io

    path = job_config_path(cfg)
    text = io.dumps_json(cfg)
    if not path.is_file():
        startup_write(path, text)
    startup_write(Path(cfg["results"]) / "config.json", text)
    return path


def _differs(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") != text
    except OSError:
        return True


def sections_path(cfg: Mapping[str, Any], rule: str) -> Path:
    """The file that stands for ``rule``'s config values in the job graph (an input of the
    rule: see :func:`write_sections`)."""
    return Path(cfg["results"]) / RUN_DIR / "sections" / f"{rule}.json"


# Snakemake options of a call that only looks at the workflow (it must write nothing)
LOOK_ONLY = (
    "--dry-run",
    "--dryrun",
    "--lint",
    "--report",
    "--summary",
    "--detailed-summary",
    "--list-changes",
    "--lc",
    "--dag",
    "--rulegraph",
    "--filegraph",
    "--d3dag",
    "--list-rules",
    "--list-target-rules",
    "--containerize",
)


def looks_only(argv: list[str]) -> bool:
    """Whether a Snakemake command line only looks (``-n``, ``-np``, ``--lint``, ``--report``,
    a summary or a graph): such a call writes nothing, not even the sections files."""
    for arg in argv:
        if arg.split("=", 1)[0] in LOOK_ONLY or arg in ("-S", "-D", "-l"):
            return True
        if arg.startswith("-") and not arg.startswith("--") and "n" in arg[1:]:
            return True  # -n, -np, -pn, ... (short flags clustered)
    return False


def write_sections(cfg: Mapping[str, Any], *, write: bool = True) -> list[str]:
    """For every rule, write the config values its outputs depend on to :func:`sections_path`
    when they differ from what the file holds; returns the rules whose file changed.

    Each rule reads its file as an input, so Snakemake sees a config change through the file's
    time like any newer input: a results folder copied without Snakemake's metadata
    (``.snakemake/``) still reruns exactly the rules a change touches. Written when the workflow
    is parsed by a call that runs (a dry run, ``--lint`` or ``--report`` writes nothing: in a
    folder without Snakemake's metadata its job list shows a change once a run has parsed the
    workflow; with the metadata the params show it at once); a file whose
    values are those the rule's newest artifact records gets a time that makes nothing look out
    of date (a dry run of another config, then a run of the config the artifacts were made
    under, reruns nothing)."""
    from plantbench import io, lineage
    from plantbench.paths import Paths

    paths, changed = Paths(dict(cfg)), []
    for rule in RULE_SECTIONS:
        values = lineage.config_values(cfg, rule)
        doc = {"rule": rule, "params": rule_sections(cfg, rule), "config": values}
        path, text = sections_path(cfg, rule), io.dumps_json(doc)
        if not write:  # a look-only call: report what a run would rewrite, write nothing
            if _differs(path, text):
                changed.append(rule)
            continue
        if startup_write(path, text):
            changed.append(rule)
            newest = lineage.newest_record(paths, rule)
            if newest is None or newest.get("config") == values:
                # the rule's newest artifact was made under these values (a dry run of another
                # config came in between): the file must not make it look out of date
                os.utime(path, (1, 1))
    return changed


def check_job_config(path: Path, cfg: Mapping[str, Any]) -> None:
    """A job config named by a hash must still hold the config of that hash."""
    parent = path.parent
    if parent.name != "config" or parent.parent.name != RUN_DIR:
        return
    if path.stem != config_hash(cfg):
        raise ConfigError(
            f"job config '{path}' was edited after the run started (its content no longer has "
            f"the hash {path.stem}); delete it and start the run again"
        )


def _pick(cfg: Mapping[str, Any], key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ConfigError(f"rule sections name config key '{key}', which the config lacks")
        node = node[part]
    return node


def _has(cfg: Mapping[str, Any], key: str) -> bool:
    """Whether the config sets the dotted ``key``."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def rule_sections(cfg: Mapping[str, Any], rule: str) -> str:
    """Hash of the config keys ``rule`` depends on (a rule's ``params``: a change reruns it)."""
    keys = RULE_SECTIONS[rule]
    if keys == _ALL:  # every key but where the run is written (a moved folder reruns nothing)
        keys = tuple(sorted(k for k in cfg if k != "results"))
    picked = {
        k.removesuffix("?"): _pick(cfg, k.removesuffix("?"))
        for k in keys
        if not k.endswith("?") or _has(cfg, k.removesuffix("?"))
    }
    return hash_bytes(canonical_json(picked).encode())[:16]


def method_signature(cfg: Mapping[str, Any], method: str) -> str:
    """What a method's score jobs depend on besides their sections: the hash of the code that
    scores it (a plug-in file or a built-in module) and its plug-in entry."""
    from plantbench.attribution.methods import registry

    registry.load_plugins(dict(cfg))
    entry = [p for p in cfg["methods"].get("plugins", []) if p["name"] == method]
    return json.dumps({"code": registry.code_hash(method), "plugin": entry}, sort_keys=True)
