"""``plantbench verify``: recompute and check a run's hashes, lineage, summaries and reference hashes.

What is checked, per artifact (one line each, PASS / FAIL / SKIP):
- every file of every artifact against the xxh3 recorded in its ``meta.json`` (gradient shards:
  their ``shard.json``), and the artifact hash against its files' hashes;
- lineage: every input hash an artifact records is the hash of an artifact present in the run;
- both streams: the manifest has one row per window, every window matches the manifest's xxh3,
  and A and B differ exactly at the planted windows;
- info: the numbers a meta's ``info`` summarizes (and the report prints) are recomputed from the
  artifact's files: pretraining (loss log, checkpoint index, parameters; every indexed checkpoint
  is on disk as indexed), causal table, streams, pools, facts, tokenizer and analysis;
- the reference hashes in ``results/reference/<name>.json`` whose study hash matches this config.

Every check is isolated: damaged input (a missing row, an unreadable file) becomes a FAIL line
naming what was unreadable, and the table is still printed. Every FAIL line ends with a recovery
made from the artifact's stage: delete its folder and rerun the CLI step (or Snakemake) that
makes it. A subfolder of the results folder that is itself a run (it holds its own config.json)
or is hidden is not part of this run and is skipped.

Reproducibility across machines: token data (facts, corpus, tokenizer, streams, pools) depends
only on the config, the package versions pinned in constraints.txt and, for the ``stdlib`` corpus
source, the Python version (its text is the standard library) — references record it and are
skipped with a note on another Python. Float artifacts (weights, hidden-state features, the
causal table) depend on the float path: :mod:`plantbench.floats` pins ATen's CPU capability and
MKL's code branch, so x86-64 CPUs give the same bytes; each artifact's ``meta.json`` records the
path it ran on (CPU capability, BLAS branch, threads, device, versions) and a reference records
the same for each float hash. A float hash is compared only where the two records match;
otherwise the line is a SKIP naming what differs, never a FAIL.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import platform
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plantbench import floats, io, layout, lineage, replicates, stages, userpaths
from plantbench.config import config_hash, study_hash
from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.hashing import hash_file, hash_tree, window_hashes
from plantbench.ops import reproduce
from plantbench.paths import CHECKOUT, MODELS, Paths, random_twin_name

PORTABLE = ("facts", "corpus", "tokenizer", "stream/A", "stream/B", "pool/A", "pool/B")
REFERENCE_DIR = CHECKOUT / "results" / "reference"
META_KEYS = ("stage", "hash", "files", "inputs", "info")
EXTERNAL_INPUTS = ("encoder",)  # made outside the run (an installed or local model folder)


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


# --------------------------------------------------------------------------------------------
# Recovery: which step makes an artifact
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """How an artifact is made: its meta stage, the CLI step and arguments, the Snakemake rule."""

    stage: str
    cli: str
    args: str
    rule: str

    def command(self, config: Path) -> str:
        return f"plantbench {self.cli} -c {shlex.quote(str(config))}{self.args}"


def step_of(name: str) -> Step | None:
    """The step that makes the artifact at ``name`` (relative to the results folder; under
    ``replicates/<r>/`` the same step with ``--replicate r``): the stage catalogue's row whose
    folders hold it (:func:`plantbench.stages.artifact_of`), its wildcards the CLI's arguments."""
    r, local = replicates.split_name(name)
    found = stages.artifact_of(local)
    if found is None:
        return None
    stage, values = found
    args = (f" --replicate {r}" if r else "") + stage.cli_args(values)
    return Step(stage.meta_stage, stage.command, args, stage.rule)


def recovery(paths: Paths, name: str) -> str:
    """What to do about a failed artifact: delete it and rerun the step that makes it."""
    folder = paths.root / name
    step = step_of(name)
    if step is None:
        return f"recover: delete '{folder}' and rerun the workflow (snakemake)"
    return (
        f"recover: delete '{folder}' and rerun `{step.command(paths.config)}` "
        f"(or `snakemake --forcerun {step.rule}`)"
    )


def _problem(exc: Exception, where: Path | str) -> str:
    """One line naming what could not be read (a PlantbenchError's own fix is left out: the
    check adds the recovery)."""
    if isinstance(exc, PlantbenchError):
        text = str(exc).split("; ")[0]
    elif isinstance(exc, OSError) and exc.filename:
        text = f"'{exc.filename}' is unreadable ({exc.strerror or type(exc).__name__})"
    else:
        text = f"'{where}' is unreadable ({type(exc).__name__}: {exc})"
    return " ".join(text.split())


def _fail(artifact: str, problems: list[str], recover: str) -> Check:
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return Check(artifact, "FAIL", f"{problems[0]}{more}; {recover}")


def _guard(artifact: str, where: Path, recover: str, fn: Callable[[], list[Check]]) -> list[Check]:
    """Run one check; an exception inside it becomes a FAIL line naming what was unreadable."""
    try:
        return fn()
    except Exception as exc:  # damaged input must not stop the other checks
        return [_fail(artifact, [_problem(exc, where)], recover)]


# --------------------------------------------------------------------------------------------
# The folders of this run (nested runs and hidden folders left out)
# --------------------------------------------------------------------------------------------


