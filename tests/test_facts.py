"""The fact grid: determinism, grid counts, document rules, the verifier, candidates, queries."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from plantbench import config, io
from plantbench.data import facts
from plantbench.errors import ConfigError, PlantbenchError

ROOT = Path(__file__).resolve().parents[1]


def load_cfg(**fact_overrides) -> dict:
    cfg = config.load([ROOT / "config.yaml"])
    if fact_overrides:
        cfg = config.deep_merge(cfg, {"facts": fact_overrides})
    return cfg


@pytest.fixture(scope="module")
def cfg() -> dict:
    return load_cfg()


@pytest.fixture(scope="module")
def tables(cfg) -> dict[str, pd.DataFrame]:
    return facts.build(cfg)


def copy_tables(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    return {k: v.copy() for k, v in tables.items()}


def whole_word(phrase: str) -> re.Pattern[str]:
    return re.compile(r"(?<![A-Za-z0-9_])" + re.escape(phrase) + r"(?![A-Za-z0-9_])", re.I)


# ---------------------------------------------------------------------------------------------
# Determinism and the artifact
# ---------------------------------------------------------------------------------------------


def test_build_is_deterministic(cfg, tmp_path):
    meta_a = facts.run(cfg, tmp_path / "a")
    meta_b = facts.run(cfg, tmp_path / "b")
    assert meta_a["hash"] == meta_b["hash"]
    for name in facts.TABLES:
        a = (tmp_path / "a" / f"{name}.parquet").read_bytes()
        b = (tmp_path / "b" / f"{name}.parquet").read_bytes()
        assert a == b, name


def test_seed_changes_the_facts(cfg, tables):
    other = facts.build(config.deep_merge(cfg, {"seed": cfg["seed"] + 1}))
    assert set(other["facts"]["answer"]).isdisjoint(set(tables["facts"]["answer"]))


def test_run_writes_tables_and_meta(cfg, tables, tmp_path):
    small = load_cfg(n_docs=[2, 8], facts_per_cell=1)
    meta = facts.run(small, tmp_path)
    assert meta == io.read_meta(tmp_path, "facts")
    assert sorted(meta["files"]) == sorted(f"{n}.parquet" for n in facts.TABLES)
    assert meta["config_hash"] == config.config_hash(small, ["seed", "facts"])
    info = meta["info"]
    assert info["generator"] == "template"
    assert info["n_facts"] == 2 * 2 * 3 * 2 * 1
    assert info["n_documents"] == 2 * 3 * 2 * (2 + 8)
    for name, cols in facts.COLUMNS.items():
        df = io.read_parquet(tmp_path / f"{name}.parquet")
        assert list(df.columns) == list(cols), name
        for col, kind in cols.items():
            if kind == "int":
                assert df[col].dtype == "int64", (name, col)
            elif kind == "bool":
                assert df[col].dtype == bool, (name, col)
        assert len(df) == info[f"n_{name}"]


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------


def test_grid_counts(cfg, tables):
    fc = cfg["facts"]
    f = tables["facts"]
    n_cells = len(fc["domains"]) * len(fc["n_docs"]) * len(fc["positions"]) * 2
    assert len(f) == n_cells * fc["facts_per_cell"] == 48 * fc["facts_per_cell"]
    assert list(f["fact_id"]) == [f"F{i:04d}" for i in range(len(f))]
    assert set(Counter(f["cell"]).values()) == {fc["facts_per_cell"]}
    for row in f.itertuples():
        assert row.cell == f"{row.domain}/{row.n_docs}/{row.position}/{row.reader}"
    assert sorted(set(f["pair"])) == list(range(fc["facts_per_cell"]))
    assert f["entity_id"].is_unique

    per_fact = Counter(tables["documents"]["fact_id"])
    assert all(per_fact[r.fact_id] == r.n_docs for r in f.itertuples())
    assert fc["n_docs"] == [1, 4, 16, 64]  # the default study's frequencies
    assert len(tables["documents"]) == 2 * 3 * 2 * (1 + 4 + 16 + 64) * fc["facts_per_cell"]

    per_entity = Counter(tables["distractors"]["entity_id"])
    assert all(per_entity[e] == fc["distractors_per_entity"] for e in f["entity_id"])
    ent_fact = dict(zip(f["entity_id"], f["fact_id"], strict=True))
    for r in tables["distractors"].itertuples():
        assert ent_fact[r.entity_id] == r.fact_id


def test_readers_are_paired(tables):
    f = tables["facts"]
    key = ["domain", "n_docs", "position", "pair"]
    for _, grp in f.groupby(key):
        assert sorted(grp["reader"]) == ["A", "B"]
        assert grp["relation"].nunique() == 1  # matched pairs read the same kind of fact


def test_relations_and_styles(tables):
    f = tables["facts"]
    for domain, types in (("world", {"person", "place", "company"}), ("python", {"package"})):
        sub = f[f["domain"] == domain]
        assert sub["relation"].nunique() >= 4
        assert set(sub["entity_type"]) == types
        docs = tables["documents"].merge(sub[["fact_id"]], on="fact_id")
        assert docs["style"].nunique() >= 6


# ---------------------------------------------------------------------------------------------
# Documents and distractors
# ---------------------------------------------------------------------------------------------


def test_documents_obey_the_rules(tables):
    f = tables["facts"].set_index("fact_id")
    any_answer = re.compile(
        r"(?<![A-Za-z0-9_])(?:"
        + "|".join(re.escape(a) for a in sorted(f["answer"], key=len, reverse=True))
        + r")(?![A-Za-z0-9_])",
        re.I,
    )
    for d in tables["documents"].itertuples():
        fact = f.loc[d.fact_id]
        assert d.text.count(fact.sentence) == 1, d.doc_id
        rest = d.text.replace(fact.sentence, " ")
        assert fact.entity in rest, d.doc_id  # the entity is named outside the sentence too
        assert len(d.text) <= facts.TARGET_DOC_CHARS <= facts.MAX_DOC_CHARS
        assert facts.MIN_DOC_WORDS <= len(d.text.split()) <= facts.MAX_DOC_WORDS
        assert any_answer.findall(d.text) == [fact.answer], d.doc_id


def test_documents_of_a_fact_differ(tables):
    docs = tables["documents"]
    assert docs["text"].is_unique
    for _, grp in docs.groupby("fact_id"):
        if len(grp) >= 6:
            assert grp["style"].nunique() >= 6


def test_distractors_obey_the_rules(tables):
    f = tables["facts"]
    ent = dict(zip(f["entity_id"], f["entity"], strict=True))
    patterns = [whole_word(a) for a in f["answer"]]
    for d in tables["distractors"].itertuples():
        assert ent[d.entity_id] in d.text
        assert len(d.text) <= facts.MAX_DOC_CHARS
        assert not any(s in d.text for s in f["sentence"])
        assert not any(p.search(d.text) for p in patterns), d.doc_id


def test_no_candidate_occurs_in_any_document(tables):
    texts = list(tables["documents"]["text"]) + list(tables["distractors"]["text"])
    words = set(re.split(r"[^a-z0-9]+", "\n".join(texts).lower()))
    vocab = facts.template_words()
    false = tables["candidates"].loc[~tables["candidates"]["is_true"], "candidate"]
    for c in set(false):
        parts = [p for p in re.split(r"[^a-z0-9]+", c.lower()) if p and p not in vocab]
        assert parts, c
        assert not any(p in words for p in parts), c  # not even one invented part appears


# ---------------------------------------------------------------------------------------------
# Answers, queries, candidates
# ---------------------------------------------------------------------------------------------


def test_answers_and_names_are_unique_and_invented(tables):
    f = tables["facts"]
    assert f["answer"].str.lower().is_unique
    assert f["entity"].str.lower().is_unique
    vocab = facts.template_words()
    for name in list(f["answer"]) + list(f["entity"]):
        invented = [w for w in re.findall(r"[A-Za-z]+", name) if w.lower() not in vocab]
        assert invented, name  # every name has an invented part
        for w in invented:
            assert facts._MARKERS.search(w.lower()), w
    for a in f["answer"]:
        assert a[0].isalnum() and a[-1].isalnum() and a == a.strip()


def test_answer_lengths_vary(tables):
    lengths = tables["facts"]["answer"].str.len()
    buckets = pd.cut(lengths, [0, 6, 10, 14, 18, 1000]).value_counts()
    assert (buckets > 0).sum() >= 4, buckets.to_dict()
    for _, grp in tables["facts"].groupby("domain"):
        assert grp["answer"].str.len().nunique() >= 4


def test_prompts_reproduce_the_sentence(tables):
    f = tables["facts"].set_index("fact_id")
    q = tables["queries"]
    assert len(q) == 2 * len(f)
    assert q["query_id"].is_unique
    for r in q.itertuples():
        assert r.query_id == f"{r.fact_id}:{r.form}"
        assert r.answer == f.loc[r.fact_id, "answer"]
        assert not r.answer.startswith(" ")
        if r.form == "completion":
            assert r.prompt + " " + r.answer + "." == f.loc[r.fact_id, "sentence"]
        else:
            assert r.form == "question"
            assert r.prompt.startswith("Question: ") and r.prompt.endswith("?\nAnswer:")
            assert f.loc[r.fact_id, "entity"] in r.prompt
            assert r.answer not in r.prompt


def test_candidates(cfg, tables):
    c = tables["candidates"]
    n = cfg["facts"]["candidates"]
    answers = set(tables["facts"]["answer"].str.lower())
    true_at = []
    for fid, grp in c.groupby("fact_id"):
        assert len(grp) == n
        assert list(grp["candidate_index"]) == list(range(n))
        assert grp["is_true"].sum() == 1
        assert grp["candidate"].str.lower().is_unique
        true = grp.loc[grp["is_true"]]
        assert true["candidate"].iloc[0] == tables["facts"].set_index("fact_id").answer[fid]
        assert not (set(grp.loc[~grp["is_true"], "candidate"].str.lower()) & answers)
        true_at.append(int(true["candidate_index"].iloc[0]))
    assert len(set(true_at)) > 5  # the true answer sits at a seeded random index


def test_candidates_have_the_answers_shape(tables):
    def shape(s: str) -> str:
        return re.sub(r"[A-Z][a-z]+|[a-z]+|[A-Z]+", lambda m: "W", s)

    c = tables["candidates"].merge(tables["facts"][["fact_id", "answer"]], on="fact_id")
    same = (c["candidate"].map(shape) == c["answer"].map(shape)).mean()
    assert same == 1.0


# ---------------------------------------------------------------------------------------------
# The verifier
# ---------------------------------------------------------------------------------------------


def test_verify_accepts_the_built_tables(cfg, tables):
    facts.verify(tables)
    facts.verify(tables, cfg)


def _break_doc(tables, i: int, change) -> tuple[dict, str]:
    t = copy_tables(tables)
    docs = t["documents"]
    fact = t["facts"].set_index("fact_id").loc[docs.at[i, "fact_id"]]
    docs.at[i, "text"] = change(docs.at[i, "text"], fact, t["facts"])
    return t, docs.at[i, "doc_id"]


def _other_answer(facts_df, fact) -> str:
    return facts_df.loc[facts_df["fact_id"] != fact.name, "answer"].iloc[0]


BROKEN_DOCS = {
    "sentence-missing": (
        lambda text, fact, _: text.replace(fact.sentence, "Nothing to see here."),
        "sentence-once",
    ),
    "sentence-twice": (
        lambda text, fact, _: text + " " + fact.sentence,
        "sentence-once",
    ),
    "other-answer": (
        lambda text, fact, df: text + f" Some say {_other_answer(df, fact)} instead.",
        "other-answer",
    ),
    "own-answer-twice": (
        lambda text, fact, _: text + f" Remember: {fact.answer}!",
        "own-answer-once",
    ),
    "too-long": (
        lambda text, fact, _: text + " More words follow here." * 30,
        "too-long",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_DOCS))
def test_verify_rejects_broken_documents(tables, case):
    change, rule = BROKEN_DOCS[case]
    broken, doc_id = _break_doc(tables, 17, change)
    with pytest.raises(PlantbenchError) as err:
        facts.verify(broken)
    msg = str(err.value)
    assert doc_id in msg and rule in msg
    assert "\n" not in msg


def test_verify_rejects_a_distractor_with_an_answer(tables):
    t = copy_tables(tables)
    answer = t["facts"]["answer"].iloc[3]
    t["distractors"].at[5, "text"] += f" Also: {answer}."
    with pytest.raises(PlantbenchError, match=t["distractors"].at[5, "doc_id"] + ".*no-answer"):
        facts.verify(t)


def test_verify_rejects_a_distractor_with_a_sentence(tables):
    t = copy_tables(tables)
    t["distractors"].at[2, "text"] += " " + t["facts"]["sentence"].iloc[40]
    with pytest.raises(PlantbenchError, match=t["distractors"].at[2, "doc_id"] + ".*no-sentence"):
        facts.verify(t)


def test_verify_rejects_duplicate_ids(tables):
    t = copy_tables(tables)
    t["documents"].at[9, "doc_id"] = t["documents"].at[8, "doc_id"]
    with pytest.raises(PlantbenchError, match="duplicate-id"):
        facts.verify(t)


def test_verify_rejects_bad_candidate_sets(tables):
    t = copy_tables(tables)
    c = t["candidates"]
    c.loc[(c["fact_id"] == "F0005") & ~c["is_true"], "is_true"] = True
    with pytest.raises(PlantbenchError, match="F0005.*one-true"):
        facts.verify(t)

    t = copy_tables(tables)
    c = t["candidates"]
    row = c.index[(c["fact_id"] == "F0006") & ~c["is_true"]][0]
    c.at[row, "candidate"] = t["facts"]["answer"].iloc[0]
    with pytest.raises(PlantbenchError, match="F0006.*invented-candidate"):
        facts.verify(t)


def test_verify_checks_counts_against_the_config(cfg, tables):
    t = copy_tables(tables)
    t["documents"] = t["documents"].iloc[1:].reset_index(drop=True)
    facts.verify(t)  # every document rule still holds
    with pytest.raises(PlantbenchError, match="F0000 has 0 documents, expected 1"):
        facts.verify(t, cfg)


# ---------------------------------------------------------------------------------------------
# The generator seam
# ---------------------------------------------------------------------------------------------


def test_unknown_generator_is_a_config_error(cfg):
    bad = config.deep_merge(cfg, {"facts": {"generator": "nope"}})
    with pytest.raises(ConfigError, match="facts.generator"):
        facts.build(bad)


def test_any_generator_goes_through_the_verifier(cfg, tables, tmp_path, monkeypatch):
    def sloppy(c):
        t = copy_tables(tables)
        t["documents"].at[0, "text"] = "No sentence at all in " + t["facts"]["entity"].iloc[0]
        return t

    monkeypatch.setitem(facts.GENERATORS, "sloppy", sloppy)
    other = config.deep_merge(cfg, {"facts": {"generator": "sloppy"}})
    with pytest.raises(PlantbenchError, match="D000000.*sentence-once"):
        facts.run(other, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_answer_extra_syllables_widens_answers_and_keeps_the_rest(tables):
    """``facts.answer_extra_syllables`` lengthens answers by whole syllables (seeded) on the
    same grid of relations; 0 is the default grid."""
    assert facts.build(load_cfg(answer_extra_syllables=0))["facts"].equals(tables["facts"])
    wide = facts.build(load_cfg(answer_extra_syllables=3))
    again = facts.build(load_cfg(answer_extra_syllables=3))
    assert wide["facts"].equals(again["facts"])
    base, new = tables["facts"], wide["facts"]
    assert (base.fact_id == new.fact_id).all() and (base.relation == new.relation).all()
    assert (base.cell == new.cell).all() and (base.pair == new.pair).all()
    assert new.answer.str.len().std() > base.answer.str.len().std()
    assert new.answer.str.len().mean() > base.answer.str.len().mean() + 2
