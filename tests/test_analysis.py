"""Tests for plantbench.grading.analysis: exact AP / Recall@10 from own.parquet, the within-cell
correlations on plug-in-style synthetic methods with known answers, and the bad inputs.

Score folders are written here by :func:`write_scores` from full (query x pool) score matrices,
exactly as the scoring contract describes them, so every graded number can be checked against
:mod:`plantbench.grading.metrics` on the full matrices.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from plantbench import cli, config, io
from plantbench.attribution import pool
from plantbench.attribution.methods import registry
from plantbench.errors import ArtifactError
from plantbench.grading import analysis, metrics
from plantbench.paths import MODELS, Paths

NAN = float("nan")
ROOT = Path(__file__).resolve().parents[1]
FORMS = ("completion", "question")


# --------------------------------------------------------------------------------------------
# Writing score artifacts the way the scoring contract describes them
# --------------------------------------------------------------------------------------------


def counts_above_and_tied(row: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n_greater / n_ties of the own windows (NaN lowest, NaN ties NaN), brute force."""
    nan = np.isnan(row)
    greater, ties = [], []
    for i in np.flatnonzero(own):
        if nan[i]:
            greater.append(int((~nan).sum()))
            ties.append(int(nan.sum()) - 1)
        else:
            greater.append(int((row[~nan] > row[i]).sum()))
            ties.append(int((row[~nan] == row[i]).sum()) - 1)
    return np.array(greater, dtype=np.int64), np.array(ties, dtype=np.int64)


def write_scores(
    folder: Path,
    method: str,
    model: str,
    query_ids: list[str],
    windows: np.ndarray,
    window_fact: np.ndarray,
    scores: np.ndarray,
    pool_hash: str,
    *,
    top_k: int = 20,
    fractions: tuple[float, ...] = config.DEFAULT_HAYSTACK,
) -> None:
    """Write queries/own/topk/haystack parquet + meta.json for a (n_queries, n_pool) score
    matrix (haystack levels seeded as the scorer's: background = windows of no fact)."""
    folder.mkdir(parents=True, exist_ok=True)
    qrows, orows, trows = [], [], []
    for qi, qid in enumerate(query_ids):
        fid, form = qid.split(":")
        row = scores[qi].astype(np.float64)
        deg = metrics.degenerate(row) or ""
        mean = float(row.mean()) if np.isfinite(row).all() else NAN
        std = float(row.std()) if np.isfinite(row).all() else NAN
        qrows.append((qid, fid, form, mean, std, row.size, deg))
        own = window_fact == fid
        if own.any():
            g, t = counts_above_and_tied(row, own)
            for w, s, gi, ti in zip(windows[own], row[own], g, t, strict=True):
                orows.append((qid, fid, int(w), float(s), int(gi), int(ti)))
        key = np.where(np.isnan(row), -np.inf, row)
        order = np.argsort(-key, kind="stable")[:top_k]
        for r, i in enumerate(order, start=1):
            trows.append((qid, r, int(windows[i]), float(row[i])))
    qdf = pd.DataFrame(
        qrows, columns=["query_id", "fact_id", "form", "mean", "std", "n_pool", "degenerate"]
    )
    odf = pd.DataFrame(
        orows, columns=["query_id", "fact_id", "window", "score", "n_greater", "n_ties"]
    )
    tdf = pd.DataFrame(trows, columns=["query_id", "rank", "window", "score"])
    hdf = haystack_rows(query_ids, window_fact, scores, fractions)
    io.write_parquet(folder / "queries.parquet", qdf)
    io.write_parquet(folder / "own.parquet", odf.astype({"window": "int64"}))
    io.write_parquet(folder / "topk.parquet", tdf)
    io.write_parquet(folder / "haystack.parquet", hdf.assign(window=windows[hdf["window"]]))
    io.write_meta(
        folder,
        "scores",
        ["queries.parquet", "own.parquet", "topk.parquet", "haystack.parquet"],
        config_hash="test",
        inputs={"pool": pool_hash},
        info={"method": method, "model": model},
        code={"method": registry.code_hash(method)} if method in registry.available() else None,
    )


