"""The context suite's section of the study report (nothing when the suite has not run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from plantbench import io
from plantbench.markdown import markdown_table, num
from plantbench.paths import Paths

FIGURES = {"shift.png": "context_shift.png", "ssp.png": "context_ssp.png"}
SEED_TABLE1 = (
    "The seed's Llama-3-8B row for comparison (CAC; BCS at k = 1 / 2 / 3; APS at k = 1): "
    "ContextCite 0.42; 0.38 / 0.38 / 0.56; 0.40 — TokenShapley 0.43; 0.16 / 0.33 / 0.13; 0.23 — "
    "AttriBoT 0.36; 0.31 / 0.50 / 0.43; 0.33 — TracLLM 0.36; 0.61 / 0.43 / 0.53; 0.45. "
    "Its SSP is 0.50–0.52 for every method."
)


def _table(df: pd.DataFrame) -> str:
    return markdown_table(df.map(lambda v: v if isinstance(v, str) else num(v, "{:.2f}")))


def section(paths: Paths, out_dir: Path) -> tuple[str, dict[str, str], list[str]]:
    """(markdown, input hashes, figures copied into the report folder)."""
    folder = paths.context("analysis")
    if not (folder / io.META).is_file():
        return "", {}, []
    meta = io.read_meta(folder, "context_analysis")
    t1 = pd.read_csv(folder / "table1.csv")
    t2 = pd.read_csv(folder / "table2.csv")
    ssp = pd.read_csv(folder / "ssp.csv")
    acc = pd.read_csv(folder / "accuracy.csv")
    greedy = acc[acc["reading"] == "greedy"].set_index(["role", "condition"])["value"]
    acc = acc[acc["reading"] == "rank"].set_index(["role", "condition"])["value"]
    for src, dst in FIGURES.items():
        shutil.copyfile(folder / src, out_dir / dst)
    cells = pd.read_csv(folder / "by_cell.csv")
    delta = acc[("base", "full")] - acc[("base", "none")]
    text = [
        "## Context attribution under in-weight overlap (seed 000)",
        "",
        f"{meta['info']['facts']} facts, both query forms, each with a context of its own "
        "sentence and other facts' sentences (`results/context/`). The base twin never read the "
        "fact, the reader did. Accuracy = the true answer ranks first of the candidates. "
        f"Base twin: {acc[('base', 'none')]:.1%} without context, {acc[('base', 'full')]:.1%} "
        f"with the full context (Δ = {delta:+.1%}); reader: {acc[('reader', 'none')]:.1%} / "
        f"{acc[('reader', 'full')]:.1%}. Util and RmI divide by Δ, so they are only as "
        "meaningful as the base twin's reading (see the in-context check above). Read as "
        "greedy decoding reproducing the answer exactly: base "
        f"{greedy[('base', 'none')]:.1%} / {greedy[('base', 'full')]:.1%}, reader "
        f"{greedy[('reader', 'none')]:.1%} / {greedy[('reader', 'full')]:.1%} "
        "(`metrics.csv`, metrics `*_greedy`).",
        "",
        "Table 1 layout (CAC at the first RBO persistence; Util, RmI, BCS, APS per k):",
        "",
        _table(t1),
        "",
        SEED_TABLE1,
        "",
        "Likelihood metrics (Drop@k in nats, capped at the segment count; LDS = Spearman):",
        "",
        _table(t2),
        "",
        f"Source separation precision on the {int(ssp['facts'].iloc[0])} learned facts: the "
        "fact's own sentence, the one segment that carries the answer, labelled by each "
        "method's interface under the reader (truly in-weight) and under the base twin (truly "
        f"in-context), {int(ssp['segments'].iloc[0])} labels, balanced; chance 0.5 (as in the "
        "seed, whose segments all carry the answer; other facts' sentences are not scored):",
        "",
        _table(ssp[["method", "ssp", "lo", "hi"]]),
        "",
        "![context SSP](context_ssp.png)",
        "",
        "CAC by documents per fact (facts of all positions; `by_cell.csv` has each position):",
        "",
        _table(by_n_docs(cells)),
        "",
        "Score of the fact's own segment under the base twin and the reader (the seed's Figure 3):",
        "",
        "![context score shift](context_shift.png)",
        "",
    ]
    return "\n".join(text), {"context": meta["hash"]}, list(FIGURES.values())


def by_n_docs(cells: pd.DataFrame) -> pd.DataFrame:
    """CAC per method and documents per fact, the positions pooled (weighted by facts)."""
    w = cells.assign(weighted=cells["cac"] * cells["facts"])
    g = w.groupby(["method", "n_docs"], sort=False)[["weighted", "facts"]].sum()
    t = (g["weighted"] / g["facts"]).unstack("n_docs")
    t.columns = [f"{c} docs" for c in t.columns]
    return t.reset_index()
