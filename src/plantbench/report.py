"""The study report: results/report/report.md plus figures (matplotlib, Agg backend), and
report.html, the same markdown rendered to one self-contained HTML file (figures inlined) that
the Snakemake report shows on its main page (workflow/report/workflow.rst)."""

from __future__ import annotations

import base64
import html
import logging
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from . import io, metrics  # noqa: E402
from .config import study_hash  # noqa: E402
from .errors import ArtifactError  # noqa: E402
from .paths import MODELS, Paths  # noqa: E402

log = logging.getLogger(__name__)


HTML_NAME = "report.html"
HTML_STYLE = (
    ".plantbench-report table{border-collapse:collapse;margin:0.5em 0;font-size:0.85em}"
    ".plantbench-report th,.plantbench-report td{border:1px solid #ccc;padding:2px 6px;"
    "text-align:left;vertical-align:top}"
    ".plantbench-report .table{overflow-x:auto}"
    ".plantbench-report img{max-width:100%;height:auto}"
)
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`]+)`")


def markdown_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# report.md as HTML: the subset of markdown the report writes (headings, paragraphs, pipe tables,
# bullet lists, images, code spans), so report.html holds exactly what report.md holds
# --------------------------------------------------------------------------------------------


def _inline(text: str) -> str:
    return _CODE.sub(r"<code>\1</code>", html.escape(text, quote=False))


def _cells(line: str, tag: str) -> str:
    cells = line.strip().removeprefix("|").removesuffix("|").split("|")
    return "<tr>" + "".join(f"<{tag}>{_inline(c.strip())}</{tag}>" for c in cells) + "</tr>"


def _table_html(lines: list[str]) -> str:
    body = [_cells(x, "td") for x in lines[2:]]
    return (
        f'<div class="table"><table><thead>{_cells(lines[0], "th")}</thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _image_html(alt: str, src: str, folder: Path) -> str:
    data = base64.b64encode((folder / src).read_bytes()).decode()
    alt = html.escape(alt)
    return f'<figure><img src="data:image/png;base64,{data}" alt="{alt}" title="{alt}"></figure>'


def _block_html(lines: list[str], folder: Path) -> str:
    first = lines[0]
    heading = re.match(r"(#{1,6}) (.*)", first)
    if heading and len(lines) == 1:
        n = len(heading.group(1))
        return f"<h{n}>{_inline(heading.group(2))}</h{n}>"
    if first.startswith("|") and len(lines) > 1 and set(lines[1]) <= set("|-: "):
        return _table_html(lines)
    image = _IMAGE.fullmatch(first.strip())
    if image and len(lines) == 1:
        return _image_html(image.group(1), image.group(2), folder)
    if all(x.startswith("- ") for x in lines):
        return "<ul>" + "".join(f"<li>{_inline(x[2:])}</li>" for x in lines) + "</ul>"
    return f"<p>{_inline(' '.join(lines))}</p>"


def _blocks(md: str) -> list[list[str]]:
    blocks: list[list[str]] = [[]]
    for line in md.splitlines():
        if not line.strip():
            blocks.append([])
        elif re.match(r"#{1,6} ", line):
            blocks += [[line], []]
        else:
            blocks[-1].append(line)
    return [b for b in blocks if b]


def markdown_html(md: str, folder: Path) -> str:
    """report.md as a standalone HTML document; images (relative to ``folder``) are inlined."""
    body = "\n".join(_block_html(b, folder) for b in _blocks(md))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>plantbench study report</title>\n<style>{HTML_STYLE}</style>\n</head>\n"
        f'<body>\n<div class="plantbench-report">\n{body}\n</div>\n</body>\n</html>\n'
    )


