"""The twin token streams: fixed-length windows (memmap) plus a manifest row per window.

Layout rules (see results/README.md):
- The stream has ``train.steps * train.batch_windows`` windows of ``stream.window`` tokens;
  optimizer step ``s`` reads windows ``[s*B, (s+1)*B)`` in order.
- Planted documents of position p occupy seeded random slots inside p's span of the stream.
  A's fact and B's fact of the same (domain, n_docs, position, pair) share their slots: at slot
  k, model A reads document k of its fact and model B document k of its own. That is the only
  place the two streams differ.
- Distractor documents (read by both) occupy seeded random free slots across the whole stream.
- A document window is ``<bos> document <eos>`` followed by held-out padding text taken from a
  fixed offset that depends only on the window index, so A and B pad identically wherever they
  read the same document.
- Every other window is background: ``<bos> doc <eos>`` training documents concatenated in a
  seeded order and cut into consecutive windows (both models read the same background).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import io, tokenizer
from .config import canonical_json
from .errors import ArtifactError, ConfigError
from .hashing import hash_bytes, window_hashes
from .paths import MODELS, Paths
from .rng import rng

log = logging.getLogger(__name__)

KINDS = ("background", "planted", "distractor")
TOKENS = "tokens.bin"
MANIFEST = "manifest.parquet"


def stream_config_hash(cfg: dict[str, Any]) -> str:
    t = cfg["train"]
    sub = {
        "seed": cfg["seed"],
        "stream": cfg["stream"],
        "steps": t["steps"],
        "batch_windows": t["batch_windows"],
    }
    return hash_bytes(canonical_json(sub).encode())


@dataclass(frozen=True)
class Slot:
    """One document window: which document each model reads there."""

    index: int
    kind: str
    doc_a: str
    doc_b: str
    fact_a: str
    fact_b: str


def n_windows(cfg: dict[str, Any]) -> int:
    return int(cfg["train"]["steps"]) * int(cfg["train"]["batch_windows"])


def span_windows(cfg: dict[str, Any], position: str) -> range:
    n = n_windows(cfg)
    lo, hi = cfg["stream"]["position_spans"][position]
    return range(int(np.floor(lo * n)), int(np.floor(hi * n)))


def plan_slots(
    cfg: dict[str, Any], facts: pd.DataFrame, documents: pd.DataFrame, distractors: pd.DataFrame
) -> list[Slot]:
    """Assign every planted and distractor document to a window index (seeded)."""
    seed = cfg["seed"]
    n = n_windows(cfg)
    taken = np.zeros(n, dtype=bool)
    docs_by_fact = {f: g["doc_id"].tolist() for f, g in documents.groupby("fact_id", sort=True)}
    slots: list[Slot] = []
    for position in cfg["facts"]["positions"]:
        span = span_windows(cfg, position)
        sub = facts[facts["position"] == position]
        pairs: list[tuple[str, str]] = []  # (doc of A, doc of B) per planted slot
        fact_pairs: list[tuple[str, str]] = []
        keys = ["domain", "n_docs", "pair"]
        for _, grp in sub.groupby(keys, sort=True):
            by_reader = {r: row for r, row in zip(grp["reader"], grp.itertuples(), strict=True)}
            if set(by_reader) != set(MODELS):
                raise ArtifactError(
                    f"facts table has an unpaired cell {tuple(grp[keys].iloc[0])}; rebuild the facts step"
                )
            fa, fb = by_reader["A"].fact_id, by_reader["B"].fact_id
            da, db = docs_by_fact.get(fa, []), docs_by_fact.get(fb, [])
            if len(da) != len(db):
                raise ArtifactError(
                    f"facts {fa} and {fb} are paired but have {len(da)} and {len(db)} documents"
                )
            pairs.extend(zip(da, db, strict=True))
            fact_pairs.extend([(fa, fb)] * len(da))
        free = np.array([i for i in span if not taken[i]], dtype=np.int64)
        if len(pairs) > len(free):
            raise ConfigError(
                f"the fact grid does not fit in the stream: position '{position}' needs {len(pairs)} "
                f"windows but its span has {len(free)}; raise train.steps or lower facts.n_docs / "
                f"facts.facts_per_cell"
            )
        g = rng(seed, "stream-slots", position)
        chosen = np.sort(g.choice(free, size=len(pairs), replace=False))
        order = g.permutation(len(pairs))
        for idx, j in zip(chosen, order, strict=True):
            (da, db), (fa, fb) = pairs[j], fact_pairs[j]
            taken[idx] = True
            slots.append(Slot(int(idx), "planted", da, db, fa, fb))
    free = np.flatnonzero(~taken)
    if len(distractors) > len(free):
        raise ConfigError(
            f"the distractor documents ({len(distractors)}) do not fit in the stream's {len(free)} free "
            "windows; raise train.steps or lower facts.distractors_per_entity"
        )
    g = rng(seed, "stream-distractors")
    chosen = np.sort(g.choice(free, size=len(distractors), replace=False))
    order = g.permutation(len(distractors))
    drows = distractors.sort_values("doc_id").reset_index(drop=True)
    for idx, j in zip(chosen, order, strict=True):
        row = drows.iloc[int(j)]
        slots.append(Slot(int(idx), "distractor", row.doc_id, row.doc_id, row.fact_id, row.fact_id))
    slots.sort(key=lambda s: s.index)
    return slots


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def _background_tokens(
    cfg: dict[str, Any], tok: Any, texts: list[str], needed: int, dtype: np.dtype
) -> tuple[np.ndarray, int]:
    """Concatenate ``<bos> doc <eos>`` of training documents (seeded order) until ``needed``
    tokens; if the corpus is too small, start another seeded pass (an epoch) and record it.
    Kept in the stream's token dtype (2 bytes a token below 65,536 tokens) to bound memory."""
    out: list[np.ndarray] = []
    have, epoch = 0, 0
    while have < needed:
        order = rng(cfg["seed"], "background-order", epoch).permutation(len(texts))
        for start in range(0, len(order), 512):
            batch = [texts[i] for i in order[start : start + 512]]
            for ids in tokenizer.encode_batch(tok, batch):
                arr = np.asarray([tokenizer.BOS_ID, *ids, tokenizer.EOS_ID], dtype=dtype)
                out.append(arr)
                have += len(arr)
            if have >= needed:
                break
        epoch += 1
        if epoch > 1000:
            raise ConfigError("the corpus is too small to fill the stream; add corpus sources")
    return np.concatenate(out)[:needed], epoch


