"""Corpus collection: determinism, splitting, filtering, dedup, limits and bad input."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from plantbench.data import corpus
from plantbench.errors import PlantbenchError
from plantbench.io import read_meta, write_parquet

SYLLABLES = ["ka", "lo", "mir", "ta", "ven", "du", "sel", "or", "pi", "quan", "rhu", "zen"]


def words(rng: random.Random, n: int) -> str:
    return " ".join(
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n)
    )


def paragraphs(seed: int, n: int, lo: int = 8, hi: int = 30) -> list[str]:
    rng = random.Random(seed)
    return [words(rng, rng.randint(lo, hi)).capitalize() + "." for _ in range(n)]


def make_cfg(sources: list[dict], **corpus_keys) -> dict:
    c = {
        "sources": sources,
        "min_doc_chars": 60,
        "max_doc_chars": 400,
        "max_bytes": 0,
        "heldout_fraction": 0.25,
    }
    c.update(corpus_keys)
    return {"seed": 7, "corpus": c}


def write_jsonl(path: Path, texts: list[str], key: str = "text") -> Path:
    path.write_text("".join(json.dumps({key: t}) + "\n" for t in texts), encoding="utf-8")
    return path


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    p = tmp_path / "bg.txt"
    p.write_text("\n\n".join(paragraphs(1, 300)) + "\n", encoding="utf-8")
    return p


def test_text_source_is_deterministic(tmp_path: Path, text_file: Path) -> None:
    cfg = make_cfg([{"kind": "text", "path": str(text_file)}])
    m1 = corpus.run(cfg, tmp_path / "c1")
    m2 = corpus.run(cfg, tmp_path / "c2")
    assert m1["hash"] == m2["hash"]
    b1 = (tmp_path / "c1" / corpus.CORPUS_FILE).read_bytes()
    assert b1 == (tmp_path / "c2" / corpus.CORPUS_FILE).read_bytes()
    meta = read_meta(tmp_path / "c1", "corpus")
    assert meta["info"]["n_docs"] == meta["info"]["n_train"] + meta["info"]["n_heldout"]
    # A different seed moves documents between splits, so the corpus hash changes.
    m3 = corpus.run({**cfg, "seed": 8}, tmp_path / "c3")
    assert m3["hash"] != m1["hash"]


def test_table_shape_and_text_rules(text_file: Path) -> None:
    cfg = make_cfg([{"kind": "text", "path": str(text_file)}])
    df = corpus.collect(cfg)
    assert list(df.columns) == corpus.COLUMNS
    assert list(df["doc_id"]) == [f"C{i:07d}" for i in range(len(df))]
    assert set(df["kind"]) == {"prose"} and set(df["split"]) == {"train", "heldout"}
    lengths = df["text"].str.len()
    assert lengths.min() >= 60 and lengths.max() <= 400
    assert df["source"].str.startswith(f"{text_file}#").all()
    # Paragraphs are grouped, never cut: every paragraph appears whole in one document.
    paras = paragraphs(1, 300)
    joined = "\n\x00".join(df["text"])
    assert sum(p in joined for p in paras) >= len(paras) - 2  # the last short group may drop
    assert df["text"].str.contains("\n\n").any()


def test_normalisation_of_newlines_and_whitespace(tmp_path: Path, text_file: Path) -> None:
    raw = "First line   \r\nsecond line\t\r\n\r\n\r\n" + "x " * 60 + "\rlast  \n\n\n"
    p = tmp_path / "a.txt"
    p.write_bytes(raw.encode())
    sources = [{"kind": "text", "path": str(p)}, {"kind": "text", "path": str(text_file)}]
    df = corpus.collect(make_cfg(sources))
    (text,) = df.loc[df["source"] == f"{p}#0", "text"]
    assert "\r" not in text and not text.endswith("\n")
    assert all(line == line.rstrip() for line in text.split("\n"))
    assert text.startswith("First line\nsecond line\n\n")


def test_split_is_stable_when_documents_are_added(tmp_path: Path) -> None:
    base = write_jsonl(tmp_path / "a.jsonl", paragraphs(2, 400, 15, 40))
    more = write_jsonl(tmp_path / "b.jsonl", paragraphs(3, 200, 15, 40))
    df1 = corpus.collect(make_cfg([{"kind": "jsonl", "path": str(base)}]))
    df2 = corpus.collect(
        make_cfg([{"kind": "jsonl", "path": str(more)}, {"kind": "jsonl", "path": str(base)}])
    )
    split1 = dict(zip(df1["text"], df1["split"], strict=True))
    split2 = dict(zip(df2["text"], df2["split"], strict=True))
    assert split1 and all(split2[t] == s for t, s in split1.items())
    share = (df2["split"] == "heldout").mean()
    assert 0.18 < share < 0.32  # heldout_fraction 0.25 over ~600 documents


def test_exact_duplicates_are_dropped_keeping_the_first(tmp_path: Path) -> None:
    texts = paragraphs(4, 20, 15, 40)
    rows = texts[:10] + [texts[3], texts[3] + "   ", texts[5].replace(" ", " ", 1)] + texts[10:]
    p = write_jsonl(tmp_path / "d.jsonl", rows)
    df = corpus.collect(make_cfg([{"kind": "jsonl", "path": str(p)}]))
    assert df["text"].is_unique
    assert len(df) == 20
    # The survivor of texts[3] is the first occurrence (line 4), not a later copy.
    assert df.loc[df["text"] == texts[3], "source"].item() == f"{p}:4"


def test_long_rows_are_cut_and_short_rows_dropped(tmp_path: Path) -> None:
    long = "\n".join(paragraphs(5, 40, 5, 10))
    assert len(long) > 1000
    line = words(random.Random(9), 300)[:900].strip()
    p = write_jsonl(tmp_path / "l.jsonl", ["too short", long, line])
    df = corpus.collect(make_cfg([{"kind": "jsonl", "path": str(p)}], heldout_fraction=0.5))
    assert (df["text"].str.len() <= 400).all()
    pieces = df[df["source"].str.startswith(f"{p}:2#")]
    assert len(pieces) >= 3
    # Cut on line boundaries: every piece is a run of whole lines of the original.
    assert all(piece in long and piece.split("\n")[0] in long.split("\n") for piece in pieces.text)
    assert not df["source"].str.startswith(f"{p}:1").any()  # "too short" dropped
    # A single over-long line is cut at spaces.
    assert " ".join(df[df["source"].str.startswith(f"{p}:3#")]["text"]) == line


def test_binary_rows_are_dropped(tmp_path: Path) -> None:
    texts = paragraphs(6, 12, 15, 40)
    rows = texts + ["bad\x00" + texts[0][4:] + " extra", "\x01\x02\x03\x04" * 30]
    p = write_jsonl(tmp_path / "b.jsonl", rows)
    df = corpus.collect(make_cfg([{"kind": "jsonl", "path": str(p)}]))
    assert len(df) == 12 and not df["text"].str.contains("\x00").any()


def test_max_bytes_takes_a_prefix(tmp_path: Path, text_file: Path) -> None:
    full = corpus.collect(make_cfg([{"kind": "text", "path": str(text_file)}]))
    cap = 20_000
    part = corpus.collect(make_cfg([{"kind": "text", "path": str(text_file)}], max_bytes=cap))
    assert part["text"].map(lambda t: len(t.encode())).sum() <= cap
    assert len(part) < len(full)
    pd.testing.assert_frame_equal(part, full.iloc[: len(part)].reset_index(drop=True))


def test_folder_parquet_and_datasets_sources(tmp_path: Path) -> None:
    folder = tmp_path / "txt"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("\n\n".join(paragraphs(7, 30)), encoding="utf-8")
    (folder / "sub" / "a.txt").write_text("\n\n".join(paragraphs(8, 30)), encoding="utf-8")
    (folder / "ignored.md").write_text("\n\n".join(paragraphs(9, 30)), encoding="utf-8")
    pq_path = tmp_path / "rows.parquet"
    write_parquet(pq_path, pd.DataFrame({"body": paragraphs(10, 20, 15, 40), "n": range(20)}))

    import datasets

    ds_path = tmp_path / "ds"
    datasets.Dataset.from_dict({"content": paragraphs(11, 20, 15, 40)}).save_to_disk(str(ds_path))
    cfg = make_cfg(
        [
            {"kind": "text", "path": str(folder)},
            {"kind": "parquet", "path": str(pq_path), "field": "body"},
            {"kind": "datasets", "path": str(ds_path), "field": "content"},
        ]
    )
    df = corpus.collect(cfg)
    src = df["source"]
    assert (
        src.str.startswith(f"{folder}/b.txt#").any()
        and src.str.startswith(f"{folder}/sub/a.txt#").any()
    )
    assert not src.str.contains("ignored.md").any()
    assert (
        src.str.startswith(f"{folder}/b.txt").idxmax()
        < src.str.startswith(f"{folder}/sub").idxmax()
    )
    assert (src.str.startswith(f"{pq_path}:")).sum() == 20
    assert (src.str.startswith(f"{ds_path}:")).sum() == 20
    assert df.loc[src == f"{ds_path}:3", "text"].item() == paragraphs(11, 20, 15, 40)[3]


def test_stdlib_source_small(tmp_path: Path) -> None:
    cfg = make_cfg([{"kind": "stdlib"}], min_doc_chars=200, max_doc_chars=3000, max_bytes=300_000)
    m1 = corpus.run(cfg, tmp_path / "s1")
    m2 = corpus.run(cfg, tmp_path / "s2")
    assert m1["hash"] == m2["hash"]
    df = pd.read_parquet(tmp_path / "s1" / corpus.CORPUS_FILE)
    assert set(df["kind"]) == {"code", "prose"}
    assert df["source"].str.startswith("stdlib:").all()
    assert 290_000 < m1["info"]["bytes"] <= 300_000 and m1["info"]["max_bytes_reached"]
    code = df[df["kind"] == "code"]["text"]
    assert code.str.contains(r"^(?:def|class) ", regex=True).any()
    assert m1["info"]["python_version"].count(".") == 2


def test_stdlib_file_selection() -> None:
    root = corpus.stdlib_root()
    rels = [p.relative_to(root).as_posix() for p in corpus.stdlib_files(root)]
    assert "json/decoder.py" in rels and "os.py" in rels
    assert rels == sorted(rels)
    bad = ("test/", "tests/", "idlelib/", "site-packages/", "idle_test/")
    assert not [r for r in rels if any(f"/{b}" in f"/{r}" for b in bad)]


def test_code_chunks_start_at_top_level_definitions() -> None:
    src = "import os\n\n\n# helper\ndef a():\n    return 1\n\n\n@dec\nclass B:\n    x = 1\n"
    import ast

    units = corpus._code_units(src, ast.parse(src))
    assert units[0].startswith("import os") and units[1].startswith("# helper\ndef a")
    assert units[2].startswith("@dec\nclass B") and "".join(u + "\n" for u in units)[:-1] == src


# ---------------------------------------------------------------------------- bad input


def _bad_cases(tmp: Path) -> dict[str, tuple[dict, str]]:
    good = "\n\n".join(paragraphs(12, 40))
    (tmp / "empty.txt").write_text("")
    (tmp / "nofolder").mkdir()
    (tmp / "nofolder" / "x.md").write_text(good)
    (tmp / "nul.txt").write_bytes(good.encode()[:500] + b"\x00\x01" + good.encode()[500:])
    (tmp / "latin.txt").write_bytes(good.encode() + "caf\u00e9".encode("latin-1"))
    (tmp / "bad.jsonl").write_text('{"text": "fine text here"}\n{"text": oops}\n')
    (tmp / "nofield.jsonl").write_text('{"text": "ok"}\n{"body": "no text key"}\n')
    write_parquet(tmp / "nocol.parquet", pd.DataFrame({"body": ["a" * 100]}))
    (tmp / "notds").mkdir()
    (tmp / "notds" / "junk.bin").write_bytes(b"\x00\x01")
    (tmp / "short.jsonl").write_text('{"text": "tiny"}\n')
    return {
        "missing": ({"kind": "text", "path": str(tmp / "nope.txt")}, "nope.txt"),
        "empty-file": ({"kind": "text", "path": str(tmp / "empty.txt")}, "empty.txt"),
        "empty-folder": ({"kind": "text", "path": str(tmp / "nofolder")}, "nofolder"),
        "nul": ({"kind": "text", "path": str(tmp / "nul.txt")}, "nul.txt"),
        "not-utf8": ({"kind": "text", "path": str(tmp / "latin.txt")}, "latin.txt"),
        "bad-json": ({"kind": "jsonl", "path": str(tmp / "bad.jsonl")}, "bad.jsonl' line 2"),
        "no-field": (
            {"kind": "jsonl", "path": str(tmp / "nofield.jsonl")},
            "nofield.jsonl' line 2",
        ),
        "no-column": ({"kind": "parquet", "path": str(tmp / "nocol.parquet")}, "nocol.parquet"),
        "not-dataset": ({"kind": "datasets", "path": str(tmp / "notds")}, "notds"),
        "all-filtered": ({"kind": "jsonl", "path": str(tmp / "short.jsonl")}, "short.jsonl"),
    }


BAD = [
    "missing",
    "empty-file",
    "empty-folder",
    "nul",
    "not-utf8",
    "bad-json",
    "no-field",
    "no-column",
    "not-dataset",
    "all-filtered",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_naming_the_file(tmp_path: Path, text_file: Path, case: str) -> None:
    src, needle = _bad_cases(tmp_path)[case]
    # The bad source comes second, so the error must name its index, and nothing is written.
    cfg = make_cfg([{"kind": "text", "path": str(text_file)}, src])
    out = tmp_path / "out"
    with pytest.raises(PlantbenchError) as exc:
        corpus.run(cfg, out)
    msg = str(exc.value)
    assert "\n" not in msg
    assert needle in msg and "corpus.sources.1" in msg
    assert not out.exists()


def test_streamed_row_groups_hold_the_collected_table(
    tmp_path: Path, text_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` writes the corpus a row group at a time; with a tiny row-group size the file has
    many row groups and still holds exactly `collect`'s table, and `iter_texts` gives each
    split's texts in corpus order."""
    import pyarrow.parquet as pq

    cfg = make_cfg([{"kind": "text", "path": str(text_file)}])
    one = corpus.run(cfg, tmp_path / "one")
    monkeypatch.setattr(corpus, "ROW_GROUP_BYTES", 1000)
    many = corpus.run(cfg, tmp_path / "many")
    assert pq.ParquetFile(tmp_path / "one" / corpus.CORPUS_FILE).num_row_groups == 1
    assert pq.ParquetFile(tmp_path / "many" / corpus.CORPUS_FILE).num_row_groups > 5
    expected = corpus.collect(cfg)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "many" / corpus.CORPUS_FILE), expected)
    assert many["info"] == one["info"]
    assert one["info"]["n_train"] == (expected["split"] == "train").sum()
    for split in corpus.SPLITS:
        got = [
            t for batch in corpus.iter_texts(tmp_path / "many", split, batch_rows=5) for t in batch
        ]
        assert got == expected.loc[expected["split"] == split, "text"].tolist()


