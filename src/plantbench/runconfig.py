"""The config a run's jobs read, and what each rule's jobs depend on.

A job must read the config it was scheduled with, whatever happens to the results folder while it
waits. So the workflow never hands a job a mutable file: when the run starts (Snakemake's
``onstart``, after the lock is taken; never in a dry run, lint or report call, nor in a call the
lock refuses) the resolved config is written once to ``<results>/.plantbench/config/<hash>.json``,
named by the xxh3 of its content, and every job of that run reads that file. Another invocation
with other settings writes another file and cannot touch this run's. ``<results>/config.json``
is a copy for people (``plantbench verify -c results/config.json``); no job reads it.

Which config a rule depends on is :data:`RULE_SECTIONS`: top-level sections or single keys
(``train.steps``; ``analysis.haystack?``: an optional key, hashed only when the config sets it,
so adding the key with its default value reruns nothing else). Their hash is the rule's ``params`` entry, so a change reruns exactly the rules
that use it (changing ``train.lr`` retrains, it does not rebuild the stream).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plantbench.config import canonical_json, config_hash
from plantbench.errors import ConfigError
from plantbench.hashing import hash_bytes

RUN_DIR = ".plantbench"  # hidden: verify and the stage folders ignore it

_ALL = ("*",)
RULE_SECTIONS: dict[str, tuple[str, ...]] = {
    "facts": ("seed", "facts"),
    "corpus": ("seed", "corpus"),
    "tokenizer": ("seed", "corpus", "tokenizer"),
    "stream": (
        "seed",
        "facts",
        "corpus",
        "tokenizer",
        "stream",
        "train.steps",
        "train.batch_windows",
        "train.prefix_steps?",
        "causal.context_segments?",
    ),
    "pretrain_prefix": ("seed", "model", "train"),
    "pretrain": ("seed", "model", "train"),
    "causal": ("causal",),
    "reading": ("causal",),
    "pool": ("seed", "pool"),
    "grads_pool": ("features",),
    "grads_queries": ("features",),
    "curvature": ("features", "curvature"),
    "hidden": ("features",),
    "embed": ("features",),
    "embed_shared": ("features",),
    "score": ("scoring", "features", "curvature", "analysis.haystack?"),
    "ekfac": ("features.batch_windows", "curvature.damping_ratio"),
    "ekfac_tracin": ("features.batch_windows", "curvature.damping_ratio"),
    "trackstar": ("features",),
    "fidelity": ("features", "curvature", "fidelity?"),  # + its gradient methods (params)
    "analysis": ("analysis", "methods"),
    "context_build": ("seed", "context?", "causal.context_segments?"),
    "context_attribute": ("seed", "context?", "causal.context_segments?"),
    "context_analysis": ("seed", "context?", "causal.context_segments?"),
    "grounding_build": ("seed", "grounding?"),
    "grounding_respond": ("seed", "grounding?"),
    "grounding_analysis": ("seed", "grounding?"),
    "membership_samples": ("seed", "membership?"),
    "membership_detect": ("seed", "membership?", "features.encoder"),
    "membership_analysis": ("seed", "membership?"),
    "replicates": ("replicates?", "analysis", "methods"),
    "report": _ALL,
    "verify": _ALL,
    "bench": _ALL,
    "export": _ALL,
}


def job_config_path(cfg: Mapping[str, Any]) -> Path:
    """Where the jobs of a run with config ``cfg`` read it (named by the config's hash)."""
    return Path(cfg["results"]) / RUN_DIR / "config" / f"{config_hash(cfg)}.json"


def write_run_config(cfg: Mapping[str, Any]) -> Path:
    """Write the run's job config (once; it never changes) and the human copy ``config.json``."""
    from plantbench import io

    path = job_config_path(cfg)
    if not path.is_file():
        io.write_json(path, cfg)
    human = Path(cfg["results"]) / "config.json"
    text = io.dumps_json(cfg)
    if not human.is_file() or human.read_text(encoding="utf-8") != text:
        io.write_text(human, text)
    return path


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
    if keys == _ALL:
        keys = tuple(sorted(cfg))
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