def haystack_rows(
    query_ids: list[str],
    window_fact: np.ndarray,
    scores: np.ndarray,
    fractions: tuple[float, ...],
) -> pd.DataFrame:
    """haystack.parquet rows by brute force, sorted by query, window, share (``window`` = the
    pool row; the caller maps it to the window index)."""
    table = pd.DataFrame({"kind": np.where(window_fact == "", "background", "planted")})
    levels = pool.haystack_levels({"seed": 0, "analysis": {"haystack": list(fractions)}}, table)
    rows = []
    for qi, qid in enumerate(query_ids):
        fid = qid.split(":")[0]
        own = window_fact == fid
        for j, f in enumerate(fractions, start=1):
            inside = levels <= j
            row = scores[qi, inside].astype(np.float64)
            finite = bool(np.isfinite(row).all())
            stats = (
                float(row.mean()) if finite else NAN,
                float(row.std()) if finite else NAN,
                metrics.degenerate(row) or "",
            )
            g, t = counts_above_and_tied(row, own[inside])
            size = (int((inside & (levels > 0)).sum()), int(inside.sum()))
            for w, sc, gi, ti in zip(np.flatnonzero(own), scores[qi, own], g, t, strict=True):
                rows.append((qi, qid, fid, int(w), f, *size, float(sc), int(gi), int(ti), *stats))
    cols = ["qi", "query_id", "fact_id", "window", "fraction", "n_background", "n_pool"]
    cols += ["score", "n_greater", "n_ties", "mean", "std", "degenerate"]
    df = pd.DataFrame(rows, columns=cols).sort_values(["qi", "window", "fraction"], kind="stable")
    ints = ("window", "n_background", "n_pool", "n_greater", "n_ties")
    return df.drop(columns="qi").astype(dict.fromkeys(ints, "int64")).reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# A synthetic study: facts, causal table, twins' lineage, pools
# --------------------------------------------------------------------------------------------


def make_facts(
    n_per_cell: int = 8,
    n_docs: tuple[int, ...] = (2, 8),
    seed: int = 0,
) -> pd.DataFrame:
    """Facts over domain x n_docs x position x reader with effect = length + difficulty + u."""
    gen = np.random.default_rng(seed)
    rows = []
    i = 0
    for domain in ("world", "python"):
        for nd in n_docs:
            for pos in ("early", "middle", "late"):
                for reader in MODELS:
                    for _ in range(n_per_cell):
                        length = int(gen.integers(2, 16))
                        difficulty = float(3.0 * length + gen.normal(0, 4))
                        u = float(gen.normal(0, 1))
                        effect = 0.15 * length + 0.05 * difficulty + u
                        rows.append(
                            {
                                "fact_id": f"F{i:04d}",
                                "domain": domain,
                                "entity_type": "x",
                                "relation": "r",
                                "n_docs": nd,
                                "position": pos,
                                "reader": reader,
                                "cell": f"{domain}/{nd}/{pos}/{reader}",
                                "answer": "a",
                                "answer_tokens": length,
                                "logp_reader": -difficulty + effect,
                                "logp_other": -difficulty,
                                "effect": effect,
                                "rank": 1 if effect > 0.5 else 2,
                                "learned": bool(effect > 0.5),
                                "difficulty": difficulty,
                                "final_loss": (difficulty - effect) / length,
                                "u": u,
                            }
                        )
                        i += 1
    df = pd.DataFrame(rows)
    df["n_docs"] = df["n_docs"].astype(np.int64)
    df["answer_tokens"] = df["answer_tokens"].astype(np.int64)
    df["rank"] = df["rank"].astype(np.int64)
    return df


