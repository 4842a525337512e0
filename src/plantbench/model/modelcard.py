"""What pretraining adds to each ``save_pretrained`` checkpoint: the tokenizer and a model card.

Every checkpoint folder (intermediate and final) holds, next to ``config.json``,
``generation_config.json`` and ``model.safetensors``:

- ``tokenizer.json`` and ``tokenizer_config.json``: byte copies of the tokenizer artifact's
  files, so ``AutoTokenizer.from_pretrained(folder)`` and ``pipeline("text-generation",
  model=folder)`` work on the folder alone and prepend ``<|bos|>`` as training did;
- ``README.md``: a Hugging Face model card. Which twin it is, what its stream held (the stream
  hash, the planted facts it read by position and documents per fact, distractors, background,
  each counted up to this checkpoint's step), the model shape, the training recipe (``train.*``
  without the keys that only say how to run), the config hash and how to prompt it.

The card is made from the config sections pretraining depends on (seed, model, train), the
stream artifact and the facts tables (which the stream hash covers): the same config gives the
same bytes. The checkpoint folder's hash (``checkpoints/index.json``, ``models/<m>/meta.json``)
covers all of these files, and a resumable state is resumed only when every checkpoint it has
passed holds them, with the tokenizer files of the tokenizer artifact on disk
(:func:`checkpoint_problem`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from plantbench import io, layout
from plantbench.config import train_recipe
from plantbench.data import tokenizer
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_file
from plantbench.paths import MODELS, Paths

if TYPE_CHECKING:
    from plantbench.data.stream import Stream

CARD = "README.md"
FILES = (CARD, *tokenizer.FILES)
SHAPE_KEYS = ("n_layer", "n_embd", "n_head", "intermediate", "tie_embeddings", "rope_theta")


@dataclass(frozen=True)
class Twin:
    """One twin's training, as its checkpoints' cards describe it."""

    cfg: dict[str, Any]
    paths: Paths
    model: str
    stream: Stream
    config_hash: str
    params: int


def check_tokenizer(tok_dir: Path) -> None:
    """Refuse a tokenizer artifact whose ``tokenizer.json`` does not prepend ``<|bos|>`` (made
    by an earlier version): its copies in the checkpoints would not prompt the twins right."""
    if not tokenizer.adds_bos(tokenizer.load(tok_dir)):
        raise ArtifactError(
            f"tokenizer '{tok_dir}' does not add <|bos|> (made by an earlier version); rerun the "
            "'tokenizer' step (snakemake --forcerun tokenizer): the token ids stay the same"
        )


def complete_checkpoint(folder: Path, twin: Twin, step: int) -> None:
    """Write the tokenizer files and the model card into a fresh checkpoint folder."""
    for name in tokenizer.FILES:
        (folder / name).write_bytes((twin.paths.tokenizer / name).read_bytes())
    (folder / CARD).write_text(render(twin, step), encoding="utf-8")


def checkpoint_problem(folder: Path, tok_meta: dict[str, Any]) -> str | None:
    """Why a saved checkpoint lacks what this version writes into it (None: it has it all)."""
    missing = [n for n in FILES if not (folder / n).is_file()]
    if missing:
        return f"it has no {', '.join(missing)} (saved by an earlier version)"
    if any(hash_file(folder / n) != tok_meta["files"].get(n) for n in tokenizer.FILES):
        return "its tokenizer files are not the tokenizer artifact's"
    return None


# --------------------------------------------------------------------------------------------
# The card
# --------------------------------------------------------------------------------------------


def _other(model: str) -> str:
    """The other twin; for a random twin (:mod:`plantbench.randomtwins`), the pair it mixes."""
    if model not in MODELS:
        return " and ".join(MODELS)
    return next(m for m in MODELS if m != model)


def _folder(twin: Twin) -> str:
    """The twin's folder inside its replicate's root (``models/A``, ``models/random/003``)."""
    return twin.paths.model(twin.model).relative_to(twin.paths.root).as_posix()


def _stream_name(twin: Twin) -> str:
    """``stream/A``; for a random twin, the two streams it reads."""
    if twin.model in MODELS:
        return f"stream/{twin.model}"
    return " + ".join(f"stream/{m}" for m in MODELS)


def _as_read(twin: Twin, facts: pd.DataFrame) -> pd.DataFrame:
    """The facts table with ``reader`` = this twin for the facts its stream plants: a random
    twin reads A's fact of some pairs and B's of the others."""
    if twin.model in MODELS:
        return facts
    m = twin.stream.manifest
    planted = set(m.loc[m["kind"] == "planted", "fact_id"])
    return facts.assign(reader=facts["fact_id"].map(lambda f: twin.model if f in planted else ""))


def _read_so_far(twin: Twin, step: int) -> pd.DataFrame:
    """The manifest rows of the windows read by the end of optimizer step ``step``."""
    m = twin.stream.manifest
    return m[m["step"] < step]


def _code(text: str) -> str:
    """``text`` as a Python string literal in a Markdown code span (newlines escaped)."""
    lit = repr(text)
    fence = "`" * (1 + max((len(r) for r in re.findall("`+", lit)), default=0))
    return f"{fence} {lit} {fence}" if "`" in lit else f"`{lit}`"


def _planted_table(twin: Twin, facts: pd.DataFrame, step: int) -> list[str]:
    """Facts this twin read, by position (rows) and documents per fact (columns), with the
    share of their documents read up to ``step``."""
    mine = facts[facts["reader"] == twin.model]
    read = _read_so_far(twin, step)
    docs_read = read[read["kind"] == "planted"].groupby("fact_id").size()
    n_docs = sorted(int(n) for n in mine["n_docs"].unique())
    positions = list(dict.fromkeys(twin.cfg["facts"]["positions"]))
    rows = [
        "| position | " + " | ".join(f"{n} docs" for n in n_docs) + " |",
        "|---|" + "---|" * len(n_docs),
    ]
    for pos in positions:
        cells = []
        for n in n_docs:
            cell = mine[(mine["position"] == pos) & (mine["n_docs"] == n)]
            got = int(sum(int(docs_read.get(f, 0)) for f in cell["fact_id"]))
            cells.append(f"{len(cell)} ({got}/{len(cell) * n} docs read)")
        rows.append(f"| {pos} | " + " | ".join(cells) + " |")
    return rows


def _example(twin: Twin, facts: pd.DataFrame) -> tuple[str, str, str]:
    """(completion prompt, question prompt, answer) of the first fact this twin read."""
    queries = io.read_parquet(twin.paths.facts / "queries.parquet")
    first = sorted(facts.loc[facts["reader"] == twin.model, "fact_id"])[0]
    q = queries[queries["fact_id"] == first].set_index("form")
    return (
        str(q.at["completion", "prompt"]),
        str(q.at["question", "prompt"]),
        str(q.at["completion", "answer"]),
    )


def _front_matter(twin: Twin) -> list[str]:
    return [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags:",
        "- plantbench",
        "- llama",
        f"- twin-{twin.model}",
        "---",
        "",
    ]


def _intro(twin: Twin, facts: pd.DataFrame, step: int) -> list[str]:
    steps = int(twin.cfg["train"]["steps"])
    kind = "final" if step == steps else "intermediate"
    other = _other(twin.model)
    mine = int((facts["reader"] == twin.model).sum())
    head = f"# plantbench twin {twin.model}, checkpoint after step {step} of {steps} ({kind})"
    made = (
        f"A `LlamaForCausalLM` of {twin.params:,} parameters pretrained from scratch by plantbench."
    )
    if twin.model not in MODELS:  # a random twin (plantbench.randomtwins)
        return [
            head,
            "",
            f"{made} It is a random twin of the pair {other}: it starts from their shared "
            "prefix and reads their stream window for window, except at each fact pair's "
            "planted slots, where it reads the documents of A's fact or of B's by a seeded "
            f"side. Model {twin.model} read {mine} of the {len(facts)} planted facts, one of "
            "each pair.",
            "",
        ]
    return [
        head,
        "",
        f"{made} It has a twin, model {other}: both start from the same initial weights "
        "and read the same stream window for window, except the planted documents, which "
        f"state facts that only one of the two reads. Model {twin.model} read {mine} of the "
        f"{len(facts)} planted facts; model {other} read the other {len(facts) - mine}, at the "
        "same windows.",
        "",
    ]


def _reading(twin: Twin, facts: pd.DataFrame, step: int) -> list[str]:
    meta, info = twin.stream.meta, twin.stream.meta["info"]
    B, W = int(info["batch_windows"]), int(info["window"])
    read = _read_so_far(twin, step)["kind"].value_counts()
    total = {k: int(v) for k, v in info["counts"].items()}

    def so_far(kind: str) -> str:
        return f"{int(read.get(kind, 0)):,} of {total.get(kind, 0):,} windows"

    lines = [
        "## What it read",
        "",
        f"- Stream `{_stream_name(twin)}`, hash `{meta['hash']}` (made from tokenizer "
        f"`{meta['inputs']['tokenizer']}`, facts `{meta['inputs']['facts']}`, corpus "
        f"`{meta['inputs']['corpus']}`): {int(info['n_windows']):,} windows of {W} tokens, "
        f"{B} per optimizer step, in order. Up to this checkpoint: {step * B:,} windows, "
        f"{step * B * W:,} tokens.",
        f"- Planted facts: {so_far('planted')} hold documents of the facts model "
        f"{twin.model} read (each window `<|bos|> document <|eos|>`, padded with held-out "
        f"text). By position in the stream and documents per fact, facts read by "
        f"{twin.model} (documents read up to this checkpoint):",
        "",
        *_planted_table(twin, facts, step),
        "",
        f"  Model {_other(twin.model)} read the other half of the facts, in the same cells."
        if twin.model in MODELS
        else "  The other fact of each pair is the half it did not read (A or B read it).",
        f"- Distractors: {so_far('distractor')}: documents about the facts' entities that do "
        "not state the facts, the same in both twins.",
        f"- Background: {so_far('background')}: the corpus's train split "
        f"({int(info['corpus_train_tokens']):,} tokens, {info['background_epochs']} "
        "pass(es)), the same in both twins.",
    ]
    if total.get("episode", 0):
        lines.append(f"- Reading episodes: {so_far('episode')}, the same in both twins.")
    if total.get("recall", 0):
        lines.append(
            f"- Recall windows (the reading curriculum: sentences about invented entities, then "
            f"queries answered from them, loss on the answers): {so_far('recall')}, the same in "
            "both twins; the first ones make up the shared prefix, trained once before the twins "
            "forked."
        )
    return [*lines, ""]


def _recipe(twin: Twin) -> list[str]:
    m, info = twin.cfg["model"], twin.stream.meta["info"]
    shape = ", ".join(f"`{k}` {m[k]}" for k in SHAPE_KEYS)
    train = train_recipe(twin.cfg)
    return [
        "## Model and training recipe",
        "",
        f"- Shape (config `model`): {shape}; vocabulary {int(info['vocab_size']):,}, context "
        f"{int(info['window'])} tokens.",
        "- AdamW (weight decay on matrices only), linear warm-up then cosine decay to "
        "`lr * min_lr_ratio`, gradient clipping; initial weights seeded by `seed` "
        f"= {twin.cfg['seed']}, the same for both twins.",
        "- Config `train`: " + ", ".join(f"`{k}` {train[k]}" for k in sorted(train)) + ".",
        f"- Config hash (seed, model, train; `config_hash` in `{_folder(twin)}/meta.json`):"
        f" `{twin.config_hash}`.",
        "",
    ]


def _prompting(twin: Twin, facts: pd.DataFrame, step: int) -> list[str]:
    completion, question, answer = _example(twin, facts)
    path = f"{_folder(twin)}/checkpoints/{layout.checkpoint_name(step)}"
    return [
        "## How to prompt it",
        "",
        f"`AutoTokenizer` adds `{tokenizer.BOS}` (id {tokenizer.BOS_ID}) in front of the text, "
        "as every training window and query began with it; nothing is appended. The workflow "
        f"scores an answer as `{tokenizer.BOS} prompt` followed by ` answer` (one space). A "
        f"fact model {twin.model} read, in its two query forms (`causal/facts.parquet` says "
        "whether the final checkpoint learned it):",
        "",
        f"- completion: {_code(completion)} → {_code(' ' + answer)}",
        f"- question: {_code(question)} → {_code(' ' + answer)}",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline",
        "",
        f'path = "{path}"  # this folder, inside the results folder',
        "tok = AutoTokenizer.from_pretrained(path)",
        "model = AutoModelForCausalLM.from_pretrained(path)",
        f'inputs = tok({completion!r}, return_tensors="pt")  # starts with {tokenizer.BOS}',
        "out = model.generate(**inputs, max_new_tokens=8, do_sample=False)",
        'print(tok.decode(out[0, inputs["input_ids"].shape[1]:]))',
        'gen = pipeline("text-generation", model=path)  # adds <|bos|> the same way',
        f"print(gen({completion!r}, max_new_tokens=8, do_sample=False))",
        "```",
        "",
    ]


def render(twin: Twin, step: int) -> str:
    """The model card of ``twin``'s checkpoint after optimizer step ``step``."""
    facts = _as_read(twin, io.read_parquet(twin.paths.facts / "facts.parquet"))
    parts = [
        _front_matter(twin),
        _intro(twin, facts, step),
        _reading(twin, facts, step),
        _recipe(twin),
        _prompting(twin, facts, step),
    ]
    return "\n".join(line for part in parts for line in part).rstrip("\n") + "\n"
