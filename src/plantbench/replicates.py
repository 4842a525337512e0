"""Replicates: N twin pairs of one study that differ only in what a single pair cannot tell
apart from the facts' effect, their initial weights and the order of the background text.

Replicate 0 is the study as configured (its artifacts, seeds and hashes are those of a run
without replicates); replicate r >= 1 derives both seeds from the master seed and r and lives in
``{results}/replicates/<r>/``, beside the shared facts, corpus and tokenizer at the top. The
config's ``replicates`` (default 1) says how many; a step is told which one with ``--replicate``
(:func:`select` puts it in the config it reads), and Snakemake carries it as the ``rep``
wildcard (:func:`wildcard`: empty for replicate 0, ``replicates/<r>/`` otherwise).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from plantbench.errors import ConfigError

FOLDER = "replicates"
KEY = "replicate"  # set by select(), never in a config file
WILDCARD = r"(replicates/[1-9][0-9]*/)?"


def count(cfg: dict[str, Any]) -> int:
    return int(cfg.get("replicates", 1))


def index(cfg: dict[str, Any]) -> int:
    return int(cfg.get(KEY, 0))


def select(cfg: dict[str, Any], r: int) -> dict[str, Any]:
    """``cfg`` for replicate ``r``; one line naming the range when ``r`` is outside it."""
    n = count(cfg)
    if not 0 <= int(r) < n:
        raise ConfigError(
            f"replicate {r} is out of range: this config has replicates: {n} "
            f"(replicates 0 to {n - 1}); raise `replicates` or pick one of those"
        )
    if int(r) == 0:
        return {k: v for k, v in cfg.items() if k != KEY}
    return {**cfg, KEY: int(r)}


def seed_tags(cfg: dict[str, Any]) -> tuple[Any, ...]:
    """Extra tags for the seeds a replicate changes (none for replicate 0)."""
    r = index(cfg)
    return () if r == 0 else (KEY, r)


def hash_part(cfg: dict[str, Any]) -> dict[str, int]:
    """What a replicate adds to the config hash of the artifacts it changes."""
    r = index(cfg)
    return {} if r == 0 else {KEY: r}


def folder(results: str | Path, r: int) -> Path:
    return Path(results) if int(r) == 0 else Path(results) / FOLDER / str(int(r))


def wildcard(r: int) -> str:
    return "" if int(r) == 0 else f"{FOLDER}/{int(r)}/"


def from_wildcard(value: str) -> int:
    if value == "":
        return 0
    m = re.fullmatch(r"replicates/([1-9][0-9]*)/", value)
    if m is None:
        raise ConfigError(f"'{value}' is not a replicate folder (replicates/<r>/)")
    return int(m.group(1))


def split_name(name: str) -> tuple[int, str]:
    """An artifact name relative to the results folder as (replicate, name inside it):
    ``replicates/2/models/A`` -> (2, ``models/A``); anything else is replicate 0's."""
    p = name.split("/")
    if len(p) > 2 and p[0] == FOLDER and p[1].isdigit():
        return int(p[1]), "/".join(p[2:])
    return 0, name


def check_owner(folder: Path, meta: dict[str, Any] | None, cfg: dict[str, Any]) -> None:
    """Refuse to write replicate ``index(cfg)``'s artifact into ``folder`` when the artifact
    there was made for another replicate (nothing is overwritten)."""
    if meta is None:
        return
    made = int(meta.get("info", {}).get(KEY, 0))
    if made != index(cfg):
        raise ConfigError(
            f"'{folder}' holds replicate {made}'s artifact; replicate {index(cfg)} would "
            "overwrite it. Each replicate writes its own folder (results/replicates/<r>/): "
            "check `results` and `--replicate`"
        )