class Study:
    """A results folder with the causal table, twins' metas and pools, ready for scores."""

    def __init__(self, root: Path, facts: pd.DataFrame, n_background: int = 60, seed: int = 1):
        self.root = root
        self.paths = Paths(str(root))
        self.facts = facts
        self.pool_hash: dict[str, str] = {}
        self.windows: dict[str, np.ndarray] = {}
        self.window_fact: dict[str, np.ndarray] = {}
        stream_hash = {}
        model_hash = {}
        for stage, folder in (
            ("facts", self.paths.facts),
            ("corpus", self.paths.corpus),
            ("tokenizer", self.paths.tokenizer),
        ):
            io.write_meta(folder, stage, [], config_hash="t")
        for m in MODELS:
            stream_hash[m] = io.write_meta(
                self.paths.stream(m), "stream", [], config_hash="t", info={"model": m}
            )["hash"]
            self.paths.model(m).mkdir(parents=True, exist_ok=True)
            (self.paths.model(m) / "loss.csv").write_text("step,tokens,loss\n0,0,5.0\n1,64,4.5\n")
            model_hash[m] = io.write_meta(
                self.paths.model(m),
                "pretrain",
                ["loss.csv"],
                config_hash="t",
                inputs={"stream": stream_hash[m]},
                info={"params": 1000, "tokens": 64, "final_loss": 4.5, "steps": 2},
            )["hash"]
            read = facts[facts["reader"] == m]
            wf = np.concatenate(
                [np.repeat(read["fact_id"].to_numpy(dtype=object), read["n_docs"].to_numpy())]
                + [np.array([""] * n_background, dtype=object)]
            )
            perm = np.random.default_rng([seed, ord(m)]).permutation(wf.size)
            self.window_fact[m] = wf[perm]
            self.windows[m] = np.arange(wf.size, dtype=np.int64) * 3 + 7
            self.pool_hash[m] = io.write_meta(
                analysis.pool_dir(self.paths, m),
                "pool",
                [],
                config_hash="t",
                inputs={"stream": stream_hash[m]},
            )["hash"]
        io.write_parquet(
            self.paths.causal / "facts.parquet", facts.drop(columns=["u"], errors="ignore")
        )
        io.write_meta(
            self.paths.causal,
            "causal",
            ["facts.parquet"],
            config_hash="t",
            inputs={"facts": "facts-hash", **{f"model_{m}": model_hash[m] for m in MODELS}},
        )

    def query_ids(self) -> list[str]:
        return [f"{f}:{form}" for f in self.facts["fact_id"] for form in FORMS]

    def add_method(self, method: str, score_fn: Any) -> dict[str, np.ndarray]:
        """score_fn(model, query_ids, window_fact) -> (n_queries, n_pool) matrix."""
        out = {}
        for m in MODELS:
            qids = self.query_ids()
            s = np.asarray(score_fn(m, qids, self.window_fact[m]), dtype=np.float64)
            write_scores(
                analysis.score_dir(self.paths, method, m),
                method,
                m,
                qids,
                self.windows[m],
                self.window_fact[m],
                s,
                self.pool_hash[m],
            )
            out[m] = s
        return out


def cfg_for(
    default_cfg: dict[str, Any], root: Path, methods: list[str], boot: int = 200
) -> dict[str, Any]:
    cfg = copy.deepcopy(default_cfg)
    cfg["results"] = str(root)
    cfg["methods"]["enabled"] = methods
    cfg["methods"]["plugins"] = []
    cfg["analysis"]["bootstrap"] = boot
    return cfg


def own_mask(qids: list[str], window_fact: np.ndarray) -> np.ndarray:
    facts = np.array([q.split(":")[0] for q in qids], dtype=object)
    return facts[:, None] == window_fact[None, :]


# Synthetic methods with known answers --------------------------------------------------------


def oracle(model: str, qids: list[str], wf: np.ndarray) -> np.ndarray:
    gen = np.random.default_rng(5)
    return own_mask(qids, wf) * 10.0 + gen.random((len(qids), wf.size))


def random_method(model: str, qids: list[str], wf: np.ndarray) -> np.ndarray:
    gen = np.random.default_rng([9, ord(model)])
    return np.round(gen.normal(size=(len(qids), wf.size)), 1)  # rounded: many ties


def target_method(target: dict[str, float], seed: int):
    """Own windows score around target[fact] (+1 offset); background N(0, 1)."""

    def fn(model: str, qids: list[str], wf: np.ndarray) -> np.ndarray:
        gen = np.random.default_rng([seed, ord(model)])
        s = gen.normal(size=(len(qids), wf.size))
        own = own_mask(qids, wf)
        t = np.array([target[q.split(":")[0]] for q in qids])
        s = np.where(own, t[:, None] + 0.01 * gen.normal(size=s.shape), s)
        return s

    return fn


# --------------------------------------------------------------------------------------------
# Exact ranks, AP and Recall@10 from own.parquet
# --------------------------------------------------------------------------------------------


def own_frame(scores: np.ndarray, own: np.ndarray, qid: str = "F0:completion") -> pd.DataFrame:
    g, t = counts_above_and_tied(scores, own)
    return pd.DataFrame(
        {
            "query_id": qid,
            "fact_id": qid.split(":")[0],
            "window": np.flatnonzero(own).astype(np.int64),
            "score": scores[own],
            "n_greater": g,
            "n_ties": t,
        }
    )