def is_run_root(folder: Path) -> bool:
    """A folder holding a run's own config.json (a JSON object with ``results``; a model
    checkpoint's config.json has none)."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and "results" in cfg


def _foreign(folder: Path) -> bool:
    return folder.name.startswith(".") or is_run_root(folder)


def run_folders(root: Path) -> Iterator[Path]:
    """Every folder of the run at ``root``, sorted, skipping hidden folders and nested runs."""
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not _foreign(here / d))
        yield here


def _in_run(root: Path, path: Path) -> bool:
    """``path`` (under ``root``) is not inside a hidden folder or a nested run."""
    rel = path.parent.relative_to(root)
    return not any(_foreign(root.joinpath(*rel.parts[: i + 1])) for i in range(len(rel.parts)))


def _glob(root: Path, pattern: str) -> list[Path]:
    return [p for p in sorted(root.glob(pattern)) if _in_run(root, p)]


def _named(root: Path, filename: str) -> list[Path]:
    return [d / filename for d in run_folders(root) if (d / filename).is_file()]


def artifacts(root: Path) -> dict[str, Path]:
    """Every finished artifact of the run at ``root`` (folders holding a meta.json), by relative
    name; nested runs and hidden folders are not part of it."""
    return {
        m.parent.relative_to(root).as_posix(): m.parent
        for m in _named(root, io.META)
        if m.parent != root
    }


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _read_meta(folder: Path) -> dict[str, Any]:
    path = folder / io.META
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"'{path}' is corrupt (not JSON)") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"'{path}' is not a JSON object")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ArtifactError(f"'{path}' lacks the key(s) {', '.join(missing)}")
    for key in ("files", "inputs", "info"):
        if not isinstance(meta[key], dict):
            raise ArtifactError(f"'{path}': '{key}' is not a JSON object")
    return meta


def _file_problems(name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    problems = []
    step = step_of(name)
    if step is not None and meta["stage"] != step.stage:
        problems.append(f"'{folder / io.META}' describes a '{meta['stage']}' artifact")
    for rel, expected in sorted(meta["files"].items()):
        f = folder / rel
        if not f.is_file():
            problems.append(f"'{f}' is missing")
        elif hash_file(f) != expected:
            problems.append(f"'{f}' does not match its recorded xxh3 (corrupt or edited)")
    if io.artifact_hash(meta["files"]) != meta["hash"]:
        problems.append(
            f"'{folder / io.META}' records hash {meta['hash']}, not the hash of its files (edited)"
        )
    return problems


def _check_artifact(
    paths: Paths, name: str, folder: Path, metas: dict[str, dict[str, Any]]
) -> list[Check]:
    meta = _read_meta(folder)
    metas[name] = meta  # lineage and info use what it records, even if a file is damaged
    problems = _file_problems(name, folder, meta)
    if problems:
        return [_fail(name, problems, recovery(paths, name))]
    return [Check(name, "PASS", f"{len(meta['files'])} files match their xxh3")]


def _check_shard(paths: Paths, name: str, folder: Path) -> list[Check]:
    from plantbench.attribution.gradients.store import GradientStore

    GradientStore.open([folder], verify=True)
    return [Check(name, "PASS", "gradient shard matches its xxh3")]


def check_files(root: Path) -> tuple[list[Check], dict[str, dict[str, Any]]]:
    """Every artifact's files against its meta.json, and every gradient shard; returns the
    checks and the metas that could be read."""
    paths = Paths(root)
    checks: list[Check] = []
    metas: dict[str, dict[str, Any]] = {}
    for name, folder in artifacts(root).items():
        run = lambda n=name, f=folder: _check_artifact(paths, n, f, metas)  # noqa: E731
        checks += _guard(name, folder / io.META, recovery(paths, name), run)
    for shard in _named(root, "shard.json"):
        name = shard.parent.relative_to(root).as_posix()
        run = lambda n=name, f=shard.parent: _check_shard(paths, n, f)  # noqa: E731
        checks += _guard(name, shard, recovery(paths, name), run)
    return checks, metas


# --------------------------------------------------------------------------------------------
# Lineage
# --------------------------------------------------------------------------------------------


def _store_hash(folder: Path) -> str | None:
    from plantbench.attribution.gradients.store import GradientStore

    shards = sorted(p.parent for p in folder.rglob("shard.json"))
    return GradientStore.open(shards, verify=False).hash if shards else None


def present_hashes(root: Path, metas: dict[str, dict[str, Any]]) -> set[str]:
    """Hashes of everything in the run an artifact may record as an input: artifacts,
    checkpoints (their index), gradient stores and curvature files. Anything unreadable is
    left out (the file and info checks report it)."""
    present = {m["hash"] for m in metas.values()}
    for rep in ("", f"{replicates.FOLDER}/*/"):  # replicate 0, then every other replicate
        for index in _glob(root, f"{rep}models/*/checkpoints/index.json"):
            with contextlib.suppress(Exception):
                present.update(c["hash"] for c in json.loads(index.read_text()))
        for moments in _glob(root, f"{rep}models/*/moments/*.pt"):  # TrackStar's input
            with contextlib.suppress(OSError):
                present.add(hash_file(moments))
        for curv in _glob(root, f"{rep}features/*/curvature/*/curvature.npz"):
            with contextlib.suppress(OSError):
                present.add(hash_file(curv))
        for part in ("pool", "queries"):
            for folder in _glob(root, f"{rep}features/*/grads/*/{part}"):
                with contextlib.suppress(Exception):
                    present.update(h for h in [_store_hash(folder)] if h)
    return present


def check_lineage(root: Path, metas: dict[str, dict[str, Any]]) -> list[Check]:
    paths = Paths(root)
    present = present_hashes(root, metas)
    checks = []
    for name, meta in metas.items():
        missing = [
            k for k, h in meta["inputs"].items() if h not in present and k not in EXTERNAL_INPUTS
        ]
        if missing:
            problem = f"made from {', '.join(missing)} that is not the one in this run"
            checks.append(_fail(f"{name} (lineage)", [problem], recovery(paths, name)))
    if not checks and metas:
        checks.append(Check("lineage", "PASS", f"all inputs of {len(metas)} artifacts are present"))
    return checks


def _records(root: Path, metas: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every artifact's record and every gradient shard's ``shard.json``, by relative name."""
    out = dict(metas)
    for shard in _named(root, "shard.json"):
        with contextlib.suppress(OSError, ValueError):
            out[shard.parent.relative_to(root).as_posix()] = json.loads(shard.read_text())
    return out


def check_config(
    cfg: dict[str, Any], paths: Paths, metas: dict[str, dict[str, Any]]
) -> list[Check]:
    """Every artifact was made under the config at hand's values for its rule (the same
    comparison each step's readers make: :func:`plantbench.lineage.problem`)."""
    ctx, checks, judged = _Ctx(cfg, paths), [], 0
    for name, meta in _records(paths.root, metas).items():
        if not isinstance(meta, dict) or lineage.KEY not in meta:
            continue
        judged += 1
        found = lineage.problem(_replicate_ctx(ctx, name)[0].cfg, meta, str(paths.root / name))
        if found is not None:
            recover = (
                f"recover: {lineage.fix(meta[lineage.KEY]['rule'], paths.config)}; a leftover "
                "of an earlier config can be deleted"
            )
            checks.append(_fail(f"{name} (config)", [found], recover))
    if judged and not checks:
        checks.append(Check("config", "PASS", f"{judged} artifacts were made under this config"))
    return checks


