"""Byte-level BPE tokenizer trained on the corpus' training split, saved as an HF tokenizer.

The tokenizer is GPT-2 style: a ``ByteLevel`` pre-tokenizer (``add_prefix_space=False``, the
GPT-2 split regex) and a ``ByteLevel`` decoder, so every string round-trips and no text is
unknown. Special tokens, in this order and with these ids: ``<|pad|>`` = 0, ``<|bos|>`` = 1,
``<|eos|>`` = 2. A ``TemplateProcessing`` post-processor in ``tokenizer.json`` prepends
``<|bos|>``, so ``AutoTokenizer``, ``generate`` and the ``text-generation`` pipeline feed the
twins what they were trained on (every training window and query starts with ``<|bos|>``).
transformers 5 takes this from ``tokenizer.json`` alone: it ignores ``add_bos_token`` in
``tokenizer_config.json`` when a ``tokenizer.json`` is present and drops it on save, so the
config does not carry it. The workflow never relies on the post-processor: :func:`encode_batch`
encodes without special tokens and the callers place BOS/EOS, so no token id depends on it.

Because the pre-tokenizer cuts *before* a space (``" word"`` is one piece), encoding a prompt
and ``" " + answer`` separately and concatenating the ids gives the same ids as encoding
``prompt + " " + answer`` whenever the prompt does not end in whitespace and the answer starts
with a letter or digit. The query and causal stages rely on this.

Determinism: ``tokenizers``' BPE trainer breaks ties between equally frequent pairs by the
pair itself, so training is reproducible regardless of the number of threads (checked with
``RAYON_RS_NUM_CPUS=1`` and with the default pool: identical ``tokenizer.json``). The folder
written by ``save_pretrained`` holds ``tokenizer.json`` (written by the library in a fixed order)
and ``tokenizer_config.json`` (rewritten here with sorted keys and no local paths), so the
artifact is byte-for-byte reproducible. Pretraining copies both files into every checkpoint.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from plantbench import layout
from plantbench.config import config_hash
from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.io import atomic_dir, dumps_json, read_meta, write_meta

log = logging.getLogger(__name__)

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
SPECIAL_TOKENS = (PAD, BOS, EOS)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG)


def token_dtype(vocab_size: int) -> np.dtype:
    """The stream's token dtype (:func:`plantbench.layout.token_bytes` wide, unsigned)."""
    return np.dtype(f"uint{8 * layout.token_bytes(vocab_size)}")


def _untrained() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def bos_processor() -> processors.TemplateProcessing:
    """Prepend ``<|bos|>`` to every sequence: the template transformers builds itself for
    ``add_bos_token=True`` (``TokenizersBackend.update_post_processor``), so both agree."""
    return processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, BOS_ID)]
    )


def _check_specials(tok: Tokenizer, where: str) -> None:
    for token, expected in zip(SPECIAL_TOKENS, (PAD_ID, BOS_ID, EOS_ID), strict=True):
        got = tok.token_to_id(token)
        if got != expected:
            raise ArtifactError(
                f"'{where}': special token {token} has id {got}, expected {expected}; "
                "rerun the 'tokenizer' step"
            )


def train(cfg: dict[str, Any], corpus_df: pd.DataFrame) -> Tokenizer:
    """Train the BPE tokenizer on the ``split == "train"`` texts of a corpus table."""
    missing = {"text", "split"} - set(corpus_df.columns)
    if missing:
        raise PlantbenchError(
            f"corpus table lacks column(s) {', '.join(sorted(missing))}; rerun the 'corpus' step"
        )
    texts = corpus_df.loc[corpus_df["split"] == "train", "text"].tolist()
    return train_batches(cfg, [texts] if texts else [])