@pytest.mark.parametrize(
    ("scores", "own", "ranks"),
    [
        # perfect: own at the top
        ([5, 4, 3, 2, 1], [1, 1, 0, 0, 0], [1, 2]),
        # all at the bottom
        ([5, 4, 3, 2, 1], [0, 0, 0, 1, 1], [4, 5]),
        # a tie with non-own windows counts against the method
        ([3, 2, 2, 2, 1], [0, 1, 0, 0, 1], [4, 5]),
        # own windows tied with each other and with one other window
        ([2, 2, 2, 1, 0], [1, 1, 0, 0, 0], [2, 3]),
        # -inf is a number (rank 3); a NaN own window ranks below every number and after
        # the NaN non-own window it ties with
        ([NAN, 1, NAN, 0, -np.inf], [1, 0, 0, 0, 1], [3, 5]),
        # constant scores: own windows at the very bottom
        ([1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 0, 0], [5, 6]),
    ],
)
def test_own_ranks_exact(scores: list[float], own: list[int], ranks: list[int]) -> None:
    s = np.array(scores, dtype=float)
    o = np.array(own, dtype=bool)
    df = own_frame(s, o)
    got = np.sort(analysis.own_ranks(df))
    assert got.tolist() == ranks
    assert got.tolist() == metrics.relevant_ranks(s, o).tolist()


def test_own_ranks_random_against_metrics() -> None:
    gen = np.random.default_rng(3)
    for trial in range(200):
        n = int(gen.integers(2, 40))
        s = np.round(gen.normal(size=n), int(gen.integers(0, 2)))
        s[gen.random(n) < 0.1] = NAN
        o = gen.random(n) < 0.3
        if not o.any():
            o[0] = True
        df = own_frame(s, o, qid=f"F{trial}:question")
        ranks = np.sort(analysis.own_ranks(df))
        assert ranks.tolist() == metrics.relevant_ranks(s, o).tolist()
        ap = float(np.mean(np.arange(1, ranks.size + 1) / ranks))
        assert ap == pytest.approx(metrics.average_precision(s, o), abs=1e-12)


def test_own_ranks_rejects_inconsistent_counts() -> None:
    df = own_frame(np.array([3.0, 3.0, 1.0]), np.array([True, True, False]))
    df["n_ties"] = 0  # two own windows tied but each claims no tie
    with pytest.raises(ArtifactError, match="corrupt"):
        analysis.own_ranks(df)


def test_hand_made_ap_and_recall_through_the_whole_step(tmp_path: Path, default_cfg: dict) -> None:
    """Two facts; AP and Recall@10 computed by hand from the constructed pools."""
    facts = make_facts(n_per_cell=1, n_docs=(2, 128))
    st = Study(tmp_path, facts, n_background=20)
    big = facts[(facts["n_docs"] == 128) & (facts["reader"] == "A")]["fact_id"].iloc[0]

    def fn(model: str, qids: list[str], wf: np.ndarray) -> np.ndarray:
        own = own_mask(qids, wf)
        n_pool = wf.size
        base = np.tile(np.arange(n_pool, 0, -1, dtype=float), (len(qids), 1))  # distinct
        s = np.where(own, -1.0, base)  # every own window strictly at the bottom
        for i, q in enumerate(qids):
            if q == f"{big}:completion":
                s[i] = np.where(own[i], 1e6, base[i])  # perfect
            if q == f"{big}:question":
                s[i] = np.where(own[i], 0.0, 0.0)  # constant
        return s

    st.add_method("hand", fn)
    cfg = cfg_for(default_cfg, tmp_path, ["hand"])
    analysis.run(cfg, st.paths)
    pq = pd.read_parquet(tmp_path / "analysis" / "per_query.parquet").set_index("query_id")
    # perfect ranking of 128 own windows
    assert pq.loc[f"{big}:completion", "ap"] == 1.0
    assert pq.loc[f"{big}:completion", "recall_at_10"] == pytest.approx(10 / 128)
    # constant: 128 own at the bottom of pool n; AP = mean_j j / (n - 128 + j)
    n = int((st.window_fact["A"] != "").sum() + 20)
    j = np.arange(1, 129)
    assert pq.loc[f"{big}:question", "ap"] == pytest.approx(np.mean(j / (n - 128 + j)))
    assert pq.loc[f"{big}:question", "degenerate"] == "constant"
    assert np.isnan(pq.loc[f"{big}:question", "mass"])
    # a 2-document fact whose documents are at the bottom (tied with each other at -1)
    small = facts[(facts["n_docs"] == 2) & (facts["reader"] == "B")]["fact_id"].iloc[0]
    nb = st.window_fact["B"].size
    assert pq.loc[f"{small}:completion", "ap"] == pytest.approx((1 / (nb - 1) + 2 / nb) / 2)
    assert pq.loc[f"{small}:completion", "recall_at_10"] == 0.0


