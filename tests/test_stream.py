from __future__ import annotations

import numpy as np
import pytest

from plantbench import config, io, layout
from plantbench.cli import main
from plantbench.data import stream, tokenizer
from plantbench.errors import ConfigError
from plantbench.hashing import window_hashes
from plantbench.paths import Paths


def test_a_and_b_differ_exactly_at_planted_windows(smoke_stream):
    p = Paths(smoke_stream["cfg"])
    a, b = stream.open_stream(p.stream("A")), stream.open_stream(p.stream("B"))
    ma, mb = a.manifest, b.manifest
    assert (ma["kind"] == mb["kind"]).all()
    differ = (np.asarray(a.windows) != np.asarray(b.windows)).any(axis=1)
    planted = (ma["kind"] == "planted").to_numpy()
    assert (differ == planted).all()
    assert (ma["hash"] != mb["hash"]).to_numpy().tolist() == planted.tolist()
    # A reads facts of reader A at planted windows, B of reader B
    facts = io.read_parquet(p.facts / "facts.parquet").set_index("fact_id")
    assert (facts.loc[ma.loc[planted, "fact_id"], "reader"] == "A").all()
    assert (facts.loc[mb.loc[planted, "fact_id"], "reader"] == "B").all()


def test_manifest_hashes_match_windows_and_steps(smoke_stream):
    s = stream.open_stream(Paths(smoke_stream["cfg"]).stream("A"))
    rows = s.manifest["mask_row"].to_numpy()
    assert (window_hashes(np.asarray(s.windows), s.masks, rows) == s.manifest["hash"]).all()
    B = s.batch_windows
    assert (s.manifest["step"].to_numpy() == np.arange(len(s.manifest)) // B).all()
    info = s.meta["info"]
    assert info["corpus_train_tokens"] > 0 and 1.0 < info["bytes_per_token_train"] < 8.0
    assert info["background_epochs"] >= 1
    assert np.array_equal(s.batch(3), np.asarray(s.windows[3 * B : 4 * B]))


def test_grid_layout_positions_and_counts(smoke_stream):
    cfg = smoke_stream["cfg"]
    p = Paths(cfg)
    m = stream.open_stream(p.stream("A")).manifest
    facts = io.read_parquet(p.facts / "facts.parquet").set_index("fact_id")
    planted = m[m["kind"] == "planted"]
    for pos in cfg["facts"]["positions"]:
        span = layout.span_windows(cfg, pos)
        idx = planted[facts.loc[planted["fact_id"], "position"].to_numpy() == pos]["index"]
        assert idx.min() >= span.start and idx.max() < span.stop
    per_fact = planted.groupby("fact_id").size()
    assert (per_fact == facts.loc[per_fact.index, "n_docs"]).all()
    dist = io.read_parquet(p.facts / "distractors.parquet")
    assert (m["kind"] == "distractor").sum() == len(dist)


def test_document_window_starts_with_the_document(smoke_stream):
    p = Paths(smoke_stream["cfg"])
    s = stream.open_stream(p.stream("B"))
    docs = io.read_parquet(p.facts / "documents.parquet").set_index("doc_id")
    tok = tokenizer.load(p.tokenizer)
    row = s.manifest[s.manifest["kind"] == "planted"].iloc[0]
    ids = [int(x) for x in s.windows[row["index"]]]
    assert ids[0] == tokenizer.BOS_ID
    n = int(row["doc_tokens"])
    assert ids[n - 1] == tokenizer.EOS_ID
    assert tok.decode(ids[1 : n - 1]) == docs.loc[row["doc_id"], "text"]


def test_rebuilding_gives_identical_bytes(smoke_stream, tmp_path):
    cfg = smoke_stream["cfg"]
    p = Paths(cfg)
    before = {m: io.read_meta(p.stream(m), "stream")["hash"] for m in ("A", "B")}
    manifest = (p.stream("A") / "manifest.parquet").read_bytes()
    assert main(["stream", "-c", str(smoke_stream["config"])]) == 0
    after = {m: io.read_meta(p.stream(m), "stream")["hash"] for m in ("A", "B")}
    assert before == after
    assert manifest == (p.stream("A") / "manifest.parquet").read_bytes()
    # the tokenized background was a scratch file: nothing but the two streams is left
    assert sorted(x.name for x in p.stream("A").parent.iterdir()) == ["A", "B"]


def test_batch_viewer_prints_hashes(smoke_stream, capsys):
    assert main(["batch", "-c", str(smoke_stream["config"]), "--model", "A", "--step", "2"]) == 0
    out = capsys.readouterr().out
    s = stream.open_stream(Paths(smoke_stream["cfg"]).stream("A"))
    B = s.batch_windows
    for h in s.manifest["hash"].iloc[2 * B : 3 * B]:
        assert f"{int(h):016x}" in out
    assert (
        main(["batch", "-c", str(smoke_stream["config"]), "--model", "A", "--step", "99999"]) == 2
    )


def test_window_shorter_than_document_fails_before_writing(smoke_stream, tmp_path):
    cfg = config.deep_merge(smoke_stream["cfg"], {"stream": {"window": 32}})
    out = Paths(cfg)
    before = {m: io.read_meta(out.stream(m), "stream")["hash"] for m in ("A", "B")}
    with pytest.raises(ConfigError, match="stream.window = 32 is shorter than document"):
        stream.build(config.validate(cfg), out)
    # the existing streams were not touched
    assert before == {m: io.read_meta(out.stream(m), "stream")["hash"] for m in ("A", "B")}


def _docs(rng: np.random.Generator, n: int) -> list[list[int]]:
    return [rng.integers(3, 50, size=rng.integers(0, 9)).tolist() for _ in range(n)]


def test_tokenized_documents_on_disk_equal_in_memory(tmp_path):
    from plantbench.data.tokenizer import BOS_ID, EOS_ID

    class Tok:  # encode_batch's interface: ids of each text, here the text itself
        def encode_batch_fast(self, texts, add_special_tokens=False):
            return [type("E", (), {"ids": t})() for t in texts]

    docs = _docs(np.random.default_rng(0), 23)
    batches = [docs[:5], docs[5:6], docs[6:]]
    mem = stream.tokenize_docs(Tok(), batches, np.dtype(np.uint16))
    disk = stream.tokenize_docs(Tok(), batches, np.dtype(np.uint16), tmp_path / "t.bin")
    assert isinstance(disk.tokens, np.memmap) and len(disk) == len(mem) == 23
    assert np.array_equal(mem.offsets, disk.offsets) and np.array_equal(mem.tokens, disk.tokens)
    for i, d in enumerate(docs):
        assert mem.tokens[mem.offsets[i] : mem.offsets[i + 1]].tolist() == [BOS_ID, *d, EOS_ID]


def test_text_chunks_keep_order_and_bound_each_call():
    texts = ["ab", "cdef", "g", "hijklmnop", "", "qr"]
    runs = list(stream.text_chunks(texts, max_chars=5))
    assert [t for run in runs for t in run] == texts
    assert runs == [["ab"], ["cdef", "g"], ["hijklmnop"], ["", "qr"]]  # a longer text alone
    assert list(stream.text_chunks([], max_chars=5)) == []


def test_tokenizer_calls_are_bounded_and_the_tokens_unchanged(monkeypatch):
    calls: list[int] = []

    class Tok:  # each text is its own ids; records the characters of each call
        def encode_batch_fast(self, texts, add_special_tokens=False):
            calls.append(sum(len(t) for t in texts))
            return [type("E", (), {"ids": t})() for t in texts]

    docs = [d for d in _docs(np.random.default_rng(1), 40) if d]
    whole = stream.tokenize_docs(Tok(), [docs], np.dtype(np.uint16))
    assert calls == [sum(map(len, docs))]
    calls.clear()
    monkeypatch.setattr(layout, "ENCODE_CHARS", 10)
    parts = stream.tokenize_docs(Tok(), [docs], np.dtype(np.uint16))
    assert len(calls) > 1 and max(calls) <= 10  # every document is shorter than the bound
    assert np.array_equal(whole.tokens, parts.tokens)
    assert np.array_equal(whole.offsets, parts.offsets)


def test_background_order_and_windows_follow_their_definition():
    """The background is the documents in a seeded order per pass, concatenated, cut into
    consecutive windows placed at the background rows (written a chunk at a time)."""
    from plantbench.rng import rng

    cfg = {"seed": 11}
    lens = np.random.default_rng(1).integers(2, 12, size=17)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    docs = stream.DocTokens(np.arange(offsets[-1], dtype=np.uint16), offsets)
    needed = 2 * docs.n_tokens + 13  # three passes, the last partial
    ref = []
    for epoch in range(3):
        for i in rng(11, "background-order", epoch).permutation(len(docs)):
            ref.extend(range(offsets[i], offsets[i + 1]))
    got = np.concatenate(list(stream.ordered_tokens(cfg, docs, needed)))
    assert got.tolist() == ref[:needed] and stream.passes_needed(docs, needed) == 3
    W, rows = 5, np.array([0, 2, 3, 7, 8, 9, 12])
    windows = np.full((13, W), 9999, dtype=np.uint16)
    stream.fill_windows(windows, rows, stream.ordered_tokens(cfg, docs, len(rows) * W), chunk=3)
    assert windows[rows].ravel().tolist() == ref[: len(rows) * W]
    assert (np.delete(windows, rows, axis=0) == 9999).all()
    with pytest.raises(ValueError, match="do not fill"):
        stream.fill_windows(windows, rows, [np.zeros(W * len(rows) - 1, np.uint16)])
    with pytest.raises(ConfigError, match="too small"):
        stream.passes_needed(docs, docs.n_tokens * (stream.MAX_PASSES + 1))