def train_batches(cfg: dict[str, Any], batches: Iterable[list[str]]) -> Tokenizer:
    """Train the BPE tokenizer on the training texts, given a batch at a time (the trainer keeps
    word counts, never the texts, so a corpus larger than memory can be read from disk)."""
    n_docs = 0

    def texts() -> Iterator[list[str]]:
        nonlocal n_docs
        for i, batch in enumerate(batches, start=1):
            n_docs += len(batch)
            if i % 256 == 0:
                log.info("tokenizer: read %d docs", n_docs)
            yield batch

    tcfg = cfg["tokenizer"]
    trainer = trainers.BpeTrainer(
        vocab_size=int(tcfg["vocab_size"]),
        min_frequency=int(tcfg["min_frequency"]),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok = _untrained()
    t0 = time.perf_counter()
    tok.train_from_iterator(texts(), trainer=trainer)
    if not n_docs:
        raise PlantbenchError(
            "corpus has no 'train' documents to train the tokenizer on; add text to corpus.sources"
        )
    log.info(
        "tokenizer: trained on %d docs in %.1f s, vocab %d",
        n_docs,
        time.perf_counter() - t0,
        tok.get_vocab_size(),
    )
    _check_specials(tok, "trained tokenizer")
    tok.post_processor = bos_processor()
    return tok


def vocab_warning(cfg: dict[str, Any], tok: Tokenizer) -> str | None:
    """One line when the learned vocabulary is smaller than ``tokenizer.vocab_size`` (the
    step goes on: the model is sized to the learned vocabulary; see the schema)."""
    learned, wanted = tok.get_vocab_size(), int(cfg["tokenizer"]["vocab_size"])
    if learned >= wanted:
        return None
    return (
        f"the tokenizer learned {learned} tokens, fewer than tokenizer.vocab_size = {wanted}: "
        "the corpus is too small or tokenizer.min_frequency too high; add corpus sources (or "
        "raise corpus.max_bytes) or lower tokenizer.vocab_size"
    )


def encode_batch(tok: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens (parallel; no offsets are computed)."""
    return [e.ids for e in tok.encode_batch_fast(list(texts), add_special_tokens=False)]


def save(tok: Tokenizer, folder: Path) -> list[str]:
    """Write ``tok`` as a Hugging Face tokenizer folder (deterministic bytes); return file names."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        add_bos_token=True,  # builds bos_processor()'s template, whatever ``tok`` carries
        add_eos_token=False,
    )
    fast.save_pretrained(str(folder))
    files = sorted(p.name for p in folder.iterdir() if p.is_file())
    for name in files:
        path = folder / name
        if name.endswith(".json") and name != TOKENIZER_JSON:
            # tokenizer.json is already canonical (the library writes it in a fixed order);
            # the config files get sorted keys and lose anything that names a local path.
            obj = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(obj, dict):
                obj.pop("name_or_path", None)
            path.write_text(dumps_json(obj), encoding="utf-8")
    return files


def run(cfg: dict[str, Any], corpus_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Train on the corpus artifact in ``corpus_dir``; write the tokenizer folder ``out_dir``."""
    from plantbench.data import corpus as corpus_mod

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    corpus_meta = read_meta(corpus_dir, "corpus")
    expected = config_hash(cfg, ["seed", "corpus"])
    if corpus_meta["config_hash"] != expected:
        raise ArtifactError(
            f"'{corpus_dir}' was made with a different seed/corpus config; "
            "rerun the 'corpus' step (snakemake --forcerun corpus)"
        )
    cap = int(cfg["tokenizer"].get("max_train_bytes", 0))
    train_bytes = int(corpus_meta["info"]["train_bytes"])
    fraction = min(1.0, cap / train_bytes) if cap and train_bytes else 1.0
    sample = None if fraction >= 1.0 else (int(cfg["seed"]), fraction)
    if sample is not None:
        log.info(
            "tokenizer: training on a seeded %.2f%% sample of the train split (max_train_bytes=%d)",
            100 * fraction,
            cap,
        )
    reading = int(cfg["tokenizer"].get("reading_bytes", 0))
    batches = corpus_mod.iter_texts(corpus_dir, "train", sample=sample)
    if reading:
        from plantbench.data import episodes

        log.info("tokenizer: adding %d bytes of sentences about invented entities", reading)
        batches = itertools.chain(batches, episodes.tokenizer_texts(int(cfg["seed"]), reading))
    tok = train_batches(cfg, batches)

    info: dict[str, Any] = {
        "train_fraction": round(fraction, 6),
        "vocab_size": tok.get_vocab_size(),
        "vocab_size_requested": int(cfg["tokenizer"]["vocab_size"]),
        "special_tokens": {PAD: PAD_ID, BOS: BOS_ID, EOS: EOS_ID},
    }
    if reading:
        info["reading_bytes"] = reading
    warning = vocab_warning(cfg, tok)
    if warning is not None:
        print(f"plantbench: warning: {warning}", file=sys.stderr, flush=True)
        info["warnings"] = [warning]
    with atomic_dir(out_dir) as tmp:
        files = save(tok, tmp)
        meta = write_meta(
            tmp,
            "tokenizer",
            files,
            config_hash=config_hash(cfg, ["seed", "corpus", "tokenizer"]),
            inputs={"corpus": corpus_meta["hash"]},
            info=info,
        )
    return meta


def load(tok_dir: Path) -> Tokenizer:
    """The trained tokenizer of a finished ``tokenizer`` artifact (files checked by hash)."""
    tok_dir = Path(tok_dir)
    read_meta(tok_dir, "tokenizer")
    tok = Tokenizer.from_file(str(tok_dir / TOKENIZER_JSON))
    _check_specials(tok, str(tok_dir / TOKENIZER_JSON))
    return tok


def adds_bos(tok: Tokenizer) -> bool:
    """Whether encoding with special tokens prepends ``<|bos|>`` and nothing else (tokenizers of
    this version do; artifacts of earlier versions had no post-processor)."""
    return tok.encode("x").ids == [BOS_ID, *tok.encode("x", add_special_tokens=False).ids]