def build(cfg: dict[str, Any], paths: Paths) -> dict[str, dict[str, Any]]:
    """Build both streams into ``paths.stream('A')`` and ``paths.stream('B')``."""
    t0 = time.time()
    facts_meta = io.read_meta(paths.facts, "facts")
    corpus_meta = io.read_meta(paths.corpus, "corpus")
    tok_meta = io.read_meta(paths.tokenizer, "tokenizer")
    io.check_input(tok_meta, "corpus", corpus_meta, str(paths.tokenizer))
    facts = io.read_parquet(paths.facts / "facts.parquet")
    documents = io.read_parquet(paths.facts / "documents.parquet")
    distractors = io.read_parquet(paths.facts / "distractors.parquet")
    corpus = io.read_parquet(paths.corpus / "corpus.parquet")
    tok = tokenizer.load(paths.tokenizer)
    vocab = tok.get_vocab_size()
    W = int(cfg["stream"]["window"])
    N = n_windows(cfg)
    B = int(cfg["train"]["batch_windows"])

    slots = plan_slots(cfg, facts, documents, distractors)
    log.info("stream: %d windows of %d tokens, %d document slots", N, W, len(slots))

    # Tokenize every document once; check that each fits its window.
    doc_text = dict(zip(documents["doc_id"], documents["text"], strict=True))
    doc_text.update(zip(distractors["doc_id"], distractors["text"], strict=True))
    ids = sorted(doc_text)
    doc_tokens = dict(
        zip(ids, tokenizer.encode_batch(tok, [doc_text[i] for i in ids]), strict=True)
    )
    longest = max(doc_tokens, key=lambda d: len(doc_tokens[d]))
    if len(doc_tokens[longest]) + 2 > W:
        raise ConfigError(
            f"stream.window = {W} is shorter than document {longest} ({len(doc_tokens[longest]) + 2} "
            "tokens with <bos>/<eos>); raise stream.window"
        )

    heldout_texts = corpus.loc[corpus["split"] == "heldout", "text"].tolist()
    train_texts = corpus.loc[corpus["split"] == "train", "text"].tolist()
    if not heldout_texts or not train_texts:
        raise ArtifactError(
            f"corpus '{paths.corpus}' has no train or no held-out documents; check corpus sources"
        )
    dtype = _token_dtype(vocab)
    pad_stream, _ = _background_tokens(
        cfg, tok, heldout_texts, max(4 * W, min(len(slots), 4096) * W), dtype
    )
    n_background = N - len(slots)
    bg, epochs = _background_tokens(cfg, tok, train_texts, n_background * W, dtype)
    bg = bg.reshape(n_background, W)
    slot_at = {s.index: s for s in slots}

    def doc_window(doc_id: str, index: int) -> np.ndarray:
        body = np.asarray([tokenizer.BOS_ID, *doc_tokens[doc_id], tokenizer.EOS_ID], dtype=dtype)
        need = W - len(body)
        start = (index * W) % (len(pad_stream) - W)
        return np.concatenate([body, pad_stream[start : start + need]])

    inputs = {
        "facts": facts_meta["hash"],
        "corpus": corpus_meta["hash"],
        "tokenizer": tok_meta["hash"],
    }
    metas: dict[str, dict[str, Any]] = {}
    for model in MODELS:
        out = paths.stream(model)
        out.mkdir(parents=True, exist_ok=True)
        kind = np.empty(N, dtype=object)
        fact_id = np.empty(N, dtype=object)
        doc_id = np.empty(N, dtype=object)
        n_doc_tokens = np.zeros(N, dtype=np.int64)
        # windows go straight into a memmap of the temporary file (no second copy in memory)
        with io.atomic_path(out / TOKENS) as tmp:
            windows = np.memmap(tmp, dtype=dtype.newbyteorder("<"), mode="w+", shape=(N, W))
            b = 0
            for i in range(N):
                s = slot_at.get(i)
                if s is None:
                    windows[i] = bg[b]
                    b += 1
                    kind[i], fact_id[i], doc_id[i] = "background", "", ""
                else:
                    d, f = (s.doc_a, s.fact_a) if model == "A" else (s.doc_b, s.fact_b)
                    windows[i] = doc_window(d, i)
                    kind[i], doc_id[i], fact_id[i] = s.kind, d, f
                    n_doc_tokens[i] = len(doc_tokens[d]) + 2
            windows.flush()
            hashes = window_hashes(windows)
            del windows
        manifest = pd.DataFrame(
            {
                "index": np.arange(N, dtype=np.int64),
                "step": np.arange(N, dtype=np.int64) // B,
                "kind": kind.astype(str),
                "fact_id": fact_id.astype(str),
                "doc_id": doc_id.astype(str),
                "doc_tokens": n_doc_tokens,
                "hash": hashes,
            }
        )
        io.write_parquet(out / MANIFEST, manifest)
        counts = manifest["kind"].value_counts().to_dict()
        metas[model] = io.write_meta(
            out,
            "stream",
            [TOKENS, MANIFEST],
            config_hash=stream_config_hash(cfg),
            inputs=inputs,
            info={
                "model": model,
                "n_windows": N,
                "window": W,
                "batch_windows": B,
                "steps": int(cfg["train"]["steps"]),
                "dtype": str(dtype),
                "vocab_size": vocab,
                "tokens": N * W,
                "background_epochs": epochs,
                "counts": {k: int(counts.get(k, 0)) for k in KINDS},
            },
        )
        log.info("stream %s: %s windows written (%.1fs)", model, counts, time.time() - t0)
    return metas


