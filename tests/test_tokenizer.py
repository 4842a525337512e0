"""Tokenizer: determinism, special ids, HF round trip, and the prompt/answer split property."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from plantbench.data import corpus, tokenizer
from plantbench.errors import ArtifactError, PlantbenchError

VOCAB = 500
SYLLABLES = ["ka", "lo", "mir", "ta", "ven", "du", "sel", "or", "pi", "quan", "rhu", "zen"]
ENGLISH = (
    "The river town was founded long ago by traders who crossed the northern hills. "
    "Its people kept records of every harvest, every flood and every new bridge. "
    "def parse(value):\n    return int(value) + 1\n"
)


def _docs(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        made_up = " ".join(
            "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(30)
        )
        out.append(f"{ENGLISH}{made_up.capitalize()}.")
    return out


def _cfg(jsonl: Path, **tok) -> dict:
    return {
        "seed": 3,
        "corpus": {
            "sources": [{"kind": "jsonl", "path": str(jsonl)}],
            "min_doc_chars": 50,
            "max_doc_chars": 2000,
            "max_bytes": 0,
            "heldout_fraction": 0.2,
        },
        "tokenizer": {"vocab_size": VOCAB, "min_frequency": 2, **tok},
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, Path]:
    root = tmp_path_factory.mktemp("tok")
    src = root / "bg.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(1, 300)))
    cfg = _cfg(src)
    corpus.run(cfg, root / "corpus")
    tokenizer.run(cfg, root / "corpus", root / "tokenizer")
    return cfg, root / "corpus", root / "tokenizer"


def test_training_twice_gives_identical_files(built, tmp_path: Path) -> None:
    cfg, corpus_dir, tok_dir = built
    m2 = tokenizer.run(cfg, corpus_dir, tmp_path / "again")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tok_dir / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    meta = json.loads((tok_dir / "meta.json").read_text())
    assert m2["hash"] == meta["hash"]
    assert meta["inputs"]["corpus"] == json.loads((corpus_dir / "meta.json").read_text())["hash"]
    assert sorted(meta["files"]) == ["tokenizer.json", "tokenizer_config.json"]
    assert str(tmp_path) not in (tmp_path / "again" / "tokenizer_config.json").read_text()


def test_special_tokens_and_vocab(built) -> None:
    _, _, tok_dir = built
    tok = tokenizer.load(tok_dir)
    assert tok.get_vocab_size() == VOCAB
    assert [tok.token_to_id(t) for t in ("<|pad|>", "<|bos|>", "<|eos|>")] == [0, 1, 2]
    assert (tokenizer.PAD_ID, tokenizer.BOS_ID, tokenizer.EOS_ID) == (0, 1, 2)
    # encode_batch adds nothing; the post-processor (HF-facing) prepends <|bos|> only; the
    # special strings are single tokens.
    plain = tok.encode("river", add_special_tokens=False).ids
    assert tokenizer.encode_batch(tok, ["river"]) == [plain]
    assert tok.encode("river").ids == [1, *plain]
    assert 1 not in tokenizer.encode_batch(tok, ["The river"])[0]
    assert tokenizer.encode_batch(tok, ["<|bos|>x<|eos|>"])[0][0::2] == [1, 2]
    info = json.loads((tok_dir / "meta.json").read_text())["info"]
    assert info["vocab_size"] == VOCAB and info["vocab_size_requested"] == VOCAB


def test_trains_on_the_train_split_only() -> None:
    rare = "Xylophrqz"
    train = [f"{ENGLISH} common words and more common words {i}" for i in range(50)]
    held = [f"{rare} {rare} {rare} {rare} {i}" for i in range(50)]
    df = pd.DataFrame({"text": train + held, "split": ["train"] * 50 + ["heldout"] * 50})
    tok = tokenizer.train({"tokenizer": {"vocab_size": 400, "min_frequency": 2}}, df)
    vocab = tok.get_vocab()
    assert "Ġcommon" in vocab
    assert not any("phrq" in t or "Xylo" in t for t in vocab)


def test_train_refuses_a_corpus_without_train_documents() -> None:
    df = pd.DataFrame({"text": ["a b c"], "split": ["heldout"]})
    with pytest.raises(PlantbenchError, match="no 'train' documents"):
        tokenizer.train({"tokenizer": {"vocab_size": 400, "min_frequency": 2}}, df)


def test_autotokenizer_round_trip(built) -> None:
    from transformers import AutoTokenizer

    _, _, tok_dir = built
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    tok = tokenizer.load(tok_dir)
    text = "The river town of Quanmirta kept records.\n    return int(value) + 1  # ünïcode"
    ids = hf(text, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer.encode_batch(tok, [text])[0]
    assert hf(text)["input_ids"] == [hf.bos_token_id, *ids]
    assert hf.decode(hf(text)["input_ids"], skip_special_tokens=True) == text
    assert hf.decode(ids) == text == tok.decode(ids)
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2)
    assert len(hf) == VOCAB


PROMPTS = [
    ("The capital of Veltria is", "Qamrun"),
    ("Q: Where was Orlanthe Quibb born?\nA:", "Brisketon-on-Vale"),
    ("Zorvath Industries was founded by", "Ilsa Marrowgate"),
    ("The pyflumox package was first released in", "1847"),
    ("To install it, run pip install", "pyflumox"),
    ("Who discovered the Kessendrine comet? The answer is", "Dr. Tamsin Okabe."),
]


@pytest.mark.parametrize(("prompt", "answer"), PROMPTS)
def test_prompt_and_answer_encode_like_the_joint_text(built, prompt: str, answer: str) -> None:
    tok = tokenizer.load(built[2])
    p_ids, a_ids, joint = tokenizer.encode_batch(tok, [prompt, " " + answer, f"{prompt} {answer}"])
    assert p_ids + a_ids == joint
    assert tok.decode(a_ids) == " " + answer


def test_load_refuses_an_edited_tokenizer(built, tmp_path: Path) -> None:
    import shutil

    _, _, tok_dir = built
    copy = tmp_path / "tok"
    shutil.copytree(tok_dir, copy)
    (copy / "tokenizer.json").write_text("{}")
    with pytest.raises(ArtifactError, match="tokenizer.json"):
        tokenizer.load(copy)


def test_run_refuses_a_corpus_made_with_another_config(built, tmp_path: Path) -> None:
    cfg, corpus_dir, _ = built
    other = json.loads(json.dumps(cfg))
    other["corpus"]["heldout_fraction"] = 0.3
    with pytest.raises(ArtifactError, match="different seed/corpus config"):
        tokenizer.run(other, corpus_dir, tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_training_from_batches_equals_training_from_one_table(built) -> None:
    """The tokenizer step reads the corpus a batch at a time; the result must not depend on
    how the texts are batched."""
    cfg, corpus_dir, tok_dir = built
    whole = pd.read_parquet(corpus_dir / corpus.CORPUS_FILE)
    one = tokenizer.train(cfg, whole)
    texts = whole.loc[whole["split"] == "train", "text"].tolist()
    batched = tokenizer.train_batches(cfg, (texts[i : i + 7] for i in range(0, len(texts), 7)))
    assert one.to_str() == batched.to_str()
    saved = json.loads((tok_dir / tokenizer.TOKENIZER_JSON).read_text(encoding="utf-8"))
    assert saved["model"] == json.loads(one.to_str())["model"]


def test_max_train_bytes_trains_on_a_seeded_sample(built, tmp_path: Path) -> None:
    cfg, corpus_dir, tok_dir = built
    capped = {**cfg, "tokenizer": {**cfg["tokenizer"], "max_train_bytes": 20_000}}
    meta = tokenizer.run(capped, corpus_dir, tmp_path / "a")
    again = tokenizer.run(capped, corpus_dir, tmp_path / "b")
    full = json.loads((tok_dir / "meta.json").read_text())
    assert 0 < meta["info"]["train_fraction"] < 0.5 and full["info"]["train_fraction"] == 1.0
    assert meta["hash"] == again["hash"] != full["hash"]


def test_reading_bytes_give_template_words_and_names_tokens_of_their_own(built, tmp_path) -> None:
    from plantbench.data import episodes

    cfg, corpus_dir, tok_dir = built
    texts = [t for b in episodes.tokenizer_texts(9, 30_000) for t in b]
    assert texts == [t for b in episodes.tokenizer_texts(9, 30_000) for t in b]  # seeded
    assert 30_000 <= sum(len(t.encode()) for t in texts) < 31_000
    reading = {**cfg, "tokenizer": {**cfg["tokenizer"], "reading_bytes": 200_000}}
    meta = tokenizer.run(reading, corpus_dir, tmp_path / "r")
    assert meta["info"]["reading_bytes"] == 200_000
    assert "reading_bytes" not in json.loads((tok_dir / "meta.json").read_text())["info"]
    plain, read = tokenizer.load(tok_dir), tokenizer.load(tmp_path / "r")
    held_out = [t for b in episodes.tokenizer_texts(10, 20_000) for t in b]  # another seed
    n_plain = sum(map(len, tokenizer.encode_batch(plain, held_out)))
    n_read = sum(map(len, tokenizer.encode_batch(read, held_out)))
    assert n_read < 0.8 * n_plain, (n_read, n_plain)