def test_analysis_matches_metrics_on_full_matrices(tmp_path: Path, default_cfg: dict) -> None:
    facts = make_facts(n_per_cell=2)
    st = Study(tmp_path, facts)
    full = st.add_method("rnd", random_method)
    cfg = cfg_for(default_cfg, tmp_path, ["rnd"])
    analysis.run(cfg, st.paths)
    pq = pd.read_parquet(tmp_path / "analysis" / "per_query.parquet")
    qids = st.query_ids()
    reader = facts.set_index("fact_id")["reader"]
    n_checked = 0
    for i, q in enumerate(qids):
        fid = q.split(":")[0]
        m = reader[fid]
        own = st.window_fact[m] == fid
        row = pq[(pq["query_id"] == q)].iloc[0]
        assert row["model"] == m
        assert row["ap"] == pytest.approx(metrics.average_precision(full[m][i], own), abs=1e-12)
        assert row["recall_at_10"] == pytest.approx(metrics.recall_at_k(full[m][i], own, 10))
        assert row["mass"] == pytest.approx(metrics.attributed_mass(full[m][i], own), abs=1e-9)
        n_checked += 1
    assert n_checked == len(pq) == 2 * len(facts)
    # retrieval.csv aggregates: per model and by n_docs
    ret = pd.read_csv(tmp_path / "analysis" / "retrieval.csv").set_index(["method", "model"])
    nd = facts.set_index("fact_id")["n_docs"]
    for m in MODELS:
        sub = pq[pq["model"] == m]
        assert ret.loc[("rnd", m), "ap"] == pytest.approx(sub["ap"].mean())
        assert ret.loc[("rnd", m), "n_queries"] == len(sub)
        for d in (2, 8):
            want = sub.loc[nd.loc[sub["fact_id"]].to_numpy() == d, "ap"].mean()
            assert ret.loc[("rnd", m), f"ap_{d}"] == pytest.approx(want)
    assert ret.loc[("rnd", "all"), "recall_at_10"] == pytest.approx(pq["recall_at_10"].mean())
    # per_fact mass = mean over the two forms
    pf = pd.read_parquet(tmp_path / "analysis" / "per_fact.parquet").set_index("fact_id")
    fid = facts["fact_id"].iloc[0]
    want = pq.loc[pq["fact_id"] == fid, "mass"].mean()
    assert pf.loc[fid, "mass"] == pytest.approx(want)


# --------------------------------------------------------------------------------------------
# Synthetic methods with known answers
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def study_with_methods(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Study, pd.DataFrame, float]:
    """Five synthetic methods graded once for the module (tests must not modify the tree)."""
    tmp_path = tmp_path_factory.mktemp("graded")
    default_cfg = config.load([ROOT / "config.yaml"])
    facts = make_facts(n_per_cell=10)
    st = Study(tmp_path, facts)
    gen = np.random.default_rng(11)
    f = facts.set_index("fact_id")
    noise = pd.Series(gen.normal(0, 0.5, len(f)), index=f.index)
    st.add_method("oracle", oracle)
    st.add_method("effect_noise", target_method((f["effect"] + noise).to_dict(), 1))
    length_noise = f["answer_tokens"] + pd.Series(gen.normal(0, 0.3, len(f)), index=f.index)
    st.add_method("length", target_method(length_noise.to_dict(), 2))
    st.add_method("constant", lambda m, q, wf: np.zeros((len(q), wf.size)))
    nan_fn = lambda m, q, wf: np.where(own_mask(q, wf), 1.0, NAN)  # noqa: E731
    st.add_method("nan", nan_fn)
    cfg = cfg_for(default_cfg, tmp_path, ["oracle", "effect_noise", "length", "constant", "nan"])
    t0 = time.perf_counter()
    analysis.run(cfg, st.paths)
    return st, facts, time.perf_counter() - t0


