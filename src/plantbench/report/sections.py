"""The study report's sections as markdown: grading (from results/analysis/), the in-context check
and the recipe line (from results/causal/), fidelity, and the summary over replicates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.errors import ArtifactError
from plantbench.markdown import markdown_table, method_label, pct
from plantbench.paths import MODELS, Paths
from plantbench.report import figures, tables


def findings_section(found: pd.DataFrame) -> str:
    """The report's first section: the seeds' findings checked on this run
    (:mod:`plantbench.grading.findings`), the verdict counts and where each line comes from."""
    from plantbench.grading import findings

    over = found["holds"].astype(bool).any()
    lines = [
        "## Findings against the papers",
        "",
        "Each seed's findings, stated once (`src/plantbench/grading/findings/`) and checked on "
        "this run's own tables: reproduced when the whole 95% interval lies on the finding's "
        "side of its line, not reproduced when it lies wholly on the other side, inconclusive "
        "when it straddles or touches the line, not testable when the run lacks a method, a "
        "suite or a number the finding needs. A finding about several methods or twins holds "
        "only if it holds for each; the number shown is the one that decides."
        + (
            " Holds: in how many replicates it is reproduced, each on its own tables."
            if over
            else ""
        )
        + " Data: `report/findings.csv`.",
        "",
        markdown_table(tables.findings_table(found)),
        "",
        findings.verdict_counts(found) + ".",
        "",
        "Where the lines come from (the seeds' words; none is fitted to this project's numbers):",
        "",
        *[f"- `{r.id}` ({r.line}): {r.line_from}" for r in found.itertuples(index=False)],
        "",
    ]
    return "\n".join(lines)


def read_analysis(paths: Paths) -> dict[str, pd.DataFrame]:
    folder = paths.analysis
    meta = io.read_meta(folder, "analysis")
    if "haystack.csv" not in meta["files"]:
        raise ArtifactError(
            f"'{folder / io.META}' does not list haystack.csv (an analysis of an older version); "
            "rerun the analysis step"
        )
    opts: dict[str, Any] = {"dtype": {"degenerate": str}, "keep_default_na": False, "na_values": []}
    ret = pd.read_csv(folder / "retrieval.csv", **opts)
    corr = pd.read_csv(folder / "correlations.csv", **opts)
    for df in (ret, corr):
        for c in df.columns:
            if c not in ("method", "model", "degenerate"):
                df[c] = pd.to_numeric(df[c].replace("", np.nan))
    grid = pd.read_csv(folder / "learned_grid.csv", dtype={"n_docs": str, "position": str})
    per_fact = io.read_parquet(folder / "per_fact.parquet")
    hay = pd.read_csv(folder / "haystack.csv", **opts)
    for c in ("fraction", "ap", "mass"):
        hay[c] = pd.to_numeric(hay[c].replace("", np.nan))
    return {
        "retrieval": ret,
        "correlations": corr,
        "learned_grid": grid,
        "per_fact": per_fact,
        "haystack": hay,
    }


def _cell_sizes(per_fact: pd.DataFrame) -> str:
    sizes = per_fact.groupby(["method", "domain", "n_docs", "position"]).size()
    lo, hi = int(sizes.min()), int(sizes.max())
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def analysis_sections(paths: Paths, out_dir: Path | None = None, *, paper: bool = False) -> str:
    """Markdown for the grading sections; with ``out_dir``, also write the figures there
    (``paper``: the seed's correlations drawn beside ours)."""
    a = read_analysis(paths)
    ret, corr, grid, per_fact = a["retrieval"], a["correlations"], a["learned_grid"], a["per_fact"]
    meta = io.read_meta(paths.analysis, "analysis", verify=False)
    info = meta["info"]
    if out_dir is not None:
        figures.learned_heatmap(grid, out_dir / "learned_rate.png")
        figures.ap_figure(ret, out_dir / "ap_by_n_docs.png")
        figures.mass_figure(corr, out_dir / "mass_vs_effect.png", paper)
        figures.scatter_figure(per_fact, out_dir / "mass_raw_scatter.png")
    lines = [
        *_learned_lines(info, per_fact),
        *_finding_lines(ret),
        *_haystack_lines(a["haystack"]),
        *_mass_lines(corr, per_fact, info),
        *_current_loss_lines(corr),
        *_degenerate_notes(corr),
    ]
    return "\n".join(lines)


def _learned_lines(info: dict[str, Any], per_fact: pd.DataFrame) -> list[str]:
    """The learned-rate figure and a note on the within-cell cells without a learned fact."""
    lines = [
        "![learned rate](learned_rate.png)",
        "",
    ]
    empty = info.get("cells_without_learned", [])
    if empty:
        n_cells = per_fact.groupby(["domain", "n_docs", "position"]).ngroups
        lines += [
            f"No fact was learned in {len(empty)} of the {n_cells} within-cell analysis cells "
            f"(domain/documents/position): {', '.join(empty)}. Their facts still enter the "
            "within-cell correlations (mass and effect are ranked within every cell); only the "
            "learned-vs-not-learned comparison below has nothing from them on the learned side.",
            "",
        ]
    return lines


def _finding_lines(ret: pd.DataFrame) -> list[str]:
    """Finding the documents: the retrieval table, the BM25 sanity check, the AP figure."""
    lines = [
        "## Finding the documents",
        "",
        "For every query (two forms per fact) on the model that read the fact, the average "
        "precision of the fact's own planted windows in that model's pool ranking (ties count "
        "against the method). Recall@10 = share of a fact's own windows in the top 10 (at most "
        "10 / documents per fact). Data: `analysis/retrieval.csv`.",
        "",
        markdown_table(tables.retrieval_table(ret)),
        "",
    ]
    pooled = ret[ret["model"] == "all"].set_index("method")
    if "bm25" in pooled.index:
        ap = float(pooled.loc["bm25", "ap"])
        verdict = (
            "as expected: invented names appear only in their own fact's documents"
            if ap >= 0.9
            else "below the 0.9 expected for invented names: check the pool and the stream"
        )
        lines += [
            f"Sanity check: BM25 keyword search finds each fact's documents with AP {ap:.3f} "
            f"(seed: 0.995), {verdict}.",
            "",
        ]
    else:
        lines += ["Sanity check: BM25 was not graded in this run (not in `methods.enabled`).", ""]
    lines += [
        "![AP by method and documents per fact](ap_by_n_docs.png)",
        "",
    ]
    return lines


def _haystack_lines(hay: pd.DataFrame) -> list[str]:
    """AP as the haystack grows: the haystack table."""
    return [
        "## AP as the haystack grows",
        "",
        "AP (model A / model B) in nested sub-pools: every planted and distractor window and a "
        "growing seeded share of the pool's background windows, each sub-pool holding the one "
        "before; the last column is the whole pool, as in the table above. AP falls as "
        "background is added, so read a small run against a 100,000-window pool (the paper "
        "preset's) by this trend, not by its whole-pool AP alone. Data: "
        "`analysis/haystack.csv`.",
        "",
        markdown_table(tables.haystack_table(hay)),
        "",
    ]


def _mass_lines(corr: pd.DataFrame, per_fact: pd.DataFrame, info: dict[str, Any]) -> list[str]:
    """Did the documents that mattered get the mass: the correlation table and figure."""
    return [
        "## Did the documents that mattered get the mass?",
        "",
        "Attributed mass = mean standardized score (z over the pool for that query) of the fact's "
        "own windows, averaged over the two forms. Every variable is ranked within the "
        f"{per_fact.groupby(['domain', 'n_docs', 'position']).ngroups} cells domain x documents "
        "x position (both models pooled); correlations are Pearson on those ranks; controlled = "
        "partial correlation of mass and effect given answer length and difficulty. "
        f"{100 * (1 - float(info['alpha'])):.0f}% intervals: {info['bootstrap']} bootstrap "
        "resamples of facts within cells (seeded). Data: `analysis/correlations.csv`.",
        "",
        markdown_table(tables.correlation_table(corr)),
        "",
        "n/a: undefined (the mass does not vary within cells, as for an oracle whose mass "
        "depends only on the number of documents, or too few facts). Cells hold "
        f"{_cell_sizes(per_fact)} facts.",
        "",
        "Each method's raw (grey) and controlled (blue) correlation with its 95% interval, "
        "sorted by the controlled one (with the paper's config, the seed's values beside ours, "
        "open markers):",
        "",
        "![mass vs effect](mass_vs_effect.png)",
        "",
        "Raw attributed mass against raw causal effect (learned facts in orange):",
        "",
        "![raw mass vs raw effect](mass_raw_scatter.png)",
        "",
    ]


def _current_loss_lines(corr: pd.DataFrame) -> list[str]:
    """Current loss: the mass against the reading model's final loss on the fact."""
    lines = [
        "## Current loss",
        "",
        "Does a method's mass track how badly the finished reading model still answers the fact "
        "(its mean per-token loss on the answer) rather than what the documents did? The first "
        "column is the plain Pearson correlation across all facts (the seed's +0.73 for "
        "influence functions), the second the same on within-cell ranks. Mean mass is over "
        "learned and not-learned facts (number of facts). Data: `analysis/correlations.csv`.",
        "",
        markdown_table(tables.current_loss_table(corr)),
        "",
    ]
    if not (corr["n_learned"] > 0).any():
        lines += ["No fact was learned in this run, so there is no learned-facts mean.", ""]
    return lines


def _degenerate_notes(corr: pd.DataFrame) -> list[str]:
    """A note per method with degenerate scores."""
    lines: list[str] = []
    degenerate = corr[corr["degenerate"] != ""]
    for _, r in degenerate.iterrows():
        lines += [
            f"Note: {method_label(r['method'])} produced degenerate scores ({r['degenerate']}): "
            "NaN scores rank last and ties count against the method in AP; such queries carry "
            f"no attributed mass ({int(r['n_facts'])} of {int(r['n_facts_total'])} facts graded).",
            "",
        ]
    return lines


def recipe_line(causal_meta: dict[str, Any]) -> str:
    """How well the twins memorize (the causal meta's ``info.recipe``), one paragraph."""
    r = causal_meta["info"].get("recipe")
    if not r:
        return ""
    return (
        f"Learned facts keep a mean answer loss of {r['learned_final_loss']:.2f} nats per token "
        f"under the twin that read them; the last position's facts with the most documents are "
        f"{pct(r['late_most_docs_learned'])} learned, the first position's "
        f"{pct(r['early_learned'])}. Within cells, the causal effect's rank correlation with "
        f"answer length is {r['effect_vs_answer_tokens']:+.2f} (the seed's mechanism: a fact "
        "memorized outright gains log-probability on every answer token).\n"
    )


def in_context_section(paths: Paths, causal_meta: dict[str, Any]) -> str:
    """The in-context check of the answer key (causal/in_context.parquet)."""
    from plantbench.truth import in_context

    if in_context.TABLE not in causal_meta["files"]:
        return ""
    tab = io.read_parquet(paths.causal / in_context.TABLE)
    k = int(causal_meta["info"].get("context_segments", 0))
    cands = io.read_parquet(paths.facts / "candidates.parquet")
    n_cand = int(cands.groupby("fact_id").size().max())
    return "\n".join(
        [
            "## Do the twins read their context?",
            "",
            f"Each fact's query with a context of {k} segments before it (one per line, no "
            "markup): the fact's own sentence among other facts' sentences. Reading rate = the "
            "true answer ranks first of the candidates; following rate = with the fact's "
            "sentence stating a wrong candidate instead (counterfactual), that candidate ranks "
            f"first. Chance is one in {n_cand} candidates ({pct(1 / n_cand)}).",
            "",
            markdown_table(tables.in_context_table(in_context.rates(tab))),
            "",
        ]
    )


def sweep_lines(paths: Paths, metas: dict[str, dict[str, Any]]) -> list[str]:
    """The projection sweep (``fidelity.sweep``, ``fidelity.sketch_sweep``) as a table:
    projection, D, store per window, and the gradient dot product's fidelity per twin, after the
    study's own row; nothing without a sweep."""
    sweeps = {m: io.read_parquet(paths.fidelity(m) / "sweep.parquet") for m in metas}
    if all(t.empty for t in sweeps.values()):
        return []
    first = next(t for t in sweeps.values() if not t.empty)
    info = next(iter(metas.values()))["info"]
    own = {
        "projection": f"{tables.projection_label(info)} (this study's gradients)",
        "D": f"{int(info['projected_dims']):,}",
        "store per window": f"{int(info['projected_dims']) * 4 / 1024:,.0f} KiB",
        **{
            f"model {m}": tables.mean_range(meta["info"]["summary"].get("grad_dot"))
            for m, meta in metas.items()
        },
    }
    rows = [own]
    for i, r in first.iterrows():
        row = {
            "projection": tables.projection_label(r),
            "D": f"{int(r['dims']):,}",
            "store per window": f"{int(r['store_bytes_per_window']) / 1024:,.0f} KiB",
        }
        for m, t in sweeps.items():
            row[f"model {m}"] = tables.mean_range(t.iloc[i])
        rows.append(row)
    return [
        "The gradient dot product at other projections (`fidelity.sweep`, "
        "`fidelity.sketch_sweep`; the study's seed, float32, the same subset) next to the "
        "study's own: Spearman with the exact dot per query, mean [min, max].",
        "",
        markdown_table(pd.DataFrame(rows)),
        "",
    ]


def fidelity_section(paths: Paths) -> tuple[str, dict[str, str]]:
    """How much of the exact gradient ranking each gradient method keeps (plantbench.attribution.fidelity);
    nothing when the fidelity step has not run (no gradient method enabled)."""
    metas = {}
    for m in MODELS:
        if (paths.fidelity(m) / io.META).is_file():
            metas[m] = io.read_meta(paths.fidelity(m), "fidelity")
    if not metas or not any(meta["info"]["methods"] for meta in metas.values()):
        return "", {}
    info = next(iter(metas.values()))["info"]
    text = [
        "## Fidelity of the projected gradients",
        "",
        f"On {info['n_windows']} seeded pool windows and all {info['n_queries']} queries, the "
        f"exact float64 products of the unprojected gradients of all "
        f"{info['n_params']:,} block-linear weights at the final checkpoint "
        f"({info['checkpoint']}), against each gradient method's own scores "
        f"({info['projected_dims']:,} projected dims): Spearman per query, mean [min, max]. "
        "The gradient dot product's row is what the projection keeps; every other method is "
        "compared with the exact dot, so its gap to that row is what the method changes on "
        "purpose (checkpoints, curvature), not only what the projection loses.",
        "",
        markdown_table(
            tables.fidelity_rows(
                {m: meta["info"]["summary"] for m, meta in metas.items()}, info["methods"]
            )
        ),
        "",
        *sweep_lines(paths, metas),
    ]
    return "\n".join(text), {f"fidelity_{m}": meta["hash"] for m, meta in metas.items()}


def replicates_section(cfg: dict[str, Any], paths: Paths) -> tuple[str, dict[str, str]]:
    """The section over replicates (config ``replicates`` > 1) and its input hash; nothing
    for a single replicate."""
    from plantbench.grading import replicate_summary
    from plantbench.replicates import count

    n = count(cfg)
    if n < 2:
        return "", {}
    meta = io.read_meta(paths.replicate_summary, "replicates")
    return replicate_summary.markdown(paths.replicate_summary, n), {"replicates": meta["hash"]}
