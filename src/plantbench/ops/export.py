"""``plantbench export``: the release bundle of a finished run, as the study's seed published its
benchmark (default ``<results>/export/``; see results/README.md, section export/).

Layout of the bundle (written whole or not at all; every file's xxh3 is in its ``meta.json``):

- ``data/<table>.parquet``: every table as a plain parquet file (the card's YAML ``configs``
  name them, so ``datasets.load_dataset(<bundle>, "<table>")`` reads one);
- ``dataset/``: the same tables as a ``datasets.DatasetDict`` saved with ``save_to_disk``, one
  split per table (``datasets.load_from_disk(<bundle>/dataset)``);
- ``checkpoints/A``, ``checkpoints/B``: the two twins' final checkpoint folders, copied whole
  (``AutoModelForCausalLM.from_pretrained`` loads them), and ``tokenizer/``: the tokenizer;
- ``scores/<method>/<model>/scores.npy``: the full score matrices the run kept (pool row order);
- ``README.md``: the dataset card (what each table is, its columns and rows, how it was made,
  the hashes of the artifacts it came from).

Tables from several models or methods are concatenated with key columns first (``model``;
``method``, ``model``), in config order. The bundle is a pure function of the run's artifacts:
exporting twice gives byte-identical files.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from plantbench import __version__, artifacts, io
from plantbench.config import study_hash
from plantbench.hashing import hash_file
from plantbench.paths import MODELS, Paths

STAGE = "export"
DATA = "data"
DATASET = "dataset"
CHECKPOINTS = "checkpoints"
TOKENIZER = "tokenizer"
CARD = "README.md"


@dataclass(frozen=True)
class Table:
    """One exported table: its name (the split and config), what it is, and its sources:
    (key columns added in front, source file relative to the results folder)."""

    name: str
    description: str
    sources: tuple[tuple[tuple[tuple[str, str], ...], str], ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.sources[0][0])


def _single(name: str, rel: str, description: str) -> Table:
    return Table(name, description, (((), rel),))


def _per_model(name: str, rel: str, description: str) -> Table:
    return Table(name, description, tuple(((("model", m),), rel.format(m=m)) for m in MODELS))


def _per_score(name: str, file: str, methods: list[str], description: str) -> Table:
    src = tuple(
        ((("method", meth), ("model", m)), f"scores/{meth}/{m}/{file}")
        for meth in methods
        for m in MODELS
    )
    return Table(name, description, src)


def tables(methods: list[str]) -> list[Table]:
    """Every table of the bundle, in card order."""
    return [
        _single("facts", "facts/facts.parquet", "the invented facts, one row per fact"),
        _single("documents", "facts/documents.parquet", "the planted documents of each fact"),
        _single("distractors", "facts/distractors.parquet", "distractor documents (both twins)"),
        _single("queries", "facts/queries.parquet", "two query forms per fact"),
        _single("candidates", "facts/candidates.parquet", "the answer candidates of each fact"),
        _single(
            "causal_facts",
            "causal/facts.parquet",
            "the answer key: each fact's causal effect (effect = logp_reader - logp_other), "
            "rank, learned flag (effect > 0 and rank == 1) and difficulty (-logp_other)",
        ),
        _single("causal_queries", "causal/queries.parquet", "the answer key per query form"),
        _single(
            "in_context",
            "causal/in_context.parquet",
            "the in-context check: fact x form x twin x condition",
        ),
        _per_model(
            "stream",
            "stream/{m}/manifest.parquet",
            "the stream order: one row per training window (index, step, kind, fact, document, "
            "xxh3-64 hash of its tokens), per twin",
        ),
        _per_model("pool", "pool/{m}/pool.parquet", "the windows each twin's methods rank"),
        _per_score(
            "scores_own",
            "own.parquet",
            methods,
            "every method's score and rank counts of each query's own planted windows",
        ),
        _per_score(
            "scores_topk", "topk.parquet", methods, "every method's top-k windows per query"
        ),
        _per_score(
            "scores_queries", "queries.parquet", methods, "every method's per-query score summary"
        ),
    ]


def default_out(paths: Paths) -> Path:
    return paths.export


def _methods(cfg: dict[str, Any]) -> list[str]:
    from plantbench.attribution.methods import registry

    return registry.enabled(cfg)


def source_metas(cfg: dict[str, Any], paths: Paths) -> dict[str, dict[str, Any]]:
    """The artifacts the bundle is made from (each checked against its hashes), by input name."""
    metas = {
        "facts": io.read_meta(paths.facts, "facts"),
        "tokenizer": io.read_meta(paths.tokenizer, "tokenizer"),
        "causal": io.read_meta(paths.causal, "causal"),
    }
    for m in MODELS:
        metas[f"stream_{m}"] = io.read_meta(paths.stream(m), "stream")
        metas[f"pool_{m}"] = io.read_meta(paths.pool(m), "pool")
        metas[f"model_{m}"] = io.read_meta(paths.model(m), "pretrain")
    for meth in _methods(cfg):
        for m in MODELS:
            metas[f"score_{meth}_{m}"] = io.read_meta(paths.scores(meth, m), "scores")
    return metas


def _read_table(table: Table, root: Path) -> pd.DataFrame:
    frames = []
    for keys, rel in table.sources:
        df = io.read_parquet(root / rel)
        for i, (k, v) in enumerate(keys):
            df.insert(i, k, v)
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _write_dataset(specs: list[Table], data: Path, out: Path) -> None:
    """The parquet tables as one DatasetDict (a split per table); the fingerprint of a split is
    its parquet file's xxh3, so the saved folder is byte-identical across exports."""
    import datasets

    datasets.disable_progress_bars()
    splits = {}
    for t in specs:
        path = data / f"{t.name}.parquet"
        info = datasets.DatasetInfo(description=t.description)
        splits[t.name] = datasets.Dataset(
            pq.read_table(path), info=info, split=t.name, fingerprint=hash_file(path)[:16]
        )
    datasets.DatasetDict(splits).save_to_disk(str(out))


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=shutil.copyfile)