def test_jsonl_is_read_line_by_line_with_file_offsets_in_errors(tmp_path: Path) -> None:
    p = tmp_path / "rows.jsonl"
    good = json.dumps({"text": "x" * 80}) + "\n"
    p.write_bytes(
        b"\xef\xbb\xbf" + good.encode() + b"\n" + good.encode().replace(b"xx", b"\xffx", 1)
    )
    with pytest.raises(PlantbenchError, match=f"bad byte at offset {3 + len(good) + 1 + 10}"):
        corpus.collect(make_cfg([{"kind": "jsonl", "path": str(p)}]))


def test_seeded_sample_of_a_split_is_order_and_batch_independent(
    tmp_path: Path, text_file: Path
) -> None:
    cfg = make_cfg([{"kind": "text", "path": str(text_file)}])
    corpus.run(cfg, tmp_path / "c")

    def texts(**kw) -> list[str]:
        return [t for batch in corpus.iter_texts(tmp_path / "c", "train", **kw) for t in batch]

    everything = texts()
    half = texts(sample=(5, 0.5))
    assert half == texts(sample=(5, 0.5), batch_rows=3)  # same documents, however read
    assert 0.3 * len(everything) < len(half) < 0.7 * len(everything)
    assert [t for t in everything if t in set(half)] == half  # a subset, in corpus order
    assert half != texts(sample=(6, 0.5)) and texts(sample=(5, 1.0)) == everything