def learned_table(facts: pd.DataFrame) -> pd.DataFrame:
    """The seed's learned-rate table as strings: documents per fact x position, with All."""
    grid = metrics.learned_grid(facts)
    rates, counts = grid.rates, grid.n_facts
    out = pd.DataFrame({"Documents per fact": [str(i) for i in rates.index]})
    for col in rates.columns:
        out[str(col).capitalize() if col != "All" else "All"] = [
            f"{100 * r:.0f}% ({int(n)})" if n else "-"
            for r, n in zip(rates[col], counts[col], strict=True)
        ]
    return out


def loss_figure(paths: Paths, out: Path) -> dict[str, pd.DataFrame]:
    curves = {m: pd.read_csv(paths.model(m) / "loss.csv") for m in MODELS}
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for m, df in curves.items():
        smooth = df["loss"].rolling(max(1, len(df) // 50), min_periods=1).mean()
        ax.plot(df["tokens"] / 1e6, smooth, label=f"model {m}", lw=1.2)
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel("training loss (nats/token, smoothed)")
    ax.set_title("Twin pretraining loss")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with io.atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    return curves


# --------------------------------------------------------------------------------------------
# The grading (reads results/analysis/*.csv written by `plantbench analysis`)
# --------------------------------------------------------------------------------------------

METHOD_LABELS = {
    "bm25": "BM25 keyword search",
    "embedding": "Embedding search",
    "hidden": "Hidden-state similarity",
    "grad_dot": "Gradient dot product",
    "grad_cos": "Gradient cosine",
    "tracin_dot": "TracIn, dot product",
    "tracin_influence": "TracIn, influence",
    "influence": "Influence functions",
    "ekfac": "EK-FAC influence",
    "tracin_ekfac": "TracIn, EK-FAC influence",
}
FIGURES = ("learned_rate.png", "ap_by_n_docs.png", "mass_vs_effect.png")


def method_label(name: str) -> str:
    return METHOD_LABELS.get(name, f"{name} (plug-in)")


def _save(fig: Any, out: Path) -> None:
    fig.tight_layout()
    with io.atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def _num(x: Any, fmt: str = "{:.3f}") -> str:
    v = float(x)
    return "n/a" if not np.isfinite(v) else fmt.format(v)


def _signed(x: Any) -> str:
    return _num(x, "{:+.2f}")


def _pct(x: Any) -> str:
    return _num(x, "{:.0%}")


def _ci(row: Any, key: str) -> str:
    return f"{_signed(row[key])} [{_signed(row[f'{key}_lo'])}, {_signed(row[f'{key}_hi'])}]"


def read_analysis(paths: Paths) -> dict[str, pd.DataFrame]:
    folder = paths.root / "analysis"
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


def _deg_note(deg: str) -> str:
    return f" ({deg} scores)" if deg else ""


def retrieval_table(ret: pd.DataFrame) -> pd.DataFrame:
    """The seed's retrieval table: AP per model, Recall@10 and AP at the smallest and largest
    n_docs (both models pooled), methods by pooled AP, best first."""
    levels = sorted(int(c[3:]) for c in ret.columns if c.startswith("ap_") and c[3:].isdigit())
    lo, hi = levels[0], levels[-1]
    pooled = ret[ret["model"] == "all"].set_index("method")
    by_model = ret.set_index(["method", "model"])
    order = pooled["ap"].fillna(-1.0).sort_values(ascending=False, kind="stable").index
    rows = []
    for m in order:
        p = pooled.loc[m]
        rows.append(
            {
                "Method": method_label(m) + _deg_note(p["degenerate"]),
                "AP, model A": _num(by_model.loc[(m, "A"), "ap"]),
                "AP, model B": _num(by_model.loc[(m, "B"), "ap"]),
                "Recall@10": _pct(p["recall_at_10"]),
                f"AP, {lo} documents": _num(p[f"ap_{lo}"], "{:.2f}"),
                f"AP, {hi} documents": _num(p[f"ap_{hi}"], "{:.2f}"),
            }
        )
    return pd.DataFrame(rows)


def _share(f: float) -> str:
    return f"{f:.0%}" if abs(100 * f - round(100 * f)) < 1e-9 else f"{100 * f:.1f}%"


def haystack_table(hay: pd.DataFrame) -> pd.DataFrame:
    """AP as the haystack grows: one row per method, one column per background share, cells
    "AP model A / AP model B" (``analysis/haystack.csv``)."""
    by = hay.set_index(["method", "model", "fraction"])
    fractions = sorted(hay["fraction"].unique())
    header = {}
    for f in fractions:
        n = " / ".join(
            f"{int(x):,}" for x in hay.loc[hay["fraction"] == f, "n_background"].unique()
        )
        header[f] = f"{_share(f)} of the background ({n} windows)"
    rows = []
    for m in dict.fromkeys(hay["method"]):
        row = {"Method": method_label(m)}
        for f in fractions:
            row[header[f]] = " / ".join(_num(by.loc[(m, x, f), "ap"]) for x in MODELS)
        rows.append(row)
    return pd.DataFrame(rows)


def correlation_table(corr: pd.DataFrame) -> pd.DataFrame:
    """The seed's correlation table; a method with no gradable fact shows its degenerate flag."""
    order = corr["controlled"].fillna(-9.0).sort_values(ascending=False, kind="stable").index
    rows = []
    for i in order:
        r = corr.loc[i]
        if int(r["n_facts"]) == 0:
            flag = r["degenerate"] or "no facts"
            cells = [flag] * 4
        else:
            cells = [_ci(r, "raw"), _signed(r["vs_length"]), _signed(r["vs_difficulty"])]
            cells.append(_ci(r, "controlled"))
        rows.append(
            {
                "Method": method_label(r["method"]) + _deg_note(r["degenerate"]),
                "vs causal effect": cells[0],
                "vs length": cells[1],
                "vs difficulty": cells[2],
                "vs causal effect, controlled": cells[3],
            }
        )
    return pd.DataFrame(rows)


def current_loss_table(corr: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for _, r in corr.iterrows():
        rows.append(
            {
                "Method": method_label(r["method"]) + _deg_note(r["degenerate"]),
                "mass vs final loss (Pearson, all facts)": _signed(r["vs_final_loss"]),
                "same, within-cell ranks": _signed(r["vs_final_loss_within"]),
                "mean mass, learned": (
                    f"{_num(r['mass_learned'], '{:+.2f}')} ({int(r['n_learned'])})"
                ),
                "mean mass, not learned": (
                    f"{_num(r['mass_not_learned'], '{:+.2f}')} ({int(r['n_not_learned'])})"
                ),
            }
        )
    return pd.DataFrame(rows)


def learned_heatmap(grid: pd.DataFrame, out: Path) -> None:
    rows = list(dict.fromkeys(grid["n_docs"]))
    cols = list(dict.fromkeys(grid["position"]))
    g = grid.set_index(["n_docs", "position"])
    rate = np.array([[g.loc[(r, c), "rate"] for c in cols] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 4), dpi=110)
    im = ax.imshow(np.ma.masked_invalid(rate), vmin=0.0, vmax=1.0, cmap="viridis")
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            n = int(g.loc[(r, c), "n_facts"])
            text = f"{rate[i, j]:.0%}\n({n})" if n else "-"
            colour = "white" if not np.isfinite(rate[i, j]) or rate[i, j] < 0.5 else "black"
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color=colour)
    ax.set_xticks(range(len(cols)), [c.capitalize() if c != "All" else c for c in cols])
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel("position in training")
    ax.set_ylabel("documents per fact")
    ax.set_title("Learned rate (number of facts)")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    _save(fig, out)


def ap_figure(ret: pd.DataFrame, out: Path) -> None:
    levels = sorted(int(c[3:]) for c in ret.columns if c.startswith("ap_") and c[3:].isdigit())
    pooled = ret[ret["model"] == "all"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for _, r in pooled.iterrows():
        ys = [float(r[f"ap_{d}"]) for d in levels]
        ax.plot(levels, ys, marker="o", lw=1.2, label=method_label(r["method"]))
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(d) for d in levels])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("documents per fact")
    ax.set_ylabel("average precision (both models)")
    ax.set_title("Finding each fact's own documents")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    _save(fig, out)


def mass_figure(per_fact: pd.DataFrame, corr: pd.DataFrame, out: Path) -> None:
    methods = corr["method"].tolist()
    ncol = min(4, max(1, len(methods)))
    nrow = int(np.ceil(len(methods) / ncol)) if methods else 1
    fig, axes = plt.subplots(
        nrow, ncol, figsize=(3.0 * ncol, 2.8 * nrow), dpi=110, squeeze=False, sharex=True
    )
    c = corr.set_index("method")
    for k, ax in enumerate(axes.ravel()):
        if k >= len(methods):
            ax.axis("off")
            continue
        m = methods[k]
        sub = per_fact[(per_fact["method"] == m) & per_fact["rank_mass"].notna()]
        if len(sub):
            colours = np.where(sub["learned"].to_numpy(dtype=bool), "tab:orange", "tab:blue")
            ax.scatter(sub["rank_effect"], sub["rank_mass"], s=8, c=colours, alpha=0.7, lw=0)
            ax.set_title(
                f"{method_label(m)}\nr={_signed(c.loc[m, 'raw'])}, "
                f"controlled {_signed(c.loc[m, 'controlled'])}",
                fontsize=8,
            )
        else:
            flag = c.loc[m, "degenerate"] or "no facts"
            ax.text(0.0, 0.0, flag, ha="center", va="center")
            ax.set_title(method_label(m), fontsize=8)
        ax.set_xlim(-0.55, 0.55)
        ax.set_ylim(-0.55, 0.55)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("causal effect (within-cell rank)", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("attributed mass (within-cell rank)", fontsize=7)
    fig.suptitle("Attributed mass vs causal effect (orange: learned facts)", fontsize=9)
    _save(fig, out)


def _cell_sizes(per_fact: pd.DataFrame) -> str:
    sizes = per_fact.groupby(["method", "domain", "n_docs", "position"]).size()
    lo, hi = int(sizes.min()), int(sizes.max())
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def analysis_sections(paths: Paths, out_dir: Path | None = None) -> str:
    """Markdown for the grading sections; with ``out_dir``, also write the figures there."""
    a = read_analysis(paths)
    ret, corr, grid, per_fact = a["retrieval"], a["correlations"], a["learned_grid"], a["per_fact"]
    meta = io.read_meta(paths.root / "analysis", "analysis", verify=False)
    info = meta["info"]
    if out_dir is not None:
        learned_heatmap(grid, out_dir / "learned_rate.png")
        ap_figure(ret, out_dir / "ap_by_n_docs.png")
        mass_figure(per_fact, corr, out_dir / "mass_vs_effect.png")
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
    lines += [
        "## Finding the documents",
        "",
        "For every query (two forms per fact) on the model that read the fact, the average "
        "precision of the fact's own planted windows in that model's pool ranking (ties count "
        "against the method). Recall@10 = share of a fact's own windows in the top 10 (at most "
        "10 / documents per fact). Data: `analysis/retrieval.csv`.",
        "",
        markdown_table(retrieval_table(ret)),
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
        "## AP as the haystack grows",
        "",
        "AP (model A / model B) in nested sub-pools: every planted and distractor window and a "
        "growing seeded share of the pool's background windows, each sub-pool holding the one "
        "before; the last column is the whole pool, as in the table above. AP falls as "
        "background is added, so read a small run against a 100,000-window pool (the paper "
        "preset's) by this trend, not by its whole-pool AP alone. Data: "
        "`analysis/haystack.csv`.",
        "",
        markdown_table(haystack_table(a["haystack"])),
        "",
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
        markdown_table(correlation_table(corr)),
        "",
        "n/a: undefined (the mass does not vary within cells, as for an oracle whose mass "
        "depends only on the number of documents, or too few facts). Cells hold "
        f"{_cell_sizes(per_fact)} facts.",
        "",
        "![mass vs effect](mass_vs_effect.png)",
        "",
        "## Current loss",
        "",
        "Does a method's mass track how badly the finished reading model still answers the fact "
        "(its mean per-token loss on the answer) rather than what the documents did? The first "
        "column is the plain Pearson correlation across all facts (the seed's +0.73 for "
        "influence functions), the second the same on within-cell ranks. Mean mass is over "
        "learned and not-learned facts (number of facts). Data: `analysis/correlations.csv`.",
        "",
        markdown_table(current_loss_table(corr)),
        "",
    ]
    if not (corr["n_learned"] > 0).any():
        lines += ["No fact was learned in this run, so there is no learned-facts mean.", ""]
    degenerate = corr[corr["degenerate"] != ""]
    for _, r in degenerate.iterrows():
        lines += [
            f"Note: {method_label(r['method'])} produced degenerate scores ({r['degenerate']}): "
            "NaN scores rank last and ties count against the method in AP; such queries carry "
            f"no attributed mass ({int(r['n_facts'])} of {int(r['n_facts_total'])} facts graded).",
            "",
        ]
    return "\n".join(lines)


def in_context_table(rates: pd.DataFrame) -> pd.DataFrame:
    """Reading and following rates: rows by query form, columns by twin role."""
    label = {"reader": "twin that read it", "other": "twin that never read it"}
    rows = []
    for r in rates.itertuples(index=False):
        rows.append(
            {
                "query form": "both" if r.form == "all" else r.form,
                "twin": label[r.role],
                "true answer first, no context": _pct(r.no_context_first),
                "reading rate (sentence in context)": _pct(r.reading_rate),
                "following rate (counterfactual)": _pct(r.following_rate),
                "log p gain from context (nats)": _signed(r.gain_nats),
            }
        )
    return pd.DataFrame(rows)


def recipe_line(causal_meta: dict[str, Any]) -> str:
    """How well the twins memorize (the causal meta's ``info.recipe``), one paragraph."""
    r = causal_meta["info"].get("recipe")
    if not r:
        return ""
    return (
        f"Learned facts keep a mean answer loss of {r['learned_final_loss']:.2f} nats per token "
        f"under the twin that read them; the last position's facts with the most documents are "
        f"{_pct(r['late_most_docs_learned'])} learned, the first position's "
        f"{_pct(r['early_learned'])}. Within cells, the causal effect's rank correlation with "
        f"answer length is {r['effect_vs_answer_tokens']:+.2f} (the seed's mechanism: a fact "
        "memorized outright gains log-probability on every answer token).\n"
    )


def in_context_section(paths: Paths, causal_meta: dict[str, Any]) -> str:
    """The in-context check of the answer key (causal/in_context.parquet)."""
    from . import in_context

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
            f"first. Chance is one in {n_cand} candidates ({_pct(1 / n_cand)}).",
            "",
            markdown_table(in_context_table(in_context.rates(tab))),
            "",
        ]
    )