def _checkpoint_inputs(paths: Paths, metas: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each twin's final checkpoint hash (hash_tree of its folder, from checkpoints/index.json)."""

    return {
        f"checkpoint_{m}": artifacts.checkpoint_entry(
            paths, m, metas[f"model_{m}"]["info"]["final_checkpoint"]
        )["hash"]
        for m in MODELS
    }


def _copy_models(paths: Paths, metas: dict[str, dict[str, Any]], out: Path) -> None:
    for m in MODELS:
        final = metas[f"model_{m}"]["info"]["final_checkpoint"]
        _copy_tree(paths.checkpoints(m) / final, out / CHECKPOINTS / m)
    (out / TOKENIZER).mkdir()
    for name in sorted(metas["tokenizer"]["files"]):
        shutil.copyfile(paths.tokenizer / name, out / TOKENIZER / name)


def _copy_matrices(paths: Paths, methods: list[str], out: Path) -> list[str]:
    from plantbench.attribution.scoring import SCORES_NPY

    copied = []
    for meth in methods:
        for m in MODELS:
            src = paths.scores(meth, m) / SCORES_NPY
            if src.is_file():
                rel = f"scores/{meth}/{m}/{SCORES_NPY}"
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out / rel)
                copied.append(rel)
    return copied


def bundle_files(root: Path) -> Iterator[str]:
    """Every file of the bundle at ``root`` but its own meta.json, sorted, relative."""
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != io.META:
            yield rel


def _schema_lines(path: Path) -> list[str]:
    schema = pq.read_schema(path)
    return [f"`{f.name}` ({f.type})" for f in schema]


def _front_matter(specs: list[Table]) -> list[str]:
    lines = ["---", "license: apache-2.0", "pretty_name: plantbench release bundle", "configs:"]
    for t in specs:
        lines += [f"- config_name: {t.name}", f"  data_files: {DATA}/{t.name}.parquet"]
    return [*lines, "---", ""]


def _table_section(t: Table, data: Path, rows: int) -> list[str]:
    srcs = ", ".join(f"`{rel}`" for _, rel in t.sources[:4])
    more = f" and {len(t.sources) - 4} more" if len(t.sources) > 4 else ""
    keys = f" Key columns added in front: {', '.join(t.keys)}." if t.keys else ""
    return [
        f"### {t.name}",
        "",
        f"{t.description[0].upper()}{t.description[1:]}. {rows} rows, from {srcs}{more} of the "
        f"run.{keys}",
        "",
        "Columns: " + ", ".join(_schema_lines(data / f"{t.name}.parquet")) + ".",
        "",
    ]