def test_known_answers(study_with_methods: tuple[Study, pd.DataFrame, float]) -> None:
    st, facts, _ = study_with_methods
    out = st.root / "analysis"
    ret = pd.read_csv(out / "retrieval.csv", keep_default_na=False, na_values=[""])
    ret = pd.read_csv(out / "retrieval.csv", dtype={"degenerate": str}, keep_default_na=False)
    ret = ret.set_index(["method", "model"])
    corr = pd.read_csv(out / "correlations.csv", dtype={"degenerate": str}, keep_default_na=False)
    corr = corr.set_index("method")
    num = lambda c, m: float(corr.loc[m, c]) if corr.loc[m, c] != "" else NAN  # noqa: E731

    # oracle: AP = 1 on both models and at every n_docs
    for m in (*MODELS, "all"):
        assert float(ret.loc[("oracle", m), "ap"]) == 1.0
        assert float(ret.loc[("oracle", m), "ap_2"]) == 1.0
    assert float(ret.loc[("oracle", "all"), "recall_at_10"]) == pytest.approx(
        np.mean([1.0 if d <= 10 else 10 / d for d in facts["n_docs"]])
    )
    # mass = effect + independent noise: clearly positive raw and controlled, CI above zero
    assert num("raw", "effect_noise") > 0.5
    assert num("controlled", "effect_noise") > 0.4
    assert num("controlled_lo", "effect_noise") > 0.2
    # mass = answer length: positive raw (effect depends on length), ~0 controlled
    assert num("raw", "length") > 0.3
    assert num("vs_length", "length") > 0.9
    assert abs(num("controlled", "length")) < 0.15
    assert num("controlled_lo", "length") < 0 < num("controlled_hi", "length")
    # the intervals contain their point estimates
    for m in ("effect_noise", "length"):
        for k in ("raw", "controlled"):
            assert num(f"{k}_lo", m) <= num(k, m) <= num(f"{k}_hi", m)
    # degenerate methods are reported, never dropped
    assert ret.loc[("constant", "all"), "degenerate"] == "constant"
    assert corr.loc["constant", "degenerate"] == "constant"
    assert np.isnan(num("raw", "constant"))
    assert int(corr.loc["constant", "n_facts"]) == 0
    assert ret.loc[("nan", "A"), "degenerate"] == "nan"
    assert corr.loc["nan", "degenerate"] == "nan"
    # NaN scores rank last: the own windows (1.0) are on top: AP = 1
    assert float(ret.loc[("nan", "all"), "ap"]) == 1.0
    assert corr.loc["oracle", "degenerate"] == ""
    # current loss check: numbers present for the non-degenerate methods
    assert np.isfinite(num("vs_final_loss", "effect_noise"))
    assert int(corr.loc["effect_noise", "n_learned"]) == int(facts["learned"].sum())
    # learned_grid.csv agrees with metrics.learned_grid
    lg = pd.read_csv(out / "learned_grid.csv", dtype={"n_docs": str})
    grid = metrics.learned_grid(facts)
    allrow = lg[(lg["n_docs"] == "All") & (lg["position"] == "All")].iloc[0]
    assert allrow["rate"] == pytest.approx(grid.rates.loc["All", "All"])
    assert allrow["n_facts"] == len(facts)


def test_per_fact_ranks_and_columns(study_with_methods: tuple[Study, pd.DataFrame, float]) -> None:
    st, facts, _ = study_with_methods
    pf = pd.read_parquet(st.root / "analysis" / "per_fact.parquet")
    assert len(pf) == 5 * len(facts)
    sub = pf[pf["method"] == "effect_noise"]
    # within-cell ranks are centred in every cell (both models pooled: 24 cells)
    means = sub.groupby(["domain", "n_docs", "position"])["rank_mass"].mean()
    assert len(means) == 12 and np.allclose(means, 0.0)
    raw = metrics.pearson(sub["rank_mass"], sub["rank_effect"])
    corr = pd.read_csv(st.root / "analysis" / "correlations.csv").set_index("method")
    assert raw == pytest.approx(corr.loc["effect_noise", "raw"])
    for c in ("mass_completion", "mass_question", "ap_completion", "ap_question", "learned"):
        assert c in pf.columns