def _mean_range(s: Any) -> str:
    """``mean [min, max]`` of a fidelity summary or sweep row; n/a without one."""
    if s is None or s["mean"] is None:
        return "n/a"
    return f"{s['mean']:.2f} [{s['min']:.2f}, {s['max']:.2f}]"


def fidelity_rows(
    summaries: dict[str, dict[str, Any]], order: list[str] | None = None
) -> pd.DataFrame:
    """Method x twin: mean [min, max] of the per-query Spearman with the exact product (methods
    in ``order``, then any other in the order met)."""
    methods = list(dict.fromkeys([*(order or []), *(m for s in summaries.values() for m in s)]))
    rows = []
    for name in methods:
        refs = [s[name]["reference"] for s in summaries.values() if name in s]
        row = {"method": method_label(name), "compared with": f"exact {refs[0]}"}
        for model, summary in summaries.items():
            row[f"model {model}"] = _mean_range(summary.get(name))
        rows.append(row)
    return pd.DataFrame(rows)


def _projection_label(r: Any) -> str:
    """``LoGra k_out x k_in per module`` or ``count sketch``, for a sweep row."""
    if r.get("projection", "logra") == "sketch":
        return "count sketch"
    if "k_out" not in r:
        return "LoGra"
    return f"LoGra {int(r['k_out'])} x {int(r['k_in'])} per module"