def card(
    cfg: dict[str, Any],
    specs: list[Table],
    rows: dict[str, int],
    inputs: dict[str, str],
    matrices: list[str],
    data: Path,
) -> str:
    """The dataset card: what the bundle is, each table, how it was made, where it came from."""
    lines = [
        *_front_matter(specs),
        "# plantbench release bundle",
        "",
        "Two twin language models pretrained on the same token stream except for the planted "
        "documents of invented facts (twin A reads A's facts, twin B reads B's), the causal "
        "effect of those documents on each fact (the answer key), and every attribution "
        "method's scores, graded against it. Made by `plantbench export` from one finished run.",
        "",
        "## Load it",
        "",
        "```python",
        "import datasets",
        f'tables = datasets.load_from_disk("{DATASET}")  # a DatasetDict, one split per table',
        f'facts = datasets.load_dataset("parquet", data_files="{DATA}/facts.parquet")',
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f'model_a = AutoModelForCausalLM.from_pretrained("{CHECKPOINTS}/A")',
        f'tok = AutoTokenizer.from_pretrained("{TOKENIZER}")',
        "```",
        "",
        "Check it: `plantbench verify --bundle <this folder>` (every file against `meta.json`, "
        "parquet and dataset copies, the answer key's definitions).",
        "",
        "## Tables",
        "",
    ]
    for t in specs:
        lines += _table_section(t, data, rows[t.name])
    lines += [
        "## Other files",
        "",
        f"- `{CHECKPOINTS}/A`, `{CHECKPOINTS}/B`: each twin's final checkpoint folder, copied "
        "whole (its hash_tree is the input `checkpoint_A` / `checkpoint_B` below).",
        f"- `{TOKENIZER}/`: the byte-level BPE tokenizer both twins were trained with.",
        *(f"- `{m}`: the full float32 score matrix, queries x pool rows" for m in matrices),
        "- `meta.json`: the xxh3-128 of every file of the bundle and the inputs below.",
        "",
        "## How it was made",
        "",
        f"plantbench {__version__}, study hash `{study_hash(cfg)}` (the config without its "
        f"output folder), seed {cfg['seed']}. Column definitions: results/README.md of the "
        "plantbench repository. The artifacts it was made from (artifact hashes, xxh3-128):",
        "",
        "| input | hash |",
        "|---|---|",
        *(f"| {k} | `{v}` |" for k, v in sorted(inputs.items())),
        "",
    ]
    return "\n".join(lines)


def _write_tables(specs: list[Table], root: Path, data: Path) -> dict[str, int]:
    rows = {}
    for t in specs:
        df = _read_table(t, root)
        io.write_parquet(data / f"{t.name}.parquet", df)
        rows[t.name] = len(df)
    return rows


def run(cfg: dict[str, Any], paths: Paths, out: Path) -> dict[str, Any]:
    """Write the bundle at ``out`` (replacing a previous one whole) and return its meta."""
    metas = source_metas(cfg, paths)
    methods = _methods(cfg)
    specs = tables(methods)
    inputs = {k: v["hash"] for k, v in metas.items()} | _checkpoint_inputs(paths, metas)
    with io.atomic_dir(out) as tmp:
        rows = _write_tables(specs, paths.root, tmp / DATA)
        _write_dataset(specs, tmp / DATA, tmp / DATASET)
        _copy_models(paths, metas, tmp)
        matrices = _copy_matrices(paths, methods, tmp)
        io.write_text(tmp / CARD, card(cfg, specs, rows, inputs, matrices, tmp / DATA))
        meta = io.write_meta(
            tmp,
            STAGE,
            list(bundle_files(tmp)),
            config_hash=study_hash(cfg),
            inputs=inputs,
            info={"tables": rows, "methods": methods, "matrices": matrices},
        )
    return meta


def table_names(meta: dict[str, Any]) -> list[str]:
    return list(meta["info"]["tables"])


def parquet_table(bundle: Path, name: str) -> pa.Table:
    return pq.read_table(bundle / DATA / f"{name}.parquet")
