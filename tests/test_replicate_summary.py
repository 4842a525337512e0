"""Tests for plantbench.grading.replicate_summary on three hand-made analysis folders with known answers.

The replicates are built so that: the pooled learned rate at 2 documents is 10%, 20%, 15%; in
model A replicate 2 swaps bm25 and embedding (so 2 of the 3 method pairs keep their order) while
model B and the pooled model keep one order (B through an AP tie broken by name); bm25's
controlled interval excludes zero everywhere, embedding's in replicates 0 and 1 only, and
grad_dot's bounds are NaN everywhere.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from plantbench import io
from plantbench.errors import ArtifactError
from plantbench.grading import replicate_summary

NAN = float("nan")
METHODS = ("bm25", "embedding", "grad_dot")
CORR_COLUMNS = (
    "method,raw,raw_lo,raw_hi,vs_length,vs_length_lo,vs_length_hi,vs_difficulty,"
    "vs_difficulty_lo,vs_difficulty_hi,controlled,controlled_lo,controlled_hi,n_boot_nan,"
    "vs_final_loss,vs_final_loss_within,mass_learned,mass_not_learned,n_learned,n_not_learned,"
    "n_facts,n_facts_total,degenerate"
).split(",")
ALL_RATE = (0.10, 0.20, 0.15)  # learned rate at n_docs=2, position All, per replicate
AP_A = (
    {"bm25": 0.9, "embedding": 0.8},
    {"bm25": 0.9, "embedding": 0.8},
    {"bm25": 0.8, "embedding": 0.9},
)
CONTROLLED = {  # per replicate: (estimate, lo, hi)
    "bm25": [(-0.3, -0.5, -0.1), (-0.2, -0.4, -0.05), (-0.1, -0.2, -0.01)],
    "embedding": [(0.3, 0.1, 0.5), (0.2, 0.05, 0.4), (0.1, -0.1, 0.3)],
    "grad_dot": [(0.0, NAN, NAN)] * 3,
}


def _learned(r: int) -> pd.DataFrame:
    rows = []
    for n_docs in ("8", "2", "All"):
        for pos in ("early", "middle", "late", "All"):
            rate = ALL_RATE[r] if (n_docs, pos) == ("2", "All") else 0.5 + 0.01 * r
            rows.append({"n_docs": n_docs, "position": pos, "n_facts": 20, "rate": rate})
    df = pd.DataFrame(rows)
    df["n_learned"] = (df["rate"] * df["n_facts"]).round().astype(int)
    df = df[["n_docs", "position", "n_facts", "n_learned", "rate"]]
    return df.iloc[::-1] if r == 1 else df  # replicate 1's file lists the rows the other way


def _retrieval(r: int) -> pd.DataFrame:
    ap = {
        "A": {**AP_A[r], "grad_dot": 0.7},
        "B": {"bm25": 1.0, "embedding": 1.0, "grad_dot": 0.5 + 0.1 * r},  # tie: bm25 first
        "all": {"bm25": 0.95, "embedding": 0.9 - 0.01 * r, "grad_dot": 0.6},
    }
    rows = []
    for m in METHODS:
        for model, by in ap.items():
            rows.append(
                {
                    "method": m,
                    "model": model,
                    "ap": by[m],
                    "recall_at_10": 0.5 + 0.1 * r,
                    "ap_2": by[m],
                    "ap_8": by[m],
                    "n_queries": 24,
                    "degenerate": "",
                }
            )
    return pd.DataFrame(rows)


def _correlations(r: int) -> pd.DataFrame:
    rows = []
    for m in METHODS:
        row = dict.fromkeys(CORR_COLUMNS, NAN)
        est, lo, hi = CONTROLLED[m][r]
        row.update(method=m, controlled=est, controlled_lo=lo, controlled_hi=hi, degenerate="")
        row.update(n_facts=10, n_facts_total=12)
        rows.append(row)
    return pd.DataFrame(rows, columns=CORR_COLUMNS)


def _analysis(folder: Path, r: int) -> Path:
    folder.mkdir(parents=True)
    tables = {
        "learned_grid.csv": _learned(r),
        "retrieval.csv": _retrieval(r),
        "correlations.csv": _correlations(r),
    }
    for name, df in tables.items():
        (folder / name).write_text(df.to_csv(index=False, float_format="%.10g"))
    io.write_meta(folder, "analysis", list(tables), config_hash="x")
    return folder


@pytest.fixture
def folders(tmp_path: Path) -> list[Path]:
    return [_analysis(tmp_path / f"rep {r}" / "analysis", r) for r in range(3)]


def test_learned_rate_spread_and_row_order(folders):
    table = replicate_summary.learned_table(replicate_summary.read(folders)["learned_grid"])
    row = table[(table["n_docs"] == "2") & (table["position"] == "All")].iloc[0]
    assert row["rate_mean"] == pytest.approx(0.15)
    assert (row["rate_min"], row["rate_max"]) == (pytest.approx(0.10), pytest.approx(0.20))
    assert [row[f"rate_r{r}"] for r in range(3)] == pytest.approx(list(ALL_RATE))
    assert list(table["n_docs"][:4]) == ["8"] * 4  # replicate 0's order, not replicate 1's
    assert list(table["position"][:4]) == ["early", "middle", "late", "All"]
    assert len(table) == 12


def test_retrieval_spread(folders):
    table = replicate_summary.retrieval_table(replicate_summary.read(folders)["retrieval"])
    row = table.set_index(["method", "model"]).loc[("bm25", "A")]
    assert row["ap_mean"] == pytest.approx((0.9 + 0.9 + 0.8) / 3)
    assert (row["ap_min"], row["ap_max"]) == (pytest.approx(0.8), pytest.approx(0.9))
    assert row["recall_at_10_max"] == pytest.approx(0.7)
    assert list(table["method"][:3]) == ["bm25"] * 3


def test_correlation_verdicts(folders):
    table = replicate_summary.correlation_table(replicate_summary.read(folders)["correlations"])
    t = table.set_index("method")
    assert t.loc["bm25", "excludes_zero"] == "yes/yes/yes"
    assert t.loc["bm25", "verdict"] == "excludes zero in every replicate"
    assert bool(t.loc["bm25", "stable"])
    assert t.loc["bm25", "controlled_mean"] == pytest.approx(-0.2)
    assert t.loc["embedding", "excludes_zero"] == "yes/yes/no"
    assert t.loc["embedding", "verdict"] == "unstable"
    assert not bool(t.loc["embedding", "stable"])
    assert t.loc["grad_dot", "excludes_zero"] == "none/none/none"  # NaN bounds: no interval
    assert t.loc["grad_dot", "verdict"] == replicate_summary.NOT_ESTIMABLE


def test_ordering_swap_is_unstable(folders):
    table = replicate_summary.ordering_table(replicate_summary.read(folders)["retrieval"])
    t = table.set_index("model")
    assert list(t.index) == ["A", "B", "all"]
    assert t.loc["A", "order_r0"] == "bm25 > embedding > grad_dot"
    assert t.loc["A", "order_r2"] == "embedding > bm25 > grad_dot"
    assert not bool(t.loc["A", "stable"])
    assert t.loc["A", "top"] == "differs"
    assert t.loc["A", "pairs_stable"] == pytest.approx(2 / 3)
    assert bool(t.loc["B", "stable"]) and t.loc["B", "top"] == "bm25"  # the tie, by name
    assert t.loc["B", "pairs_stable"] == 1.0


def test_summarize_writes_tables_and_lineage(folders, tmp_path):
    out = tmp_path / "replicates"
    meta = replicate_summary.summarize(folders, out, config_hash="c")
    assert sorted(meta["files"]) == sorted(replicate_summary.OUTPUTS)
    assert all((out / name).is_file() for name in replicate_summary.OUTPUTS)
    expected = {f"analysis/{r}": io.read_meta(f, "analysis")["hash"] for r, f in enumerate(folders)}
    assert meta["inputs"] == expected and len(set(expected.values())) == 3
    assert io.read_meta(out, "replicates")["hash"] == meta["hash"]
    assert meta["info"] == {
        "replicates": 3,
        "stable_verdicts": 2,
        "unstable_verdicts": ["embedding"],
        "stable_orderings": ["B", "all"],
    }
    learned = pd.read_csv(out / "learned.csv", dtype={"n_docs": str})
    row = learned[(learned["n_docs"] == "2") & (learned["position"] == "All")].iloc[0]
    assert math.isclose(row["rate_mean"], 0.15)


def test_missing_csv_names_the_folder(folders, tmp_path):
    (folders[1] / "retrieval.csv").unlink()
    with pytest.raises(ArtifactError, match=re.escape(str(folders[1]))) as err:
        replicate_summary.summarize(folders, tmp_path / "replicates", config_hash="c")
    assert "replicate 1" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "replicates").exists()


def test_markdown_section(folders, tmp_path):
    out = tmp_path / "replicates"
    replicate_summary.summarize(folders, out, config_hash="c")
    md = replicate_summary.markdown(out, 3)
    assert md.startswith("## Over 3 replicates\n")
    assert "| 2 | 15% [10%, 20%] |" in md
    assert "0.867 [0.800, 0.900]" in md  # bm25, model A
    assert "-0.20 [-0.30, -0.10] | yes/yes/yes | excludes zero in every replicate |" in md
    assert "yes/yes/no | unstable |" in md
    assert "67% of method pairs keep their order" in md
