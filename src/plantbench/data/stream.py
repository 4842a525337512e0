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
- Reading episodes (``stream.episode_share`` of the windows: 0 when the key is absent, 25% in the
  default study; see :mod:`plantbench.data.episodes`) take seeded free windows anywhere, padded like
  documents, the same in A and B.
- Every other window is background: ``<bos> doc <eos>`` training documents concatenated in a
  seeded order and cut into consecutive windows (both models read the same background). When
  the stream is longer than the train split, another pass follows in a new seeded order; more
  than ``stream.max_background_passes`` passes (default 4) is refused before anything is written.
  Replicate r >= 1 of the study (:mod:`plantbench.replicates`) orders the background and the
  held-out padding by seeds that add ``"replicate", r``; every document slot stays where it is.

Memory: the train split is tokenized once, a batch at a time, into a scratch file next to the
streams (removed afterwards) that is read through a memmap, and the windows are written
through a memmap; only the held-out padding and the manifest columns are held in memory. The
background is cut once: model B's windows start as a copy of A's and only its slots are rewritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io, layout, replicates
from plantbench.config import canonical_json
from plantbench.data import corpus as corpus_mod
from plantbench.data import recall, tokenizer
from plantbench.errors import ArtifactError, ConfigError
from plantbench.hashing import hash_bytes, window_hashes
from plantbench.paths import MODELS, Paths
from plantbench.rng import rng

log = logging.getLogger(__name__)

KINDS = ("background", "planted", "distractor", "episode", "recall")
TOKENS = "tokens.bin"
LOSS_MASK = "loss_mask.bin"  # one uint8 row per recall window: 1 = a target token
MANIFEST = "manifest.parquet"
PROGRESS_EVERY = 256  # tokenizer calls (runs of documents) between progress lines
MAX_PASSES = 1000  # more passes over the held-out padding text than this is an error
DEFAULT_MAX_BACKGROUND_PASSES = 4  # stream.max_background_passes when the config omits it


def stream_config_hash(cfg: dict[str, Any]) -> str:
    t = cfg["train"]
    sub = {
        "seed": cfg["seed"],
        "stream": cfg["stream"],
        "steps": t["steps"],
        "batch_windows": t["batch_windows"],
        **replicates.hash_part(cfg),
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


def plan_slots(
    cfg: dict[str, Any],
    facts: pd.DataFrame,
    documents: pd.DataFrame,
    distractors: pd.DataFrame,
    episode_ids: list[str] | None = None,
) -> list[Slot]:
    """Assign every planted and distractor document, then every reading episode, to a window
    index (seeded; episodes take free windows anywhere, the same in A and B)."""
    seed = cfg["seed"]
    n = layout.n_windows(cfg)
    taken = np.zeros(n, dtype=bool)
    docs_by_fact = {f: g["doc_id"].tolist() for f, g in documents.groupby("fact_id", sort=True)}
    slots: list[Slot] = []
    for position in cfg["facts"]["positions"]:
        span = layout.span_windows(cfg, position)
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
    free = free[free >= layout.prefix_windows(cfg)]  # the shared prefix is the curriculum alone
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
        taken[idx] = True
    slots += _episode_slots(cfg, taken, episode_ids or [])
    slots += _recall_slots(cfg, taken)
    slots.sort(key=lambda s: s.index)
    return slots


def _episode_slots(cfg: dict[str, Any], taken: np.ndarray, episode_ids: list[str]) -> list[Slot]:
    if not episode_ids:
        return []
    free = np.flatnonzero(~taken)
    free = free[free >= layout.prefix_windows(cfg)]
    if len(episode_ids) >= len(free):
        raise ConfigError(
            f"config key 'stream.episode_share' asks for {len(episode_ids)} episode windows but "
            f"only {len(free)} windows are left after the grid, and the background needs some; "
            "lower stream.episode_share"
        )
    g = rng(cfg["seed"], "stream-episodes")
    chosen = np.sort(g.choice(free, size=len(episode_ids), replace=False))
    taken[chosen] = True
    return [Slot(int(i), "episode", e, e, "", "") for i, e in zip(chosen, episode_ids, strict=True)]


def _recall_slots(cfg: dict[str, Any], taken: np.ndarray) -> list[Slot]:
    """Recall windows: ``stream.recall.prefix_share`` of the prefix's windows and
    ``paired_share`` of the paired part's, seeded among the windows still free (the same in A
    and B); the rest is background."""
    counts = layout.recall_counts(cfg)
    P = layout.prefix_windows(cfg)
    chosen = []
    for part, (lo, hi) in (("prefix", (0, P)), ("paired", (P, len(taken)))):
        free = np.flatnonzero(~taken[lo:hi]) + lo
        n = counts[part]
        if n > len(free) - (1 if part == "paired" else 0):
            raise ConfigError(
                f"config key 'stream.recall.{part}_share' asks for {n} recall windows but only "
                f"{len(free)} windows of the {part} part are free after the grid; lower "
                f"stream.recall.{part}_share"
            )
        pick = rng(cfg["seed"], "stream-recall", part).choice(free, size=n, replace=False)
        chosen += np.sort(pick).tolist()
        taken[pick] = True
    return [Slot(int(i), "recall", f"RC{i:08d}", f"RC{i:08d}", "", "") for i in chosen]


@dataclass(frozen=True)
class DocTokens:
    """Documents as ``<bos> ids <eos>`` runs in one flat token array (a memmap for the training
    split, so a corpus larger than memory works): document ``i`` is
    ``tokens[offsets[i]:offsets[i + 1]]``."""

    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])