def sweep_lines(paths: Paths, metas: dict[str, dict[str, Any]]) -> list[str]:
    """The projection sweep (``fidelity.sweep``, ``fidelity.sketch_sweep``) as a table:
    projection, D, store per window, and the gradient dot product's fidelity per twin, after the
    study's own row; nothing without a sweep."""
    tables = {m: io.read_parquet(paths.fidelity(m) / "sweep.parquet") for m in metas}
    if all(t.empty for t in tables.values()):
        return []
    first = next(t for t in tables.values() if not t.empty)
    info = next(iter(metas.values()))["info"]
    own = {
        "projection": f"{_projection_label(info)} (this study's gradients)",
        "D": f"{int(info['projected_dims']):,}",
        "store per window": f"{int(info['projected_dims']) * 4 / 1024:,.0f} KiB",
        **{
            f"model {m}": _mean_range(meta["info"]["summary"].get("grad_dot"))
            for m, meta in metas.items()
        },
    }
    rows = [own]
    for i, r in first.iterrows():
        row = {
            "projection": _projection_label(r),
            "D": f"{int(r['dims']):,}",
            "store per window": f"{int(r['store_bytes_per_window']) / 1024:,.0f} KiB",
        }
        for m, t in tables.items():
            row[f"model {m}"] = _mean_range(t.iloc[i])
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
    """How much of the exact gradient ranking each gradient method keeps (plantbench.fidelity);
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
            fidelity_rows(
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
    from . import replicate_summary
    from .replicates import count

    n = count(cfg)
    if n < 2:
        return "", {}
    meta = io.read_meta(paths.replicate_summary, "replicates")
    return replicate_summary.markdown(paths.replicate_summary, n), {"replicates": meta["hash"]}


def run(cfg: dict[str, Any], paths: Paths) -> Path:
    causal_meta = io.read_meta(paths.causal, "causal")
    model_metas = {m: io.read_meta(paths.model(m), "pretrain", verify=False) for m in MODELS}
    for m in MODELS:
        io.check_input(causal_meta, f"model_{m}", model_metas[m], str(paths.causal))
    facts = io.read_parquet(paths.causal / "facts.parquet")
    out_dir = paths.report
    out_dir.mkdir(parents=True, exist_ok=True)
    loss_figure(paths, out_dir / "loss_curves.png")
    analysis_dir = paths.root / "analysis"
    if (analysis_dir / io.META).is_file():
        analysis_meta = io.read_meta(analysis_dir, "analysis", verify=False)
        io.check_input(analysis_meta, "causal", causal_meta, str(analysis_dir))
        graded = analysis_sections(paths, out_dir)
    else:
        analysis_meta = None
        graded = (
            "The attribution methods have not been graded yet: run `plantbench analysis` "
            "(or `snakemake`) and then this report again.\n"
        )

    over_replicates, replicate_input = replicates_section(cfg, paths)
    fidelity_text, fidelity_input = fidelity_section(paths)
    from .context import report as context_report
    from .grounding import report as grounding_report
    from .membership import report as membership_report

    context_text, context_input, context_figures = context_report.section(paths, out_dir)
    grounding_text, grounding_input, grounding_figures = grounding_report.section(paths, out_dir)
    membership_text, membership_input, membership_figures = membership_report.section(
        paths, out_dir
    )
    hashes = {
        "config (study)": study_hash(cfg),
        "facts": io.read_meta(paths.facts, "facts", verify=False)["hash"],
        "corpus": io.read_meta(paths.corpus, "corpus", verify=False)["hash"],
        "tokenizer": io.read_meta(paths.tokenizer, "tokenizer", verify=False)["hash"],
        **{
            f"stream {m}": io.read_meta(paths.stream(m), "stream", verify=False)["hash"]
            for m in MODELS
        },
        **{f"model {m}": model_metas[m]["hash"] for m in MODELS},
        "causal": causal_meta["hash"],
    }
    if analysis_meta is not None:
        hashes["analysis"] = analysis_meta["hash"]
    info = {m: model_metas[m]["info"] for m in MODELS}
    lines = [
        "# plantbench study report",
        "",
        f"{len(facts)} planted facts, two twins of {info['A']['params']:,} parameters each, "
        f"{info['A']['tokens']:,} training tokens per model.",
        "",
        "## Which facts the twins learned",
        "",
        "A fact is learned when its causal effect is positive (the reading model gives the answer "
        "more log-probability than the model that never read it) and the reading model ranks the "
        "true answer first among the candidates. Cells show the learned rate and (number of "
        "facts).",
        "",
        markdown_table(learned_table(facts)),
        "",
        f"Mean causal effect: {facts['effect'].mean():+.3f} nats; "
        f"facts with a positive effect: {100 * (facts['effect'] > 0).mean():.0f}%.",
        "",
        recipe_line(causal_meta),
        in_context_section(paths, causal_meta),
        graded,
        *([fidelity_text] if fidelity_text else []),
        *([context_text] if context_text else []),
        *([grounding_text] if grounding_text else []),
        *([membership_text] if membership_text else []),
        *([over_replicates] if over_replicates else []),
        "## Pretraining",
        "",
        "![loss curves](loss_curves.png)",
        "",
        "| model | final loss (mean of the last 5% of steps) | steps | tokens |",
        "|---|---|---|---|",
        *[
            f"| {m} | {info[m]['final_loss']:.4f} | {info[m]['steps']:,} | {info[m]['tokens']:,} |"
            for m in MODELS
        ],
        "",
        "## Hashes of this run",
        "",
        "| artifact | xxh3-128 |",
        "|---|---|",
        *[f"| {k} | `{v}` |" for k, v in hashes.items()],
        "",
    ]
    inputs = {
        "causal": causal_meta["hash"],
        **{f"model_{m}": model_metas[m]["hash"] for m in MODELS},
        **({"analysis": analysis_meta["hash"]} if analysis_meta is not None else {}),
        **replicate_input,
        **fidelity_input,
        **context_input,
        **grounding_input,
        **membership_input,
    }
    figures = [*context_figures, *grounding_figures, *membership_figures]
    return write_outputs(cfg, out_dir, "\n".join(lines), inputs, figures)


def write_outputs(
    cfg: dict[str, Any],
    out_dir: Path,
    md: str,
    inputs: dict[str, str],
    extra_figures: list[str] | None = None,
) -> Path:
    """report.md, its HTML rendering and the folder's meta.json (the figures are written)."""
    path = out_dir / "report.md"
    io.write_text(path, md)
    io.write_text(out_dir / HTML_NAME, markdown_html(md, out_dir))
    figures = [
        "loss_curves.png",
        *(FIGURES if "analysis" in inputs else ()),
        *(extra_figures or []),
    ]
    io.write_meta(
        out_dir,
        "report",
        ["report.md", HTML_NAME, *figures],
        config_hash=study_hash(cfg),
        inputs=inputs,
        info={"figures": figures, "graded": "analysis" in inputs},
    )
    return path