# --------------------------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------------------------


def _manifest_problem(s: Any) -> str | None:
    """None when the manifest has exactly one row per window of tokens.bin, in order."""
    from plantbench.data.stream import MANIFEST

    n, rows = len(s.windows), len(s.manifest)
    where = s.folder / MANIFEST
    if rows != n:
        return (
            f"'{where}' has {rows} rows for the {n} windows of tokens.bin (rows missing or extra)"
        )
    if not np.array_equal(s.manifest["index"].to_numpy(), np.arange(n)):
        return f"'{where}' rows are not the windows 0..{n - 1} in order"
    return None


def _window_check(paths: Paths, m: str, streams: dict[str, Any], pre: str = "") -> list[Check]:
    from plantbench.data.stream import open_stream

    name = f"{pre}stream/{m}"
    s = open_stream(paths.stream(m), verify=False)
    problem = _manifest_problem(s)
    if problem is None:
        mask_rows = s.manifest["mask_row"].to_numpy() if s.masks is not None else None
        hashes = window_hashes(np.asarray(s.windows), s.masks, mask_rows)
        bad = np.flatnonzero(hashes != s.manifest["hash"].to_numpy())
        if len(bad):
            problem = (
                f"{len(bad)} windows differ from the manifest's xxh3 (first: window {bad[0]}) "
                f"in '{s.folder / 'tokens.bin'}'"
            )
        else:
            problem = _grid_token_problem(paths, s)
        if problem is None:
            streams[m] = s
            return [Check(f"{name} windows", "PASS", f"{len(hashes)} windows match the manifest")]
    return [_fail(f"{name} windows", [problem], recovery(Paths(paths.shared), name))]


def _grid_token_problem(paths: Paths, s: Any) -> str | None:
    """A recall window holding a grid entity's or answer's token sequence, if any (not looked
    for when the facts or the tokenizer cannot be opened: their own checks fail then)."""
    from plantbench.data import recall, tokenizer

    rows = np.flatnonzero(s.manifest["kind"].to_numpy() == "recall")
    if not len(rows):
        return None
    try:
        facts = io.read_parquet(paths.facts / "facts.parquet")
        tok = tokenizer.load(paths.tokenizer)
    except ArtifactError:
        return None
    guard = recall.GridGuard(recall.grid_sequences(tok, facts))
    for i in rows.tolist():
        if guard.find(np.asarray(s.windows[i])) is not None:
            return f"recall window {i} holds the tokens of a grid entity or answer"
    return None


def _pair_check(paths: Paths, a: Any, b: Any, pre: str = "") -> list[Check]:
    label, recover = f"{pre}streams A/B", recovery(Paths(paths.shared), f"{pre}stream/A")
    if len(a.manifest) != len(b.manifest):
        problem = f"A has {len(a.manifest)} windows and B {len(b.manifest)}"
        return [_fail(label, [problem], recover)]
    planted = (a.manifest["kind"] == "planted").to_numpy()
    differ = a.manifest["hash"].to_numpy() != b.manifest["hash"].to_numpy()
    same_kinds = np.array_equal(a.manifest["kind"].to_numpy(), b.manifest["kind"].to_numpy())
    if same_kinds and np.array_equal(differ, planted):
        detail = f"differ exactly at the {int(planted.sum())} planted windows"
        return [Check(label, "PASS", detail)]
    problem = "A and B differ somewhere other than the planted windows"
    return [_fail(label, [problem], recover)]


def check_streams(paths: Paths, pre: str = "") -> list[Check]:
    """Both streams of one replicate (``pre``: its folder under the results, '' for 0)."""
    checks: list[Check] = []
    streams: dict[str, Any] = {}
    shared = Paths(paths.shared)
    for m in MODELS:
        name = f"{pre}stream/{m}"
        run = lambda m=m: _window_check(paths, m, streams, pre)  # noqa: E731
        checks += _guard(f"{name} windows", paths.stream(m), recovery(shared, name), run)
    label = f"{pre}streams A/B"
    if len(streams) == len(MODELS):
        a, b = (streams[m] for m in MODELS)
        run = lambda: _pair_check(paths, a, b, pre)  # noqa: E731
        checks += _guard(label, paths.stream("A"), recovery(shared, f"{pre}stream/A"), run)
    else:
        checks.append(Check(label, "SKIP", "a stream is damaged (see above)"))
    return checks


def check_replicate_streams(cfg: dict[str, Any]) -> list[Check]:
    """The streams of every replicate r >= 1 that has been built (replicate 0: check_streams)."""
    checks: list[Check] = []
    for r in range(1, replicates.count(cfg)):
        paths = Paths(replicates.select(cfg, r))
        if not paths.root.is_dir():
            checks.append(Check(f"replicate {r}", "SKIP", f"'{paths.root}' is not built yet"))
            continue
        checks += check_streams(paths, replicates.wildcard(r))
    return checks


# --------------------------------------------------------------------------------------------
# Info: what a meta summarizes, recomputed from the artifact's files
# --------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    numbers = (int, float, np.integer, np.floating)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        if isinstance(a, float | np.floating) or isinstance(b, float | np.floating):
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        return int(a) == int(b)
    return a == b


def _show(v: Any) -> str:
    text = json.dumps(
        v, sort_keys=True, default=lambda x: x.item() if hasattr(x, "item") else str(x)
    )
    return text if len(text) <= 120 else text[:117] + "..."


def _compare(
    info: dict[str, Any], recomputed: dict[str, Any], source: str, prefix: str = "info."
) -> list[str]:
    """One problem per field of ``recomputed`` that ``info`` records otherwise (a dict with
    the same keys: per differing key, e.g. ``info.counts.planted``)."""
    problems = []
    for k, v in recomputed.items():
        got = info.get(k)
        if _same(got, v):
            continue
        if isinstance(got, dict) and isinstance(v, dict) and got.keys() == v.keys():
            problems += _compare(got, v, source, f"{prefix}{k}.")
        else:
            problems.append(f"{prefix}{k} is {_show(got)}, recomputed {_show(v)} from {source}")
    return problems


