"""``plantbench verify``: recompute and check a run's hashes, lineage and reference hashes.

What is checked, per artifact (one line each, PASS / FAIL / SKIP):
- every file of every artifact against the xxh3 recorded in its ``meta.json`` (gradient shards:
  their ``shard.json``);
- lineage: every input hash an artifact records is the hash of an artifact present in the run;
- both streams: every window against the manifest's xxh3, and A and B differ exactly at the
  planted windows;
- the reference hashes in ``results/reference/<name>.json`` whose study hash matches this config.

Reproducibility across machines: token data (facts, corpus, tokenizer, streams, pools) depends
only on the config, the package versions pinned in constraints.txt and, for the ``stdlib`` corpus
source, the Python version (its text is the standard library) — references record it and are
skipped with a note on another Python. Float artifacts (weights, features, scores, the causal
table) are bit-identical only on the same hardware, thread count and library versions, because
floating-point reduction order differs between CPU kernels and GPUs; references record the
platform and are compared only on a matching one.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import io
from .config import study_hash
from .errors import ArtifactError, PlantbenchError
from .hashing import hash_file, window_hashes
from .paths import MODELS, Paths

PORTABLE = ("facts", "corpus", "tokenizer", "stream/A", "stream/B", "pool/A", "pool/B")
REFERENCE_DIR = Path(__file__).resolve().parents[2] / "results" / "reference"


@dataclass
class Check:
    artifact: str
    status: str  # PASS | FAIL | SKIP
    detail: str = ""


def platform_key() -> dict[str, str]:
    return {
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "torch": torch.__version__,
        "machine": platform.machine(),
    }


def artifacts(root: Path) -> dict[str, Path]:
    """Every finished artifact under ``root`` (folders holding a meta.json), by relative name."""
    out = {}
    for meta in sorted(root.rglob("meta.json")):
        rel = meta.parent.relative_to(root).as_posix()
        if "/." in f"/{rel}" or rel == ".":
            continue
        out[rel] = meta.parent
    return out


def check_files(root: Path) -> tuple[list[Check], dict[str, dict[str, Any]]]:
    checks, metas = [], {}
    for name, folder in artifacts(root).items():
        try:
            raw = json.loads((folder / "meta.json").read_text())
            meta = io.read_meta(folder, raw.get("stage", "?"))
        except (ArtifactError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            checks.append(
                Check(
                    name,
                    "FAIL",
                    str(exc) if isinstance(exc, ArtifactError) else "meta.json is corrupt",
                )
            )
            continue
        metas[name] = meta
        checks.append(Check(name, "PASS", f"{len(meta['files'])} files match their xxh3"))
    for shard in sorted(root.rglob("shard.json")):
        name = shard.parent.relative_to(root).as_posix()
        if "/." in f"/{name}":
            continue
        try:
            from .gradients import GradientStore

            GradientStore.open([shard.parent], verify=True)
            checks.append(Check(name, "PASS", "gradient shard matches its xxh3"))
        except PlantbenchError as exc:
            checks.append(Check(name, "FAIL", str(exc)))
    return checks, metas


EXTERNAL_INPUTS = ("encoder",)  # made outside the run (an installed or local model folder)


def present_hashes(root: Path, metas: dict[str, dict[str, Any]]) -> set[str]:
    """Hashes of everything in the run an artifact may record as an input: artifacts,
    checkpoints (their index), gradient stores and curvature files."""
    present = {m["hash"] for m in metas.values()}
    for index in root.glob("models/*/checkpoints/index.json"):
        present.update(c["hash"] for c in json.loads(index.read_text()))
    for curv in root.glob("features/*/curvature/*.npz"):
        present.add(hash_file(curv))
    try:
        from .gradients import GradientStore

        for part in ("pool", "queries"):
            for folder in root.glob(f"features/*/grads/*/{part}"):
                shards = sorted(p.parent for p in folder.rglob("shard.json"))
                if shards:
                    present.add(GradientStore.open(shards, verify=False).hash)
    except PlantbenchError:
        pass  # a broken store is reported by check_files
    return present


def check_lineage(root: Path, metas: dict[str, dict[str, Any]]) -> list[Check]:
    present = present_hashes(root, metas)
    checks = []
    for name, meta in metas.items():
        missing = [
            k for k, h in meta["inputs"].items() if h not in present and k not in EXTERNAL_INPUTS
        ]
        if missing:
            checks.append(
                Check(
                    f"{name} (lineage)",
                    "FAIL",
                    f"made from {', '.join(missing)} that is not the one in this run",
                )
            )
    if not checks and metas:
        checks.append(Check("lineage", "PASS", f"all inputs of {len(metas)} artifacts are present"))
    return checks


def check_streams(paths: Paths) -> list[Check]:
    from .stream import open_stream

    checks, streams = [], {}
    for m in MODELS:
        try:
            s = open_stream(paths.stream(m), verify=False)
        except PlantbenchError as exc:
            checks.append(Check(f"stream/{m} windows", "FAIL", str(exc)))
            continue
        hashes = window_hashes(np.asarray(s.windows))
        bad = np.flatnonzero(hashes != s.manifest["hash"].to_numpy())
        if len(bad):
            checks.append(
                Check(
                    f"stream/{m} windows",
                    "FAIL",
                    f"{len(bad)} windows differ from the manifest's xxh3 (first: window {bad[0]}) in '{s.folder / 'tokens.bin'}'",
                )
            )
        else:
            checks.append(
                Check(f"stream/{m} windows", "PASS", f"{len(hashes)} windows match the manifest")
            )
        streams[m] = s
    if len(streams) == 2:
        a, b = streams["A"], streams["B"]
        planted = (a.manifest["kind"] == "planted").to_numpy()
        differ = (a.manifest["hash"] != b.manifest["hash"]).to_numpy()
        same_kinds = (a.manifest["kind"] == b.manifest["kind"]).all()
        if same_kinds and np.array_equal(differ, planted):
            checks.append(
                Check(
                    "streams A/B",
                    "PASS",
                    f"differ exactly at the {int(planted.sum())} planted windows",
                )
            )
        else:
            checks.append(
                Check(
                    "streams A/B", "FAIL", "A and B differ somewhere other than the planted windows"
                )
            )
    return checks


def reference_hashes(metas: dict[str, dict[str, Any]]) -> dict[str, str]:
    keep = [*PORTABLE, *(f"models/{m}" for m in MODELS), "causal"]
    return {k: metas[k]["hash"] for k in keep if k in metas}


def find_reference(cfg: dict[str, Any], ref_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    want = study_hash(cfg)
    for p in sorted(ref_dir.glob("*.json")):
        ref = json.loads(p.read_text())
        if ref.get("study_hash") == want:
            return p, ref
    return None


def check_reference(
    cfg: dict[str, Any], metas: dict[str, dict[str, Any]], ref_dir: Path
) -> list[Check]:
    found = find_reference(cfg, ref_dir)
    if found is None:
        return [
            Check(
                "reference", "SKIP", f"no reference in '{ref_dir}' for study hash {study_hash(cfg)}"
            )
        ]
    path, ref = found
    here = platform_key()
    checks = []
    for name, expected in ref["hashes"].items():
        if name not in metas:
            checks.append(Check(f"reference {name}", "SKIP", "not in this run"))
            continue
        portable = name in PORTABLE
        if portable and name != "facts":  # everything made from the corpus text
            if ref["platform"]["python"] != here["python"] and any(
                s.get("kind") == "stdlib" for s in cfg["corpus"]["sources"]
            ):
                checks.append(
                    Check(
                        f"reference {name}",
                        "SKIP",
                        f"stdlib corpus: reference made with Python {ref['platform']['python']}, this is {here['python']}",
                    )
                )
                continue
        if not portable and ref["platform"] != here:
            checks.append(
                Check(
                    f"reference {name}",
                    "SKIP",
                    "float artifact; reference made on another platform",
                )
            )
            continue
        actual = metas[name]["hash"]
        status = "PASS" if actual == expected else "FAIL"
        checks.append(Check(f"reference {name}", status, f"{actual} vs {path.name} {expected}"))
    return checks


def run(cfg: dict[str, Any], paths: Paths, *, ref_dir: Path | None = None) -> list[Check]:
    root = paths.root
    if not root.is_dir():
        raise ArtifactError(f"results folder '{root}' does not exist; run the study first")
    checks, metas = check_files(root)
    checks += check_lineage(root, metas)
    checks += check_streams(paths)
    checks += check_reference(cfg, metas, ref_dir or REFERENCE_DIR)
    return checks


def write_reference(
    cfg: dict[str, Any], paths: Paths, name: str, ref_dir: Path | None = None
) -> Path:
    _, metas = check_files(paths.root)
    ref = {
        "name": name,
        "study_hash": study_hash(cfg),
        "platform": platform_key(),
        "portable": [k for k in PORTABLE],
        "hashes": reference_hashes(metas),
    }
    out = (ref_dir or REFERENCE_DIR) / f"{name}.json"
    io.write_json(out, ref)
    return out


def format_checks(checks: list[Check]) -> str:
    width = max((len(c.artifact) for c in checks), default=10)
    return "\n".join(f"{c.status:<4}  {c.artifact:<{width}}  {c.detail}" for c in checks)
