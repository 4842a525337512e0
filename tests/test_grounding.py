"""The grounding suite (seed 002): atomizing, entailment, scores, contexts and generation on cases
with known answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from plantbench.data import facts, tokenizer
from plantbench.errors import ConfigError
from plantbench.model import generate
from plantbench.suites.grounding import contexts, entail, provenance, scores
from plantbench.suites.grounding.atomize import atomize
from plantbench.suites.grounding.respond import judge, stated
from plantbench.suites.grounding.settings import settings
from tiny_models import tiny_llama

ROOT = Path(__file__).resolve().parents[1]

# ---- a hand-made grid of three entities ------------------------------------------------------

ENTITIES = {"Draasriv Mills": "E0", "Styus Soustaa": "E1", "Kuvrou Works": "E2"}
ANSWERS = {"E0": "Kvenvleil Zaen", "E1": "Zvox-Zhymriv", "E2": "Stae Gvyl"}
WRONG = {"E0": "Syuvral Vraax", "E1": "Upper Kraengrar", "E2": "Kaam Kvux"}
LEX = entail.Lexicon(ENTITIES, [*ANSWERS.values(), *WRONG.values()])
S0 = entail.Statement(
    "The company Draasriv Mills was founded by Kvenvleil Zaen.", "E0", ANSWERS["E0"]
)
S1 = entail.Statement(
    "The painter Styus Soustaa was born in the village of Zvox-Zhymriv.", "E1", ANSWERS["E1"]
)
D0 = entail.Statement("Draasriv Mills pays every apprentice to learn a second language.", "E0", "")
S2 = entail.Statement(
    "The headquarters of Kuvrou Works are in the city of Stae Gvyl.", "E2", "Stae Gvyl"
)
CONTEXT = [S0, D0, S1, S2]  # one sentence per segment


def test_atomize_splits_lines_and_sentences_and_drops_fragments():
    text = "- Draasriv Mills pays well. It was founded by Kvenvleil Zaen!\nOk.\nThe firm grew fast"
    assert atomize(text) == [
        "Draasriv Mills pays well.",
        "It was founded by Kvenvleil Zaen!",
        "The firm grew fast",
    ]
    assert atomize(text, truncated=True) == atomize(text)[:-1]  # the cut last piece goes
    assert atomize("") == []


def test_hand_written_response_has_known_ck_pk_and_recall():
    response = (
        "Draasriv Mills pays every apprentice to learn a second language. "  # copies segment 1
        "Kvenvleil Zaen founded Draasriv Mills in a hurry. "  # segment 0's claim, paraphrased
        "The company Draasriv Mills sells ten thousand barrels."  # nothing in the context
    )
    atoms = atomize(response)
    rows = judge(
        "q", atoms, CONTEXT, [0, 1, 2, 3], entail.ExactChecker(LEX), lambda s: "unsupported"
    )
    atoms_df = pd.DataFrame(
        rows, columns=["context_id", "atom", "text", "ck", "segments", "pk_kind"]
    )
    assert atoms_df["ck"].tolist() == [True, True, False]
    assert atoms_df["segments"].tolist() == ["1", "0", ""]
    got = scores.response_scores(atoms_df, ["q"], [1, 1, 1, 1]).iloc[0]
    assert got["ck"] == pytest.approx(200 / 3) and got["pk"] == pytest.approx(100 / 3)
    assert got["pk_unsupported"] == pytest.approx(100 / 3) and got["pk_trained"] == 0
    assert [got[f"cr_{q}"] for q in range(4)] == [100.0, 100.0, 0.0, 0.0]
    # |Q_q| = 2 halves the recall of a segment
    assert scores.context_recall([[0], [0, 1]], [2, 2]).tolist() == [100.0, 50.0]


def test_exact_checker_rejects_the_entity_with_another_entitys_answer():
    m = entail.ExactChecker(LEX).matrix(
        CONTEXT,
        [
            "Draasriv Mills was founded by Stae Gvyl.",  # E0 with E2's answer: both in context
            "Draasriv Mills was founded by Syuvral Vraax.",  # a candidate the context lacks
            "the company draasriv mills was founded by kvenvleil zaen",  # S0, case and dot aside
        ],
    )
    assert m.tolist() == [
        [False, False, False, False],
        [False, False, False, False],
        [True, False, False, False],
    ]


def test_empty_responses_have_no_ck_and_bad_segments_are_refused():
    with pytest.raises(ValueError, match="empty response"):
        scores.ck_score([])
    with pytest.raises(ValueError, match="empty response"):
        scores.pk_split([])
    with pytest.raises(ValueError, match="outside a context of 2"):
        scores.context_recall([[3]], [1, 1])
    empty = pd.DataFrame(columns=["context_id", "atom", "text", "ck", "segments", "pk_kind"])
    row = scores.response_scores(empty, ["q"], [1, 1]).iloc[0]
    assert row["n_atoms"] == 0 and np.isnan(row["ck"]) and np.isnan(row["cr_1"])


# ---- NLI back-end -------------------------------------------------------------------------------


def _inclusion(premises, hypotheses):
    """A one-directional stand-in for an NLI model: the share of the hypothesis's words that
    the premise has (1 when the premise says everything the hypothesis says)."""
    out = []
    for p, h in zip(premises, hypotheses, strict=True):
        pw, hw = set(re.findall(r"[\w-]+", p.lower())), re.findall(r"[\w-]+", h.lower())
        out.append(sum(w in pw for w in hw) / len(hw))
    return np.array(out)


def test_nli_back_end_is_bidirectional_and_agrees_with_the_exact_checker_on_templates():
    nli = entail.NLIChecker(None, 0.99, scorer=_inclusion)
    # a shorter hypothesis is entailed forward, a longer one only backward: max takes both
    sc = nli.scores(
        [S0], ["Draasriv Mills was founded by Kvenvleil Zaen.", f"{S0.text} Indeed so."]
    )
    assert sc[:, 0] == pytest.approx([1.0, 1.0])
    templated = [s.text for s in CONTEXT] + [
        f"The company Draasriv Mills was founded by {WRONG['E0']}.",
        f"The painter Styus Soustaa was born in the village of {ANSWERS['E0']}.",
        f"The headquarters of Kuvrou Works are in the city of {WRONG['E2']}.",
    ]
    exact = entail.ExactChecker(LEX).matrix(CONTEXT, templated)
    assert (nli.matrix(CONTEXT, templated) == exact).all()
    assert exact.any(axis=1).tolist() == [True] * 4 + [False] * 3


def _tiny_classifier(folder, labels):
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    words = sorted({w for s in CONTEXT for w in entail.normalize(s.text).split()})
    folder.mkdir()
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])
    )
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    conf = BertConfig(
        vocab_size=5 + len(words),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    torch.manual_seed(0)
    BertForSequenceClassification(conf).save_pretrained(folder)
    return folder


def test_a_local_nli_folder_scores_pairs_and_bad_folders_are_refused(tmp_path):
    good = _tiny_classifier(tmp_path / "nli", ["entailment", "neutral", "contradiction"])
    p = entail.nli_scorer(good)([S0.text, S1.text, D0.text], [S1.text, S0.text, S2.text])
    assert p.shape == (3,) and ((p > 0) & (p < 1)).all()
    m = entail.NLIChecker(good, 0.7).scores(CONTEXT, [S0.text, "Draasriv Mills is a mill."])
    assert m.shape == (2, 4)
    sentiment = _tiny_classifier(tmp_path / "sentiment", ["positive", "negative"])
    with pytest.raises(ConfigError, match="is not an NLI model"):
        entail.nli_scorer(sentiment)
    with pytest.raises(ConfigError, match="no model folder"):
        entail.nli_scorer(tmp_path / "missing")


# ---- contexts on the smoke grid -----------------------------------------------------------------


@pytest.fixture(scope="module")
def grid():
    from plantbench import config

    cfg = config.load([ROOT / "config.yaml", ROOT / "tests" / "smoke" / "config.yaml"])
    t = facts.build(cfg)
    learned = pd.DataFrame({"fact_id": t["facts"]["fact_id"], "learned": True})
    return cfg, t, learned


def _build(cfg, t, learned, **over):
    st = settings({**cfg, "grounding": over})
    return st, *contexts.build(t["facts"], learned, t["distractors"], t["candidates"], st)


def test_contexts_vary_the_fact_only_and_place_the_versions_as_the_condition_says(grid):
    cfg, t, learned = grid
    st, cdf, sdf = _build(cfg, t, learned)
    assert (
        len(cdf) == len(t["facts"]) * 4 and (sdf.groupby("context_id").size() == st.sentences).all()
    )
    fac = cdf[cdf["condition"] == "factual"]
    counts = fac["true_segment"].value_counts()
    assert counts.max() - counts.min() <= 1  # the fact's segment is balanced over the facts
    by = {c: g.sort_values("index") for c, g in sdf.groupby("context_id")}
    for fid in t["facts"]["fact_id"]:
        f, cf = by[f"{fid}:factual"], by[f"{fid}:counterfactual"]
        differ = (f["text"].to_numpy() != cf["text"].to_numpy()).nonzero()[0]
        assert len(differ) == 1 and f["kind"].iloc[differ[0]] == "fact"
        assert cf["kind"].iloc[differ[0]] == "false"
    tf, ff = cdf[cdf["condition"] == "true_first"], cdf[cdf["condition"] == "false_first"]
    assert (tf["true_segment"] < tf["false_segment"]).all()
    assert (ff["false_segment"] < ff["true_segment"]).all()
    assert (cdf["true_segment"].ne(cdf["false_segment"])).all()
    details = sdf[sdf["kind"] == "detail"]
    assert len(details) and all(
        t["facts"].set_index("entity_id").at[e, "entity"] in s
        for e, s in zip(details["entity_id"], details["text"], strict=True)
    )
    _, cdf2, sdf2 = _build(cfg, t, learned)  # seeded: the same tables again
    pd.testing.assert_frame_equal(cdf, cdf2)
    pd.testing.assert_frame_equal(sdf, sdf2)


def test_a_copying_model_gets_ck_100_and_a_remembering_reader_gets_trained_pk(grid):
    cfg, t, learned = grid
    _, cdf, sdf = _build(cfg, t, learned, conditions=["counterfactual"])
    lex = provenance.lexicon_of(t["facts"], t["candidates"])
    index = provenance.ReadIndex(lex, t["facts"], t["documents"], t["distractors"])
    checker = entail.ExactChecker(lex)
    for c in cdf.itertuples(index=False):
        s = sdf[sdf["context_id"] == c.context_id].sort_values("index")
        prem = [
            entail.Statement(*r)
            for r in zip(s["text"], s["entity_id"], s["stated_answer"], strict=True)
        ]
        copy = s.loc[s["kind"] == "false", "text"].iloc[0]  # copies the context's version
        true = t["facts"].set_index("fact_id").at[c.fact_id, "sentence"]  # answers from memory
        for reply, model, want in (
            (copy, c.reader, None),
            (true, c.reader, "trained"),
            (true, c.other, "other_twin"),
        ):
            rows = judge(
                c.context_id,
                atomize(reply),
                prem,
                s["segment"].tolist(),
                checker,
                lambda x, m=model: index.kind(m, x),
            )
            ck = scores.ck_score([r[3] for r in rows])
            split = scores.pk_split([r[5] for r in rows])
            if want is None:
                assert ck == 100 and split["pk_trained"] == 0
            else:
                assert ck == 0 and split[f"pk_{want}"] == 100
        assert stated(lex, copy, c.entity_id, c.answer, c.false_answer) == (False, True, False)


def test_bad_grounding_settings_fail_with_one_line_naming_the_key(grid):
    cfg, t, learned = grid
    for over, key in (
        ({"conditions": ["factual", "sideways"]}, "grounding.conditions"),
        ({"details": 3}, "grounding.details"),
        ({"segments": 1}, "grounding.segments"),
        ({"question": "Tell me more."}, "grounding.question"),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            settings({**cfg, "grounding": over})
    with pytest.raises(ConfigError, match="needs .* other facts but the grid has"):
        _build(cfg, t, learned, segments=30)  # more sentences than the grid has facts


def test_a_prompt_the_window_cannot_answer_is_refused_and_budgets_cap_the_rest(grid):
    cfg, t, learned = grid
    st, cdf, _ = _build(cfg, t, learned)
    tok = tokenizer.train_batches(cfg, [cdf["prompt"].tolist()])
    lens = [1 + len(x) for x in tokenizer.encode_batch(tok, cdf["prompt"].tolist())]
    window = max(lens) + st.max_new_tokens - 5
    got = contexts.budgets(tok, cdf["prompt"].tolist(), st, window)
    assert (
        got == [min(st.max_new_tokens, window - n) for n in lens] and min(got) >= st.min_new_tokens
    )
    with pytest.raises(ConfigError, match="grounding.min_new_tokens"):
        contexts.budgets(tok, cdf["prompt"].tolist(), st, max(lens) + st.min_new_tokens - 1)


# ---- generation ---------------------------------------------------------------------------------


def _tiny_llama():
    return tiny_llama(n_layer=2, vocab=40, window=64, seed=3)


def _naive_greedy(model, prompt, limit, stops):
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(limit):
            t = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if t in stops:
                return out, t
            out.append(t)
            ids.append(t)
    return out, None


def test_batched_greedy_equals_one_prompt_at_a_time_without_a_cache():
    model = _tiny_llama()
    g = torch.Generator().manual_seed(1)
    prompts = [
        [tokenizer.BOS_ID, *torch.randint(3, 40, (n,), generator=g).tolist()] for n in (3, 9, 5, 12)
    ]
    limits = [6, 10, 0, 8]
    stops = frozenset({7, 11})
    batched = generate.greedy(model, prompts, limits, stops)
    for p, lim, r in zip(prompts, limits, batched, strict=True):
        ids, stop = _naive_greedy(model, p, lim, stops | {tokenizer.EOS_ID})
        assert (r.ids, r.stop) == (ids, stop)
        assert len(r.ids) <= lim


def test_settings_hash_changes_with_a_setting(grid):
    from plantbench.suites.grounding.settings import settings_hash

    cfg, _, _ = grid
    a, b = settings(cfg), settings({**cfg, "grounding": {"max_new_tokens": 16}})
    assert settings_hash(a) != settings_hash(b) and settings_hash(a) == settings_hash(settings(cfg))
    assert json.loads(json.dumps(a.conditions)) == list(a.conditions)