@dataclass
class Stream:
    """Read access to one model's stream: ``windows[i]`` is window ``i`` (a memmap row)."""

    folder: Path
    meta: dict[str, Any]
    windows: np.ndarray
    manifest: pd.DataFrame

    @property
    def batch_windows(self) -> int:
        return int(self.meta["info"]["batch_windows"])

    def batch(self, step: int) -> np.ndarray:
        B = self.batch_windows
        return self.windows[step * B : (step + 1) * B]


def open_stream(folder: str | Path, *, verify: bool = True) -> Stream:
    folder = Path(folder)
    meta = io.read_meta(folder, "stream", verify=verify)
    info = meta["info"]
    shape = (int(info["n_windows"]), int(info["window"]))
    dtype = np.dtype(info["dtype"]).newbyteorder("<")
    path = folder / TOKENS
    expected = shape[0] * shape[1] * dtype.itemsize
    if path.stat().st_size != expected:
        raise ArtifactError(
            f"'{path}' has {path.stat().st_size} bytes, expected {expected}; rerun the stream step"
        )
    windows = np.memmap(path, dtype=dtype, mode="r", shape=shape)
    manifest = io.read_parquet(folder / MANIFEST)
    return Stream(folder, meta, windows, manifest)


def format_batch(stream: Stream, step: int, tok: Any, width: int = 72) -> str:
    """The windows of one optimizer step, with kinds, documents, hashes and a text preview."""
    info = stream.meta["info"]
    if not 0 <= step < int(info["steps"]):
        raise ConfigError(
            f"--step {step} is out of range; this stream has steps 0..{int(info['steps']) - 1}"
        )
    B = stream.batch_windows
    rows = stream.manifest.iloc[step * B : (step + 1) * B]
    lines = [f"model {info['model']}  step {step}  windows {step * B}..{(step + 1) * B - 1}"]
    lines.append(f"{'index':>8}  {'kind':<10}  {'fact':<6}  {'doc':<8}  {'xxh3':<16}  text")
    for r in rows.itertuples():
        text = tok.decode([int(x) for x in stream.windows[r.index]], skip_special_tokens=False)
        preview = text.replace("\n", "⏎")[:width]
        lines.append(
            f"{r.index:>8}  {r.kind:<10}  {r.fact_id or '-':<6}  {r.doc_id or '-':<8}  "
            f"{int(r.hash):016x}  {preview}"
        )
    return "\n".join(lines)