def test_analysis_is_deterministic(
    study_with_methods: tuple[Study, pd.DataFrame, float], default_cfg: dict
) -> None:
    st, _, elapsed = study_with_methods  # its time is a benchmark's business, not a test's
    before = json.loads((st.root / "analysis" / "meta.json").read_text())
    cfg = cfg_for(default_cfg, st.root, ["oracle", "effect_noise", "length", "constant", "nan"])
    analysis.run(cfg, st.paths)
    after = json.loads((st.root / "analysis" / "meta.json").read_text())
    assert before["hash"] == after["hash"]


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_hash_mismatch_between_scores_and_causal(tmp_path: Path, default_cfg: dict) -> None:
    facts = make_facts(n_per_cell=1)
    st = Study(tmp_path, facts, n_background=5)
    st.add_method("rnd", random_method)
    cfg = cfg_for(default_cfg, tmp_path, ["rnd"])
    analysis.run(cfg, st.paths)  # consistent: fine
    # a pool built from another run's stream
    pool = analysis.pool_dir(st.paths, "B")
    io.write_meta(pool, "pool", [], config_hash="t", inputs={"stream": "0" * 32})
    st.pool_hash["B"] = json.loads((pool / "meta.json").read_text())["hash"]
    st.add_method("rnd", random_method)
    with pytest.raises(ArtifactError, match=r"pool/B/meta.json.*different runs") as err:
        analysis.run(cfg, st.paths)
    assert "\n" not in str(err.value)
    # scores made from a pool that is not the one on disk
    st2 = Study(tmp_path / "two", facts, n_background=5)
    st2.pool_hash["A"] = "f" * 32
    st2.add_method("rnd", random_method)
    with pytest.raises(ArtifactError, match=r"scores/rnd/A/meta.json.*pool"):
        analysis.run(cfg_for(default_cfg, tmp_path / "two", ["rnd"]), st2.paths)


def test_missing_and_corrupt_scores(tmp_path: Path, default_cfg: dict) -> None:
    facts = make_facts(n_per_cell=1)
    st = Study(tmp_path, facts, n_background=5)
    st.add_method("rnd", random_method)
    with pytest.raises(ArtifactError, match="scores/other/A"):
        analysis.run(cfg_for(default_cfg, tmp_path, ["rnd", "other"]), st.paths)
    own = analysis.score_dir(st.paths, "rnd", "A") / "own.parquet"
    df = pd.read_parquet(own)
    df.iloc[:3].to_parquet(own)
    with pytest.raises(ArtifactError, match="own.parquet"):
        analysis.run(cfg_for(default_cfg, tmp_path, ["rnd"]), st.paths)


def test_cell_without_learned_facts(tmp_path: Path, default_cfg: dict) -> None:
    from plantbench.report import sections

    facts = make_facts(n_per_cell=3)
    facts["learned"] = facts["learned"] & ~((facts["domain"] == "python") & (facts["n_docs"] == 2))
    st = Study(tmp_path, facts, n_background=10)
    st.add_method("rnd", random_method)
    meta = analysis.run(cfg_for(default_cfg, tmp_path, ["rnd"]), st.paths)
    assert meta["info"]["cells_without_learned"] == [
        "python/2/early",
        "python/2/late",
        "python/2/middle",
    ]
    text = sections.analysis_sections(st.paths)
    assert "python/2/early" in text
    # and no learned fact at all
    facts["learned"] = False
    st = Study(tmp_path / "none", facts, n_background=10)
    st.add_method("rnd", random_method)
    analysis.run(cfg_for(default_cfg, tmp_path / "none", ["rnd"]), st.paths)
    corr = pd.read_csv(tmp_path / "none" / "analysis" / "correlations.csv")
    assert np.isnan(corr.loc[0, "mass_learned"]) and np.isfinite(corr.loc[0, "mass_not_learned"])
    assert "No fact was learned in this run" in sections.analysis_sections(st.paths)