def _safetensors_params(folder: Path) -> int:
    """Parameters stored in a checkpoint's safetensors files (read from their headers)."""
    total = 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def _checkpoint_problems(folder: Path, meta: dict[str, Any], index: list[Any]) -> list[str]:
    """Every indexed checkpoint is on disk, hashes as indexed, and is part of the meta."""
    problems = []
    for c in index:
        ckpt = folder / "checkpoints" / c["name"]
        listed = {f for f in meta["files"] if f.startswith(f"checkpoints/{c['name']}/")}
        if not ckpt.is_dir() or not any(p.is_file() for p in ckpt.rglob("*")):
            problems.append(f"checkpoint '{ckpt}' listed in checkpoints/index.json is missing")
        elif hash_tree(ckpt) != c["hash"]:
            problems.append(f"checkpoint '{ckpt}' differs from its checkpoints/index.json entry")
        elif not listed:
            problems.append(f"checkpoint '{ckpt}' is not among the files of '{folder / io.META}'")
    return problems


def _model_name(folder: Path) -> str:
    """The model a pretrain folder holds: a twin's folder name, or a random twin's name
    (``models/random/007`` holds ``r007``)."""
    if folder.parent.name == "random" and folder.name.isdigit():
        return random_twin_name(int(folder.name))
    return folder.name