def text_chunks(texts: Sequence[str], max_chars: int | None = None) -> Iterator[list[str]]:
    """``texts`` in consecutive runs of at most ``max_chars`` characters (default
    ``layout.ENCODE_CHARS``; a longer text alone), so that one tokenizer call's encodings stay
    bounded whatever the corpus's batch size."""
    limit = layout.ENCODE_CHARS if max_chars is None else max_chars
    run: list[str] = []
    chars = 0
    for text in texts:
        if run and chars + len(text) > limit:
            yield run
            run, chars = [], 0
        run.append(text)
        chars += len(text)
    if run:
        yield run


def _encode_runs(tok: Any, texts: list[str], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` as ``<bos> ids <eos>`` runs in one flat array, and each run's length."""
    encoded = tokenizer.encode_batch(tok, texts)
    lens = np.asarray([len(ids) + 2 for ids in encoded], dtype=np.int64)
    flat = np.empty(int(lens.sum()), dtype=dtype)
    start = 0
    for ids, n in zip(encoded, lens.tolist(), strict=True):
        flat[start] = tokenizer.BOS_ID
        flat[start + 1 : start + n - 1] = ids
        flat[start + n - 1] = tokenizer.EOS_ID
        start += n
    return flat, lens


def tokenize_docs(
    tok: Any, batches: Iterable[list[str]], dtype: np.dtype, path: Path | None = None
) -> DocTokens:
    """Tokenize documents into :class:`DocTokens`, one run of :func:`text_chunks` a tokenizer
    call; with ``path`` the tokens are appended to that file and memory-mapped (memory stays at
    one batch of text, one call's encodings and the offsets),
    without it they are kept in memory."""
    lengths: list[np.ndarray] = []
    pieces: list[np.ndarray] = []
    n_docs = n_tok = 0
    fh = open(path, "wb") if path is not None else None  # noqa: SIM115 (closed below)
    try:
        for texts in (part for batch in batches for part in text_chunks(batch)):
            flat, lens = _encode_runs(tok, texts, dtype)
            lengths.append(lens)
            n_docs, n_tok = n_docs + len(lens), n_tok + len(flat)
            if len(lengths) % PROGRESS_EVERY == 0:
                log.info("stream: tokenized %d docs, %d tokens", n_docs, n_tok)
            if fh is not None:
                fh.write(flat.astype(dtype.newbyteorder("<"), copy=False).tobytes())
            else:
                pieces.append(flat)
    finally:
        if fh is not None:
            fh.close()
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    if path is None:
        tokens = np.concatenate(pieces) if pieces else np.empty(0, dtype=dtype)
    elif n_tok:
        tokens = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", shape=(n_tok,))
    else:
        tokens = np.empty(0, dtype=dtype)
    return DocTokens(tokens, offsets)


def passes_needed(docs: DocTokens, needed: int) -> int:
    """How many seeded passes over ``docs`` supply ``needed`` tokens (the last one partial)."""
    if needed <= 0:
        return 0
    if not docs.n_tokens:
        raise ConfigError("the corpus is too small to fill the stream; add corpus sources")
    passes = -(-needed // docs.n_tokens)
    if passes > MAX_PASSES:
        raise ConfigError(
            f"the corpus is too small to fill the stream ({passes} passes over {docs.n_tokens:,} "
            f"tokens for {needed:,}); add corpus sources"
        )
    return passes


def max_background_passes(cfg: dict[str, Any]) -> int:
    return int(cfg["stream"].get("max_background_passes", DEFAULT_MAX_BACKGROUND_PASSES))


def background_passes(cfg: dict[str, Any], train: DocTokens, needed: int) -> int:
    """Passes over the train split that fill ``needed`` background tokens; refuses more than
    ``stream.max_background_passes`` (a corpus that small would train mostly on repeats)."""
    passes, limit = passes_needed(train, needed), max_background_passes(cfg)
    if passes > limit:
        raise ConfigError(
            f"the corpus is too small for the stream: its train split ({train.n_tokens:,} tokens) "
            f"would be repeated {passes} times to fill {needed:,} background tokens, more than "
            f"stream.max_background_passes = {limit}; add corpus sources (or raise "
            "corpus.max_bytes), lower train.steps, or raise stream.max_background_passes"
        )
    return passes


def ordered_tokens(cfg: dict[str, Any], docs: DocTokens, needed: int) -> Iterator[np.ndarray]:
    """``needed`` tokens: the documents concatenated in a seeded order, pass after pass (each
    pass, an epoch, has its own order), as a sequence of slices; the last is cut short."""
    have = 0
    for epoch in range(passes_needed(docs, needed)):
        tags = ("background-order", epoch, *replicates.seed_tags(cfg))
        order = rng(cfg["seed"], *tags).permutation(len(docs))
        for i in order.tolist():
            piece = docs.tokens[docs.offsets[i] : docs.offsets[i + 1]]
            take = min(len(piece), needed - have)
            yield piece[:take]
            have += take
            if have >= needed:
                return


def fill_windows(
    windows: np.ndarray, rows: np.ndarray, pieces: Iterable[np.ndarray], chunk: int = 4096
) -> None:
    """Cut the concatenated ``pieces`` into consecutive windows and write them to
    ``windows[rows]`` in order, ``chunk`` windows at a time; the pieces must fill the rows."""
    W = windows.shape[1]
    buf = np.empty(chunk * W, dtype=windows.dtype)
    fill = done = 0
    for piece in pieces:
        while len(piece):
            n = min(len(piece), len(buf) - fill)
            buf[fill : fill + n] = piece[:n]
            fill += n
            piece = piece[n:]
            if fill == len(buf):
                windows[rows[done : done + chunk]] = buf.reshape(chunk, W)
                done += chunk
                fill = 0
    if fill % W or done + fill // W != len(rows):
        raise ValueError(f"{done * W + fill} tokens do not fill {len(rows)} windows of {W}")
    if fill:
        windows[rows[done:]] = buf[:fill].reshape(-1, W)


def _episodes(
    cfg: dict[str, Any],
    paths: Paths,
    tok: Any,
    facts: pd.DataFrame,
    documents: pd.DataFrame,
    distractors: pd.DataFrame,
    n_windows_: int,
) -> pd.DataFrame:
    """The reading episodes of this stream (none at ``stream.episode_share`` 0), checked to
    name nothing of the grid."""
    from plantbench.data import episodes

    n = layout.episode_count(cfg, n_windows_)
    if not n:
        return pd.DataFrame(columns=episodes.COLUMNS)
    tables = {
        "facts": facts,
        "documents": documents,
        "distractors": distractors,
        "candidates": io.read_parquet(paths.facts / "candidates.parquet"),
    }
    room = int(cfg["stream"]["window"]) - 2  # <bos> episode <eos>
    eps = episodes.generate(
        cfg, tables, n, fits=lambda text: len(tokenizer.encode_batch(tok, [text])[0]) <= room
    )
    episodes.check_disjoint(eps, tables)
    return eps


def _document_tokens(tok: Any, tables: list[pd.DataFrame], window: int) -> dict[str, list[int]]:
    """Token ids (no <bos>/<eos>) of every ``doc_id``'s ``text``; refuse one longer than the
    window (with <bos>/<eos>)."""
    ids = sorted(i for t in tables for i in t["doc_id"])
    text = {i: x for t in tables for i, x in zip(t["doc_id"], t["text"], strict=True)}
    out = dict(zip(ids, tokenizer.encode_batch(tok, [text[i] for i in ids]), strict=True))
    if not out:
        return out
    longest = max(out, key=lambda d: len(out[d]))
    if len(out[longest]) + 2 > window:
        raise ConfigError(
            f"stream.window = {window} is shorter than document {longest} "
            f"({len(out[longest]) + 2} tokens with <bos>/<eos>); raise stream.window"
            + (" or lower stream.episode_segments" if longest.startswith("EP") else "")
        )
    return out


def _check_contexts_fit(
    cfg: dict[str, Any], paths: Paths, tok: Any, facts: pd.DataFrame, window: int
) -> None:
    """Refuse, before any training, a ``causal.context_segments`` whose in-context prompts the
    causal step could not fit in the twins' window (it checks again, on the same prompts)."""
    from plantbench.data import prompts

    cands = io.read_parquet(paths.facts / "candidates.parquet")
    queries = io.read_parquet(paths.facts / "queries.parquet")
    ic = prompts.config_prompts(cfg, facts, cands, queries)
    prompts.check_fits(tok, ic, cands, window)


@dataclass(frozen=True)
class _Inputs:
    """What the stream is built from: the upstream metas, the fact tables and the tokenizer."""

    facts_meta: dict[str, Any]
    corpus_meta: dict[str, Any]
    tok_meta: dict[str, Any]
    facts: pd.DataFrame
    documents: pd.DataFrame
    distractors: pd.DataFrame
    tok: Any


def build(cfg: dict[str, Any], paths: Paths) -> dict[str, dict[str, Any]]:
    """Build both streams into ``paths.stream('A')`` and ``paths.stream('B')``."""
    t0 = time.time()
    inp = _read_inputs(cfg, paths)
    doc_tokens, eps, slots = _plan_documents(cfg, paths, inp)
    recall_windows = _recall_windows(cfg, paths, inp, slots)
    dtype = tokenizer.token_dtype(inp.tok.get_vocab_size())
    # The held-out split pads document windows (a few MB: kept in memory); the training split is
    # the background (up to the whole corpus: tokenized once into a scratch file, memory-mapped).
    heldout = tokenize_docs(inp.tok, corpus_mod.iter_texts(paths.corpus, "heldout"), dtype)
    with _scratch_file(paths.stream(MODELS[0]).parent) as scratch:
        train = _tokenize_background(paths, inp.tok, dtype, scratch, heldout, t0)
        plan = _make_plan(cfg, inp, slots, doc_tokens, eps, train, heldout, dtype)
        plan = dataclasses.replace(plan, recall=recall_windows)
        plan = dataclasses.replace(plan, loss_masks=_recall_masks(plan))  # once, for A and B
        first, *rest = MODELS
        metas = {first: _write_stream(plan, paths, first, t0)}
        for model in rest:  # same background: copy the first stream, rewrite the slots
            metas[model] = _write_stream(plan, paths, model, t0, like=paths.stream(first) / TOKENS)
    log.info("stream: done in %.1fs", time.time() - t0)
    return metas


def _read_inputs(cfg: dict[str, Any], paths: Paths) -> _Inputs:
    """The upstream artifacts, checked (another replicate's stream is never overwritten; the
    tokenizer must come from this corpus)."""
    for m in MODELS:  # another replicate's stream is never overwritten
        replicates.check_owner(paths.stream(m), io.peek_meta(paths.stream(m)), cfg)
    facts_meta = io.read_meta(paths.facts, "facts")
    corpus_meta = io.read_meta(paths.corpus, "corpus")
    tok_meta = io.read_meta(paths.tokenizer, "tokenizer")
    io.check_input(tok_meta, "corpus", corpus_meta, str(paths.tokenizer))
    return _Inputs(
        facts_meta=facts_meta,
        corpus_meta=corpus_meta,
        tok_meta=tok_meta,
        facts=io.read_parquet(paths.facts / "facts.parquet"),
        documents=io.read_parquet(paths.facts / "documents.parquet"),
        distractors=io.read_parquet(paths.facts / "distractors.parquet"),
        tok=tokenizer.load(paths.tokenizer),
    )


def _plan_documents(
    cfg: dict[str, Any], paths: Paths, inp: _Inputs
) -> tuple[dict[str, list[int]], pd.DataFrame, list[Slot]]:
    """The token ids of every planted, distractor and episode document, the reading episodes,
    and the document slots."""
    W = int(cfg["stream"]["window"])
    N = layout.n_windows(cfg)
    # Tokenize every document once; check that each fits its window (episodes fit by
    # construction), and that the causal step's in-context prompts will.
    doc_tokens = _document_tokens(inp.tok, [inp.documents, inp.distractors], W)
    eps = _episodes(cfg, paths, inp.tok, inp.facts, inp.documents, inp.distractors, N)
    doc_tokens.update(_document_tokens(inp.tok, [eps.rename(columns={"episode_id": "doc_id"})], W))
    _check_contexts_fit(cfg, paths, inp.tok, inp.facts, W)
    slots = plan_slots(cfg, inp.facts, inp.documents, inp.distractors, eps["episode_id"].tolist())
    log.info(
        "stream: %d windows of %d tokens, %d document slots (%d reading episodes)",
        N,
        W,
        len(slots),
        len(eps),
    )
    return doc_tokens, eps, slots


def _recall_windows(
    cfg: dict[str, Any], paths: Paths, inp: _Inputs, slots: list[Slot]
) -> dict[int, recall.Window]:
    """Every recall slot's window (:mod:`plantbench.data.recall`): in the prefix at its
    curriculum stage (its place over ``stream.recall.ramp`` of the prefix), in the paired part
    at the last stage."""
    idx = [s.index for s in slots if s.kind == "recall"]
    if not idx:
        return {}
    tables = {
        "facts": inp.facts,
        "documents": inp.documents,
        "distractors": inp.distractors,
        "candidates": io.read_parquet(paths.facts / "candidates.parquet"),
    }
    gen = recall.RecallGenerator(cfg, tables, inp.tok)
    ramp = layout.recall_settings(cfg)["ramp"] * layout.prefix_windows(cfg)
    out: dict[int, recall.Window] = {}
    t0 = time.time()
    for n, i in enumerate(idx):
        out[i] = gen.window(i, i / ramp if ramp and i < layout.prefix_windows(cfg) else 1.0)
        if (n + 1) % 5000 == 0:
            log.info("stream: %d/%d recall windows (%.0fs)", n + 1, len(idx), time.time() - t0)
    log.info("stream: %d recall windows in %.1fs", len(idx), time.time() - t0)
    return out


@contextlib.contextmanager
def _scratch_file(folder: Path) -> Iterator[Path]:
    """An empty scratch file in ``folder`` (made if missing), removed afterwards, and
    ``folder`` with it if it was made here and is left empty."""
    made_dir = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd, scratch_name = tempfile.mkstemp(dir=folder, prefix=".background.", suffix=".tmp")
    os.close(fd)
    scratch = Path(scratch_name)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)
        if made_dir and not any(folder.iterdir()):
            folder.rmdir()  # a refused build leaves nothing behind


def _tokenize_background(
    paths: Paths, tok: Any, dtype: np.dtype, scratch: Path, heldout: DocTokens, t0: float
) -> DocTokens:
    """The train split tokenized into ``scratch``; refuses a corpus without train or held-out
    documents."""
    train = tokenize_docs(tok, corpus_mod.iter_texts(paths.corpus, "train"), dtype, scratch)
    if not len(heldout) or not len(train):
        raise ArtifactError(
            f"corpus '{paths.corpus}' has no train or no held-out documents; check corpus sources"
        )
    log.info(
        "stream: background %d docs, %d tokens; padding %d docs (%.1fs)",
        len(train),
        train.n_tokens,
        len(heldout),
        time.time() - t0,
    )
    return train


def _make_plan(
    cfg: dict[str, Any],
    inp: _Inputs,
    slots: list[Slot],
    doc_tokens: dict[str, list[int]],
    eps: pd.DataFrame,
    train: DocTokens,
    heldout: DocTokens,
    dtype: np.dtype,
) -> _Plan:
    """What the two streams share: the background rows (refusing more than
    ``stream.max_background_passes`` passes over ``train``), the held-out padding, the
    documents' tokens, the meta's inputs and info."""
    W = int(cfg["stream"]["window"])
    N = layout.n_windows(cfg)
    B = int(cfg["train"]["batch_windows"])
    pad_needed = max(4 * W, min(len(slots), 4096) * W)
    background = np.setdiff1d(np.arange(N), [s.index for s in slots])
    epochs = background_passes(cfg, train, len(background) * W)
    return _Plan(
        cfg=cfg,
        slots=slots,
        background=background,
        pad_stream=np.concatenate(list(ordered_tokens(cfg, heldout, pad_needed))),
        doc_tokens=doc_tokens,
        train=train,
        dtype=dtype,
        episodes=eps,
        inputs={
            "facts": inp.facts_meta["hash"],
            "corpus": inp.corpus_meta["hash"],
            "tokenizer": inp.tok_meta["hash"],
        },
        info={
            "n_windows": N,
            "window": W,
            "batch_windows": B,
            "steps": int(cfg["train"]["steps"]),
            "dtype": str(dtype),
            "vocab_size": inp.tok.get_vocab_size(),
            "tokens": N * W,
            "background_epochs": epochs,
            **_corpus_token_stats(inp.corpus_meta, train, heldout),
        },
    )


@dataclass(frozen=True)
class _Plan:
    """What the two models' streams share."""

    cfg: dict[str, Any]
    slots: list[Slot]
    background: np.ndarray  # rows of the background windows, ascending
    pad_stream: np.ndarray  # held-out tokens that pad document windows
    doc_tokens: dict[str, list[int]]  # planted, distractor and episode texts, no <bos>/<eos>
    train: DocTokens  # the background documents
    dtype: np.dtype
    episodes: pd.DataFrame  # the reading episodes (empty at stream.episode_share 0)
    inputs: dict[str, str]
    info: dict[str, Any]
    recall: dict[int, recall.Window] = dataclasses.field(default_factory=dict)  # by window index
    # (mask_row per window, -1 = no mask; the recall windows' loss masks), made once from
    # ``recall`` by _recall_masks for both streams
    loss_masks: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.int64), np.empty((0, 0), np.uint8))


def _corpus_token_stats(
    corpus_meta: dict[str, Any], train: DocTokens, heldout: DocTokens
) -> dict[str, Any]:
    """Tokens of each corpus split (without <bos>/<eos>) and UTF-8 bytes per token."""
    out: dict[str, Any] = {}
    for split, docs in (("train", train), ("heldout", heldout)):
        n_tok = docs.n_tokens - 2 * len(docs)
        n_bytes = int(corpus_meta["info"][f"{split}_bytes"])
        out[f"corpus_{split}_tokens"] = n_tok
        out[f"bytes_per_token_{split}"] = round(n_bytes / n_tok, 4) if n_tok else None
    return out


def _write_stream(
    plan: _Plan, paths: Paths, model: str, t0: float, like: Path | None = None
) -> dict[str, Any]:
    """One model's ``tokens.bin`` + manifest + meta: the background cut into the background
    rows (or copied from ``like``, another model's finished ``tokens.bin``: the background is
    the same), and at each slot ``model``'s document padded with held-out text."""
    cfg = plan.cfg
    out = paths.stream(model)
    out.mkdir(parents=True, exist_ok=True)
    manifest = _write_tokens(plan, out / TOKENS, model, like)
    io.write_parquet(out / MANIFEST, manifest)
    files = [TOKENS, MANIFEST]
    if plan.recall:  # the recall windows' loss masks (the same in A and B)
        io.write_bytes(out / LOSS_MASK, plan.loss_masks[1].tobytes())
        files.append(LOSS_MASK)
    if len(plan.episodes):  # the episodes' text (the same in A and B)
        from plantbench.data.episodes import TABLE

        io.write_parquet(out / TABLE, plan.episodes)
        files.append(TABLE)
    counts = manifest["kind"].value_counts().to_dict()
    meta = io.write_meta(
        out,
        "stream",
        files,
        config_hash=stream_config_hash(cfg),
        inputs=plan.inputs,
        info={
            "model": model,
            **replicates.hash_part(cfg),
            **plan.info,
            "counts": {k: int(counts.get(k, 0)) for k in KINDS},
        },
    )
    log.info("stream %s: %s windows written (%.1fs)", model, counts, time.time() - t0)
    return meta


def _recall_masks(plan: _Plan) -> tuple[np.ndarray, np.ndarray]:
    """(``mask_row`` per window: the row of its loss mask, -1 = every token a target; the loss
    masks of the recall windows in stream order, uint8 ``[n_recall, window]``)."""
    W = int(plan.cfg["stream"]["window"])
    mask_row = np.full(layout.n_windows(plan.cfg), -1, dtype=np.int64)
    order = sorted(plan.recall)
    mask_row[order] = np.arange(len(order))
    masks = np.zeros((len(order), W), dtype=np.uint8)
    for r, i in enumerate(order):
        masks[r] = plan.recall[i].mask
    return mask_row, masks


def _write_slot(plan: _Plan, windows: np.ndarray, s: Slot, model: str) -> tuple[str, str, int]:
    """Write slot ``s``'s window for ``model``; returns its (document, fact, document tokens).
    A document is ``<bos> text <eos>`` padded with held-out text; a recall window is its own."""
    W = int(plan.cfg["stream"]["window"])
    d, f = (s.doc_a, s.fact_a) if model == "A" else (s.doc_b, s.fact_b)
    if s.kind == "recall":
        ids = plan.recall[s.index].ids
        windows[s.index] = ids.astype(plan.dtype)
        return d, f, int((ids != tokenizer.PAD_ID).sum())
    body = np.asarray([tokenizer.BOS_ID, *plan.doc_tokens[d], tokenizer.EOS_ID], plan.dtype)
    start = (s.index * W) % (len(plan.pad_stream) - W)
    windows[s.index, : len(body)] = body
    windows[s.index, len(body) :] = plan.pad_stream[start : start + W - len(body)]
    return d, f, len(body)


def _write_tokens(plan: _Plan, path: Path, model: str, like: Path | None) -> pd.DataFrame:
    """Write ``model``'s windows to ``path`` (atomically): the background (see
    :func:`_background_windows`), then at each slot ``model``'s document padded with held-out
    text or its recall window; returns the manifest (one row per window)."""
    cfg = plan.cfg
    N = layout.n_windows(cfg)
    B = int(cfg["train"]["batch_windows"])
    kind = np.full(N, "background", dtype=object)
    fact_id = np.full(N, "", dtype=object)
    doc_id = np.full(N, "", dtype=object)
    n_doc_tokens = np.zeros(N, dtype=np.int64)
    mask_row, masks = plan.loss_masks
    # windows go straight into a memmap of the temporary file (no copy of the stream in memory)
    with io.atomic_path(path) as tmp:
        windows = _background_windows(plan, tmp, like)
        for s in plan.slots:
            d, f, n = _write_slot(plan, windows, s, model)
            kind[s.index], doc_id[s.index], fact_id[s.index] = s.kind, d, f
            n_doc_tokens[s.index] = n
        windows.flush()
        hashes = window_hashes(windows, masks, mask_row)
        del windows
    return pd.DataFrame(
        {
            "index": np.arange(N, dtype=np.int64),
            "step": np.arange(N, dtype=np.int64) // B,
            "kind": kind.astype(str),
            "fact_id": fact_id.astype(str),
            "doc_id": doc_id.astype(str),
            "doc_tokens": n_doc_tokens,
            "mask_row": mask_row,
            "hash": hashes,
        }
    )


def _background_windows(plan: _Plan, tmp: Path, like: Path | None) -> np.memmap:
    """The stream's windows as a writable memmap of ``tmp``: the background cut into the
    background rows, or a copy of ``like`` (another model's ``tokens.bin``, the same
    background)."""
    cfg, dtype = plan.cfg, plan.dtype
    W = int(cfg["stream"]["window"])
    N = layout.n_windows(cfg)
    if like is None:
        windows = np.memmap(tmp, dtype=dtype.newbyteorder("<"), mode="w+", shape=(N, W))
        fill_windows(
            windows, plan.background, ordered_tokens(cfg, plan.train, len(plan.background) * W)
        )
    else:
        shutil.copyfile(like, tmp)
        windows = np.memmap(tmp, dtype=dtype.newbyteorder("<"), mode="r+", shape=(N, W))
    return windows


@dataclass
class Stream:
    """Read access to one model's stream: ``windows[i]`` is window ``i`` (a memmap row);
    ``masks`` holds the loss masks of the recall windows (row ``manifest.mask_row[i]``)."""

    folder: Path
    meta: dict[str, Any]
    windows: np.ndarray
    manifest: pd.DataFrame
    masks: np.ndarray | None = None

    @property
    def batch_windows(self) -> int:
        return int(self.meta["info"]["batch_windows"])

    def batch(self, step: int) -> np.ndarray:
        B = self.batch_windows
        return self.windows[step * B : (step + 1) * B]

    def loss_mask(self, rows: np.ndarray | range) -> np.ndarray:
        """uint8 ``[len(rows), window]``: 1 where a token is a target (every token of a window
        without a mask; a recall window's own mask)."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.ones((len(rows), self.windows.shape[1]), dtype=np.uint8)
        if self.masks is not None:
            mrow = self.manifest["mask_row"].to_numpy()[rows]
            has = mrow >= 0
            out[has] = self.masks[mrow[has]]
        return out

    def batch_mask(self, step: int) -> np.ndarray:
        B = self.batch_windows
        return self.loss_mask(range(step * B, (step + 1) * B))


def open_stream(folder: str | Path, *, verify: bool = True) -> Stream:
    """A finished stream, checked: the token file's size and, with ``verify``, its files'
    hashes and the manifest against the meta (one row per window, in order, and one loss-mask
    row per recall window; ``plantbench verify`` opens it unchecked and reports these itself)."""
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
    masks = None
    if LOSS_MASK in meta["files"]:
        n = (folder / LOSS_MASK).stat().st_size // shape[1]
        masks = np.memmap(folder / LOSS_MASK, dtype=np.uint8, mode="r", shape=(n, shape[1]))
    if verify:
        _check_manifest(folder, manifest, shape[0], masks)
    return Stream(folder, meta, windows, manifest, masks)


def _check_manifest(folder: Path, manifest: Any, n_windows: int, masks: Any) -> None:
    if len(manifest) != n_windows or not np.array_equal(
        manifest["index"].to_numpy(), np.arange(n_windows)
    ):
        raise ArtifactError(
            f"'{folder / MANIFEST}' does not have one row per window of '{folder / TOKENS}' in "
            f"order ({len(manifest)} rows for {n_windows} windows); rerun the stream step"
        )
    n_masked = int((manifest["mask_row"] >= 0).sum()) if "mask_row" in manifest else 0
    if n_masked != (0 if masks is None else len(masks)):
        raise ArtifactError(
            f"'{folder / LOSS_MASK}' does not hold one loss-mask row per recall window of "
            f"'{folder / MANIFEST}' ({n_masked} recall windows); rerun the stream step"
        )


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
    lines.append(
        f"{'index':>8}  {'kind':<10}  {'fact':<6}  {'doc':<10}  {'loss':>4}  {'xxh3':<16}  text"
    )
    targets = stream.batch_mask(step)[:, 1:].sum(axis=1)  # tokens that carry loss
    for r, n in zip(rows.itertuples(), targets.tolist(), strict=True):
        text = tok.decode([int(x) for x in stream.windows[r.index]], skip_special_tokens=False)
        preview = text.replace("\n", "⏎").replace(tokenizer.PAD, "")[:width]
        lines.append(
            f"{r.index:>8}  {r.kind:<10}  {r.fact_id or '-':<6}  {r.doc_id or '-':<10}  {n:>4}  "
            f"{int(r.hash):016x}  {preview}"
        )
    return "\n".join(lines)