def test_cli_analysis(tmp_path: Path, default_cfg: dict, capsys: pytest.CaptureFixture) -> None:
    facts = make_facts(n_per_cell=1)
    st = Study(tmp_path, facts, n_background=5)
    st.add_method("rnd", random_method)
    cfg = cfg_for(default_cfg, tmp_path, ["rnd"])
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    assert cli.main(["analysis", "-c", str(cfg_path)]) == 0
    assert "analysis" in capsys.readouterr().out
    cfg["methods"]["enabled"] = ["rnd", "absent"]
    cfg_path.write_text(json.dumps(cfg))
    assert cli.main(["analysis", "-c", str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plantbench: error:") and "scores/absent/A" in err


# --------------------------------------------------------------------------------------------
# The report and the plug-in example
# --------------------------------------------------------------------------------------------


def test_report_tables_and_figures(
    study_with_methods: tuple[Study, pd.DataFrame, float], default_cfg: dict
) -> None:
    from plantbench.report import build, figures

    st, _, _ = study_with_methods
    cfg = cfg_for(default_cfg, st.root, ["oracle", "effect_noise", "length", "constant", "nan"])
    path = build.run(cfg, st.paths)
    text = path.read_text()
    for fig in figures.FIGURES:
        png = st.root / "report" / fig
        assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
        assert f"]({fig})" in text
    header = (
        "| Method | AP, model A | AP, model B | Recall@10 | AP, 2 documents | AP, 8 documents |"
    )
    assert header in text
    assert (
        "| Method | vs causal effect | vs length | vs difficulty | vs causal effect, controlled |"
        in text
    )
    # numbers in the report come from the csvs
    corr = pd.read_csv(st.root / "analysis" / "correlations.csv").set_index("method")
    r = corr.loc["effect_noise"]
    assert f"{r['controlled']:+.2f} [{r['controlled_lo']:+.2f}, {r['controlled_hi']:+.2f}]" in text
    assert "| oracle (plug-in) | 1.000 | 1.000 |" in text
    assert "constant (plug-in) (constant scores) | constant | constant |" in text
    assert "BM25 was not graded" in text
    # deterministic figures
    before = {f: (st.root / "report" / f).read_bytes() for f in figures.FIGURES}
    build.run(cfg, st.paths)
    assert all((st.root / "report" / f).read_bytes() == b for f, b in before.items())


def test_report_refuses_analysis_of_another_causal_table(
    study_with_methods: tuple[Study, pd.DataFrame, float], default_cfg: dict, tmp_path: Path
) -> None:
    import shutil

    from plantbench.report import build

    st, _, _ = study_with_methods
    root = tmp_path / "copy"
    shutil.copytree(st.root, root)
    meta_path = root / "analysis" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["inputs"]["causal"] = "0" * 32
    meta_path.write_text(json.dumps(meta))
    cfg = cfg_for(default_cfg, root, ["oracle"])
    with pytest.raises(ArtifactError, match="different 'causal'"):
        build.run(cfg, Paths(str(root)))


def test_oracle_plugin_example(tmp_path: Path, default_cfg: dict) -> None:
    """tests/plugins/oracle_method.py through the registry's plug-in loader, graded: AP = 1."""
    from types import SimpleNamespace

    from plantbench.attribution.methods import registry

    path = Path(__file__).parent / "plugins" / "oracle_method.py"
    method = registry.load_plugin("oracle_example", path)
    assert method.needs == ()
    facts = make_facts(n_per_cell=2)
    st = Study(tmp_path, facts)

    def via_plugin(model: str, qids: list[str], wf: np.ndarray) -> np.ndarray:
        kind = np.where(wf == "", "background", "planted")
        pool = pd.DataFrame({"row": np.arange(wf.size), "kind": kind, "fact_id": wf})
        queries = pd.DataFrame({"query_id": qids, "fact_id": [q.split(":")[0] for q in qids]})
        ctx = SimpleNamespace(pool=pool, queries=queries, cache={})
        # the scoring engine calls it in tiles: do the same, with uneven tiles
        q_rows = np.arange(len(qids))
        p_rows = np.arange(wf.size)
        rows = [
            np.concatenate([method.score(ctx, qb, pb) for pb in np.array_split(p_rows, 3)], axis=1)
            for qb in np.array_split(q_rows, 4)
        ]
        return np.concatenate(rows, axis=0)

    st.add_method("oracle_example", via_plugin)
    analysis.run(cfg_for(default_cfg, tmp_path, ["oracle_example"]), st.paths)
    ret = pd.read_csv(tmp_path / "analysis" / "retrieval.csv").set_index(["method", "model"])
    for m in (*MODELS, "all"):
        assert ret.loc[("oracle_example", m), "ap"] == 1.0
    pf = pd.read_parquet(tmp_path / "analysis" / "per_fact.parquet")
    assert (pf["mass"] > 0).all()