def _pretrain_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    with open(folder / "loss.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    index = json.loads((folder / "checkpoints" / "index.json").read_text())
    tail = rows[-max(1, len(rows) // 20) :]
    from_loss = {
        "steps": len(rows),
        "tokens": int(rows[-1]["tokens"]) if rows else 0,
        "final_loss": float(np.mean([float(r["loss"]) for r in tail])) if tail else None,
        "final_loss_window": len(tail),
    }
    from_index = {
        "checkpoints": [c["name"] for c in index],
        "final_checkpoint": index[-1]["name"] if index else None,
    }
    problems = _compare(meta["info"], {"model": _model_name(folder)}, "the folder name")
    problems += _compare(meta["info"], from_loss, "loss.csv")
    problems += _compare(meta["info"], from_index, "checkpoints/index.json")
    problems += _checkpoint_problems(folder, meta, index)
    if index and not problems:
        params = _safetensors_params(folder / "checkpoints" / index[-1]["name"])
        problems += _compare(meta["info"], {"params": params}, "the final checkpoint")
    return problems


def _causal_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    from plantbench.truth import in_context

    facts = io.read_parquet(folder / "facts.parquet")
    recomputed = {"n_facts": len(facts), "learned_rate": float(facts["learned"].mean())}
    problems = _compare(meta["info"], recomputed, "facts.parquet")
    if "in_context" in meta["info"]:
        rates = in_context.summary(io.read_parquet(folder / in_context.TABLE))
        problems += _compare(meta["info"], {"in_context": rates}, in_context.TABLE)
    return problems


def _stream_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    from plantbench.data.stream import KINDS, MANIFEST, TOKENS

    man = io.read_parquet(folder / MANIFEST)
    kinds = man["kind"].value_counts().to_dict()
    recomputed = {
        "model": folder.name,
        "n_windows": len(man),
        "steps": int(man["step"].max()) + 1 if len(man) else 0,
        "batch_windows": int((man["step"] == 0).sum()),
        "counts": {k: int(kinds.get(k, 0)) for k in KINDS},
    }
    problems = _compare(meta["info"], recomputed, MANIFEST)
    itemsize = np.dtype(meta["info"].get("dtype", "uint16")).itemsize
    tokens = (folder / TOKENS).stat().st_size // itemsize
    return problems + _compare(meta["info"], {"tokens": tokens}, TOKENS)


def _pool_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:

    table = io.read_parquet(folder / layout.POOL_FILE)
    kinds = table["kind"].value_counts().to_dict()
    recomputed = {
        "model": folder.name,
        "n_pool": len(table),
        "counts": {k: int(kinds.get(k, 0)) for k in ("planted", "distractor", "background")},
    }
    return _compare(meta["info"], recomputed, layout.POOL_FILE)


def _facts_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    from plantbench.data import facts

    tables = {t: io.read_parquet(folder / f"{t}.parquet") for t in facts.TABLES}
    return _compare(meta["info"], facts.info(tables), "the facts tables")


def _tokenizer_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    from tokenizers import Tokenizer

    from plantbench.data.tokenizer import SPECIAL_TOKENS, TOKENIZER_JSON

    tok = Tokenizer.from_file(str(folder / TOKENIZER_JSON))
    recomputed = {
        "vocab_size": tok.get_vocab_size(),
        "special_tokens": {t: tok.token_to_id(t) for t in SPECIAL_TOKENS},
    }
    return _compare(meta["info"], recomputed, TOKENIZER_JSON)


def _analysis_info(ctx: _Ctx, name: str, folder: Path, meta: dict[str, Any]) -> list[str]:
    import pandas as pd

    from plantbench.grading.analysis import empty_learned_cells

    facts = io.read_parquet(ctx.paths.causal / "facts.parquet")
    methods = pd.read_csv(folder / "retrieval.csv", usecols=["method"])["method"]
    problems = _compare(meta["info"], {"methods": list(dict.fromkeys(methods))}, "retrieval.csv")
    recomputed = {"n_facts": len(facts), "cells_without_learned": empty_learned_cells(facts)}
    problems += _compare(meta["info"], recomputed, "causal/facts.parquet")
    if meta["config_hash"] != config_hash(ctx.cfg, ["seed", "methods", "analysis"]):
        return [*problems, "made with another seed/methods/analysis config than the one given"]
    acfg = ctx.cfg["analysis"]
    recomputed = {"bootstrap": int(acfg["bootstrap"]), "alpha": float(acfg["alpha"])}
    return problems + _compare(meta["info"], recomputed, "the config")


@dataclass(frozen=True)
class _Ctx:
    cfg: dict[str, Any]
    paths: Paths


INFO_CHECKS: dict[str, Callable[[_Ctx, str, Path, dict[str, Any]], list[str]]] = {
    "pretrain": _pretrain_info,
    "causal": _causal_info,
    "stream": _stream_info,
    "pool": _pool_info,
    "facts": _facts_info,
    "tokenizer": _tokenizer_info,
    "analysis": _analysis_info,
}


def _replicate_ctx(ctx: _Ctx, name: str) -> tuple[_Ctx, str]:
    """The context of the replicate that ``name`` belongs to, and its name inside it (a
    folder on disk is checked even when the config now asks for fewer replicates)."""
    r, local = replicates.split_name(name)
    if r == 0:
        return ctx, name
    cfg = {**ctx.cfg, replicates.KEY: r}
    return _Ctx(cfg, Paths(cfg)), local


def _info_check(ctx: _Ctx, name: str, meta: dict[str, Any]) -> list[Check]:
    rctx, local = _replicate_ctx(ctx, name)
    problems = INFO_CHECKS[meta["stage"]](rctx, local, ctx.paths.root / name, meta)
    return [_fail(f"{name} (info)", problems, recovery(ctx.paths, name))] if problems else []


def check_info(cfg: dict[str, Any], paths: Paths, metas: dict[str, dict[str, Any]]) -> list[Check]:
    """Recompute what each meta's ``info`` summarizes; FAIL names the field, both values and
    the recovery."""
    ctx = _Ctx(cfg, paths)
    checks: list[Check] = []
    layout = {n: step_of(n) for n in metas}  # the stage the folder's place implies
    names = [
        n
        for n, m in metas.items()
        if m["stage"] in INFO_CHECKS and getattr(layout[n], "stage", None) == m["stage"]
    ]
    for name in names:
        run = lambda n=name: _info_check(ctx, n, metas[n])  # noqa: E731
        checks += _guard(f"{name} (info)", paths.root / name, recovery(paths, name), run)
    if names and not checks:
        checks.append(
            Check("info", "PASS", f"the info of {len(names)} artifacts matches their files")
        )
    return checks


# --------------------------------------------------------------------------------------------
# Reference hashes
# --------------------------------------------------------------------------------------------


PREFIX = "models/prefix"  # the shared prefix (absent without train.prefix_steps)
FLOAT_REFERENCED = (
    PREFIX,
    *(f"models/{m}" for m in MODELS),
    "causal",
    "reading",
    *(f"features/{m}/hidden" for m in MODELS),
)


def referenced(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The artifacts a reference records for ``cfg``: the token artifacts (:data:`PORTABLE`)
    and the float ones (:data:`FLOAT_REFERENCED`), the shared prefix only with one."""
    prefix = layout.prefix_steps(cfg) > 0
    return tuple(k for k in (*PORTABLE, *FLOAT_REFERENCED) if prefix or k != PREFIX)


def reference_hashes(cfg: dict[str, Any], metas: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {k: metas[k]["hash"] for k in referenced(cfg) if k in metas}


# --- what a reference must hold before it is believed ---------------------------------------

XXH3 = re.compile(r"[0-9a-f]{32}")
_JSON_TYPES = {
    dict: "a JSON object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
}
REFERENCE_KEYS: dict[str, type] = {
    "name": str,
    "study_hash": str,
    "platform": dict,
    "portable": list,
    "pinned": dict,
    "float_platforms": dict,
    "hashes": dict,
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    kind = next((t for t in _JSON_TYPES if isinstance(value, t)), None)
    return _JSON_TYPES[kind] if kind is not None else type(value).__name__


def _schema_problems(ref: dict[str, Any]) -> list[str]:
    problems = [f"lacks the key '{k}'" for k in REFERENCE_KEYS if k not in ref]
    for key, want in REFERENCE_KEYS.items():
        if key in ref and not isinstance(ref[key], want):
            problems.append(f"'{key}' is {_json_type(ref[key])}, not {_JSON_TYPES[want]}")
    platform = ref.get("platform")
    if isinstance(platform, dict) and not all(
        isinstance(platform.get(k), str) for k in platform_key()
    ):
        problems.append(f"'platform' lacks one of {', '.join(platform_key())} (as strings)")
    return problems


def _hash_problem(name: str, value: Any) -> str | None:
    if value is None or value == "":
        return f"hashes['{name}'] is {'null' if value is None else 'empty'}"
    if not isinstance(value, str) or not XXH3.fullmatch(value):
        return f"hashes['{name}'] is {json.dumps(value)}, not an xxh3 hash (32 hex digits)"
    return None


def _hashes_problems(cfg: dict[str, Any], hashes: dict[str, Any]) -> list[str]:
    want = referenced(cfg)
    if not hashes:
        return ["'hashes' is empty"]
    problems = []
    missing = [k for k in want if k not in hashes]
    if missing:
        problems.append(
            f"'hashes' lacks {', '.join(missing)} (a reference records every one of "
            f"{', '.join(want)})"
        )
    problems += [
        f"'hashes' names {k}, which a reference does not record" for k in hashes if k not in want
    ]
    problems += [p for k, v in hashes.items() if (p := _hash_problem(k, v)) is not None]
    return problems


def _float_platform_problems(ref: dict[str, Any]) -> list[str]:
    made = ref["float_platforms"]
    floating = [k for k in ref["hashes"] if k in FLOAT_REFERENCED]
    missing = [k for k in floating if not isinstance(made.get(k), dict)]
    return [f"'float_platforms' lacks {', '.join(missing)}"] if missing else []


def reference_problems(cfg: dict[str, Any], ref: dict[str, Any]) -> list[str]:
    """What makes ``ref`` unfit to compare with a run of ``cfg`` (none: it may be believed):
    a required key missing or of the wrong type, an artifact :func:`referenced` names left
    out, an unknown artifact, a null, empty or malformed hash, a float hash without its path."""
    problems = _schema_problems(ref)
    if problems:
        return problems
    problems = _hashes_problems(cfg, ref["hashes"]) + _float_platform_problems(ref)
    return problems + reproduce.problems(ref)


class MalformedReference(ArtifactError):
    """A reference file that cannot be believed: what is wrong with it, one item each."""

    def __init__(self, path: Path, problems: list[str]):
        super().__init__(f"'{path}' is malformed: {problems[0]}")
        self.path, self.problems = path, problems


def find_reference(cfg: dict[str, Any], ref_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The reference for ``cfg``'s study hash, checked (:func:`reference_problems`), or None;
    a file that is not JSON, or the one found malformed, raises :class:`MalformedReference`."""
    want = study_hash(cfg)
    for p in sorted(ref_dir.glob("*.json")):
        try:
            ref = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise MalformedReference(p, ["not JSON"]) from None
        if isinstance(ref, dict) and ref.get("study_hash") == want:
            problems = reference_problems(cfg, ref)
            if problems:
                raise MalformedReference(p, problems)
            return p, ref
    return None


def _repo_path(path: Path) -> str:
    """``path`` as the repository names it (relative to the checkout), else as it is."""
    try:
        return path.resolve().relative_to(CHECKOUT).as_posix()
    except ValueError:
        return str(path)


def reference_recovery(paths: Paths, path: Path) -> str:
    """How to mend a reference file: restore it from git, or rewrite it from a trusted run."""
    shown = _repo_path(path)
    rewrite = f"plantbench verify -c {shlex.quote(str(paths.config))} --write-reference"
    return (
        f"recover: restore it from git (`git restore {shlex.quote(shown)}`) or rewrite it from a "
        f"run you trust (`{rewrite} {shlex.quote(path.stem)}`)"
    )


def _reference_fail(paths: Paths, bad: MalformedReference) -> Check:
    problems = [f"'{_repo_path(bad.path)}' is malformed: {bad.problems[0]}", *bad.problems[1:]]
    return _fail("reference", problems, reference_recovery(paths, bad.path))


def _portable_skip(cfg: dict[str, Any], name: str, ref: dict[str, Any]) -> str | None:
    """Why the reference hash of token artifact ``name`` does not apply here (None: it does):
    only the stdlib corpus depends on the machine (the Python version's standard library)."""
    here = platform_key()
    if name == "facts" or ref["platform"]["python"] == here["python"]:
        return None
    if any(s.get("kind") == "stdlib" for s in cfg["corpus"]["sources"]):
        return (
            f"stdlib corpus: reference made with Python {ref['platform']['python']}, "
            f"this is {here['python']}"
        )
    return None


def _float_skip(name: str, ref: dict[str, Any], meta: dict[str, Any]) -> str | None:
    """Why the reference hash of float artifact ``name`` is not comparable with this run's
    (None: it is): the float path the reference recorded for it differs from the one this
    run's artifact records (CPU capability, BLAS branch, threads, device, versions)."""
    if "platform" not in meta:
        return "this run's artifact records no float path (made before it was recorded); rerun it"
    diff = floats.differences(meta["platform"], ref["float_platforms"][name])
    if diff:
        return "float artifact made on another float path: " + "; ".join(diff)
    return None


def _reference_skip(
    cfg: dict[str, Any], name: str, ref: dict[str, Any], metas: dict[str, dict[str, Any]]
) -> str | None:
    """Why the reference hash of ``name`` does not apply to this run (None: it does)."""
    if name not in metas:
        return "not in this run"
    if name in PORTABLE:
        return _portable_skip(cfg, name, ref)
    return _float_skip(name, ref, metas[name])


def _intact(paths: Paths, name: str, meta: dict[str, Any]) -> bool:
    """Whether the artifact's files match its own meta.json (it is not damaged; a meta without
    its record of files cannot tell, and counts as damaged)."""
    try:
        return not _file_problems(name, paths.root / name, meta)
    except (OSError, KeyError, TypeError, AttributeError):
        return False


def _differs(paths: Paths, name: str, meta: dict[str, Any]) -> str:
    """The advice for an artifact whose hash is not the reference's: an intact one is kept
    (the config, the packages or the float path differ); a damaged one is rebuilt."""
    pinned = "install the pinned packages (`pip install -c constraints.txt -e .`)"
    if _intact(paths, name, meta):
        return (
            f"'{paths.root / name}' is intact (its files match its meta.json): the difference "
            f"comes from the config, the installed packages or the float path, not from damage; "
            f"{pinned}"
        )
    return f"{recovery(paths, name)}; if it still differs, {pinned}"


def _compare_reference(
    cfg: dict[str, Any], paths: Paths, metas: dict[str, dict[str, Any]], ref_dir: Path
) -> list[Check]:
    found = find_reference(cfg, ref_dir)
    if found is None:
        detail = f"no reference in '{ref_dir}' for study hash {study_hash(cfg)}"
        return [Check("reference", "SKIP", detail)]
    path, ref = found
    checks = []
    for name, expected in ref["hashes"].items():
        skip = _reference_skip(cfg, name, ref, metas)
        if skip is not None:
            checks.append(Check(f"reference {name}", "SKIP", skip))
            continue
        actual = metas[name]["hash"]
        detail = f"{actual} vs {path.name} {expected}"
        if actual == expected:
            checks.append(Check(f"reference {name}", "PASS", detail))
        else:
            checks.append(_fail(f"reference {name}", [detail], _differs(paths, name, metas[name])))
    return checks


def check_reference(
    cfg: dict[str, Any], metas: dict[str, dict[str, Any]], ref_dir: Path
) -> list[Check]:
    """The run's hashes against the reference for its study in ``ref_dir``; a malformed
    reference is one FAIL line that blames the file and says how to mend it."""
    paths = Paths(cfg)
    recover = f"recover: restore the damaged file in '{ref_dir}' from git (they are committed)"

    def compare() -> list[Check]:
        try:
            return _compare_reference(cfg, paths, metas, ref_dir)
        except MalformedReference as bad:
            return [_reference_fail(paths, bad)]

    return _guard("reference", ref_dir, recover, compare)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def run(cfg: dict[str, Any], paths: Paths, *, ref_dir: Path | None = None) -> list[Check]:
    root = userpaths.check(
        paths.root,
        userpaths.FOLDER,
        userpaths.config_key("results"),
        "a run's results folder",
        missing="run the study first",
    )
    checks, metas = check_files(root)
    recover = "recover: rerun `plantbench verify`; if this persists, report it as a bug"
    checks += _guard("lineage", root, recover, lambda: check_lineage(root, metas))
    checks += _guard("config", root, recover, lambda: check_config(cfg, paths, metas))
    checks += check_streams(paths)
    checks += check_replicate_streams(cfg)
    checks += _guard("info", root, recover, lambda: check_info(cfg, paths, metas))
    checks += check_reference(cfg, metas, ref_dir or REFERENCE_DIR)
    checks += check_reproduction(cfg, paths, ref_dir or REFERENCE_DIR, checks)
    return checks


def _other_platform(checks: list[Check]) -> str | None:
    """The first float path difference the reference checks found (None: every float hash
    was compared on the reference's own path)."""
    for c in checks:
        if c.artifact.startswith("reference ") and c.status == "SKIP" and "float path" in c.detail:
            return c.detail.split(": ", 1)[-1]
    return None


def _reproduction(
    cfg: dict[str, Any], paths: Paths, ref: dict[str, Any], other: str | None
) -> list[Check]:
    checks = []
    moved = reproduce.departure(paths, ref)
    if moved is not None:
        checks.append(Check("reference first steps", "SKIP", moved))
    elif ref.get(reproduce.FIRST_STEPS):
        n = len(ref[reproduce.FIRST_STEPS]["loss"])
        checks.append(
            Check("reference first steps", "PASS", f"the first {n} steps match bit for bit")
        )
    if not ref.get(reproduce.FINDINGS):
        detail = (
            "the reference records no findings; rewrite it from a finished run (--write-reference)"
        )
        return [*checks, Check("reproduction", "SKIP", detail)]
    ok, line = reproduce.verdict(cfg, paths, ref)
    if other is not None:
        line = f"floats from another platform ({other}): {line}"
    return [*checks, Check("reproduction", "PASS" if ok else "FAIL", line)]


def check_reproduction(
    cfg: dict[str, Any], paths: Paths, ref_dir: Path, checks: list[Check]
) -> list[Check]:
    """Did the run reproduce the study (the last line of verify)? Where the float path is the
    reference's, the hashes say it; elsewhere the findings and numbers do
    (:func:`plantbench.ops.reproduce.verdict`). Needs a finished analysis and a reference."""
    if not (paths.analysis / io.META).is_file():
        return []
    try:
        found = find_reference(cfg, ref_dir)
    except MalformedReference:
        return []  # the reference line already blames the file
    if found is None:
        return []
    recover = "recover: finish the run (snakemake) so that every table the findings read exists"
    return _guard(
        "reproduction",
        paths.root,
        recover,
        lambda: _reproduction(cfg, paths, found[1], _other_platform(checks)),
    )


def reference_record(
    cfg: dict[str, Any], metas: dict[str, dict[str, Any]], name: str
) -> dict[str, Any]:
    """The reference ``name`` of a run of ``cfg`` whose artifacts recorded ``metas``."""
    hashes = reference_hashes(cfg, metas)
    return {
        "name": name,
        "study_hash": study_hash(cfg),
        "platform": platform_key(),
        "portable": list(PORTABLE),
        "pinned": floats.pinned_summary(),
        "float_platforms": {k: metas[k].get("platform", {}) for k in hashes if k not in PORTABLE},
        "hashes": hashes,
    }


def write_reference(
    cfg: dict[str, Any], paths: Paths, name: str, ref_dir: Path | None = None
) -> Path:
    """Write ``<ref_dir>/<name>.json`` from a whole, undamaged run: every artifact
    :func:`referenced` names is present and its files match its meta.json."""
    checks, metas = check_files(paths.root)
    failed = {c.artifact for c in checks if c.status == "FAIL"}
    bad = [k for k in referenced(cfg) if k not in metas or k in failed]
    if bad:
        raise ArtifactError(
            f"cannot write reference '{name}': the run lacks {', '.join(bad)} (missing, or its "
            "files do not match its meta.json); finish the run (snakemake) and check it with "
            "`plantbench verify` first"
        )
    ref = reference_record(cfg, metas, name)
    if (paths.analysis / io.META).is_file():  # the study's findings and numbers
        ref.update(reproduce.record(cfg, paths))
    problems = reference_problems(cfg, ref)
    if problems:  # what verify would refuse to read back
        raise ArtifactError(f"cannot write reference '{name}': it {problems[0]}")
    out = (ref_dir or REFERENCE_DIR) / f"{name}.json"
    io.write_json(out, ref)
    return out


def format_checks(checks: list[Check]) -> str:
    width = max((len(c.artifact) for c in checks), default=10)
    return "\n".join(f"{c.status:<4}  {c.artifact:<{width}}  {c.detail}" for c in checks)


# --------------------------------------------------------------------------------------------
# Release bundles (`plantbench export`; `plantbench verify --bundle DIR`)
# --------------------------------------------------------------------------------------------

BUNDLE_RECOVER = "recover: export again (`plantbench export`, or `snakemake export`)"
BUNDLE_FOLDER = "a release bundle folder (written by plantbench export)"


def _bundle_fail(what: str, problem: str) -> Check:
    return Check(what, "FAIL", f"{problem}; {BUNDLE_RECOVER}")


def _bundle_meta(bundle: Path) -> dict[str, Any]:
    meta = _read_meta(bundle)
    if meta["stage"] != "export":
        raise ArtifactError(f"'{bundle / io.META}' describes a '{meta['stage']}' artifact")
    return meta


def bundle_file_checks(bundle: Path, meta: dict[str, Any]) -> list[Check]:
    """Every file against the bundle's meta.json; a file the meta does not list fails too."""
    from plantbench.ops.export import bundle_files

    recorded = meta["files"]
    checks = []
    for rel, expected in sorted(recorded.items()):
        f = bundle / rel
        if not f.is_file():
            checks.append(_bundle_fail(f"bundle/{rel}", f"'{f}' is missing"))
        elif hash_file(f) != expected:
            checks.append(_bundle_fail(f"bundle/{rel}", f"'{f}' does not match its recorded xxh3"))
    for rel in sorted(set(bundle_files(bundle)) - set(recorded)):
        checks.append(_bundle_fail(f"bundle/{rel}", f"'{bundle / rel}' is not in {io.META}"))
    if io.artifact_hash(recorded) != meta["hash"]:
        checks.append(_bundle_fail("bundle", f"'{bundle / io.META}' hash is not its files' hash"))
    return checks or [Check("bundle files", "PASS", f"{len(recorded)} files match their xxh3")]


def _table_problem(bundle: Path, dd: Any, name: str, rows: int) -> str | None:
    import pyarrow.parquet as pq

    from plantbench.ops.export import DATA

    table = pq.read_table(bundle / DATA / f"{name}.parquet")
    if name not in dd:
        return f"the dataset has no split '{name}'"
    copy = dd[name].data.table
    if table.num_rows != rows or copy.num_rows != rows:
        return f"{table.num_rows} parquet rows, {copy.num_rows} dataset rows, meta says {rows}"
    if copy.column_names != table.column_names or not copy.cast(table.schema).equals(table):
        return "the parquet and the dataset copies hold different rows"
    return None


def bundle_table_checks(bundle: Path, meta: dict[str, Any]) -> list[Check]:
    """Each table's parquet file and dataset split hold the same rows, as many as recorded."""
    import datasets

    from plantbench.ops.export import DATASET

    dd = datasets.load_from_disk(str(bundle / DATASET))
    checks = []
    for name, rows in meta["info"]["tables"].items():
        what = f"bundle table {name}"
        problem = _guard_problem(lambda n=name, r=rows: _table_problem(bundle, dd, n, r), bundle)
        checks.append(
            _bundle_fail(what, problem) if problem else Check(what, "PASS", f"{rows} rows agree")
        )
    return checks


def _guard_problem(fn: Callable[[], str | None], where: Path) -> str | None:
    try:
        return fn()
    except Exception as exc:  # a damaged table must not stop the other checks
        return _problem(exc, where)


def _key_problems(facts: Any, key: Any, per_query: Any) -> list[str]:
    """The answer key against its definitions (src/plantbench/truth/causal.py)."""
    effect = key["logp_reader"] - key["logp_other"]
    problems = []
    if not np.allclose(key["effect"], effect, rtol=0, atol=1e-9):
        problems.append("effect is not logp_reader - logp_other")
    if not (key["learned"] == ((key["effect"] > 0) & (key["rank"] == 1))).all():
        problems.append("learned is not (effect > 0 and rank == 1)")
    if not np.allclose(key["difficulty"], -key["logp_other"], rtol=0, atol=1e-9):
        problems.append("difficulty is not -logp_other")
    if sorted(key["fact_id"]) != sorted(facts["fact_id"]):
        problems.append("the answer key's facts are not the facts table's")
    means = per_query.groupby("fact_id")[["logp_reader", "logp_other"]].mean()
    mine = key.set_index("fact_id").loc[means.index, ["logp_reader", "logp_other"]]
    if not np.allclose(mine.to_numpy(), means.to_numpy(), rtol=0, atol=1e-9):
        problems.append("logp_reader / logp_other are not the mean over causal_queries' forms")
    return problems


def _in_context_problems(key: Any, ic: Any) -> list[str]:
    reader = key.set_index("fact_id")["reader"]
    if not set(ic["fact_id"]) <= set(reader.index):
        return ["in_context names facts the answer key lacks"]
    is_reader = ic["model"].to_numpy() == reader.loc[ic["fact_id"]].to_numpy()
    if not ((ic["role"] == "reader").to_numpy() == is_reader).all():
        return ["in_context's role is not 'reader' exactly where the twin read the fact"]
    return []


def bundle_key_checks(bundle: Path) -> list[Check]:
    from plantbench.ops.export import parquet_table

    t = {n: parquet_table(bundle, n).to_pandas() for n in ("facts", "causal_facts")}
    t |= {n: parquet_table(bundle, n).to_pandas() for n in ("causal_queries", "in_context")}
    problems = _key_problems(t["facts"], t["causal_facts"], t["causal_queries"])
    problems += _in_context_problems(t["causal_facts"], t["in_context"])
    if problems:
        return [_bundle_fail("bundle answer key", f"{problems[0]} ({len(problems)} problem(s))")]
    n = len(t["causal_facts"])
    return [Check("bundle answer key", "PASS", f"{n} facts: effect, learned, difficulty agree")]


def bundle_model_checks(bundle: Path, meta: dict[str, Any]) -> list[Check]:
    """Each twin's checkpoint folder is the run's final checkpoint (its recorded hash_tree)."""
    from plantbench.ops.export import CHECKPOINTS

    checks = []
    for m in MODELS:
        folder = bundle / CHECKPOINTS / m
        what = f"bundle checkpoint {m}"
        if hash_tree(folder) != meta["inputs"].get(f"checkpoint_{m}"):
            checks.append(_bundle_fail(what, f"'{folder}' is not the run's final checkpoint"))
        else:
            checks.append(Check(what, "PASS", "the final checkpoint, as recorded"))
    return checks


def run_bundle(bundle: Path) -> list[Check]:
    """Every check of a release bundle; damaged input becomes a FAIL line, never an exception
    (a ``bundle`` that is no folder: the line says why, as for every path a user gives)."""
    cause = userpaths.problem(bundle, userpaths.FOLDER)
    if cause is not None:
        return [
            Check("bundle", "FAIL", userpaths.message(bundle, cause, "--bundle", BUNDLE_FOLDER))
        ]
    try:
        meta = _bundle_meta(bundle)
    except Exception as exc:
        return [_bundle_fail("bundle", _problem(exc, bundle / io.META))]
    checks = bundle_file_checks(bundle, meta)
    for what, fn in (
        ("bundle tables", lambda: bundle_table_checks(bundle, meta)),
        ("bundle answer key", lambda: bundle_key_checks(bundle)),
        ("bundle checkpoints", lambda: bundle_model_checks(bundle, meta)),
    ):
        checks += _guard(what, bundle, BUNDLE_RECOVER, fn)
    return checks
