"""The study report's tables as data frames of strings, laid out like the seed's: learned rate,
retrieval, haystack, correlations, current loss, the in-context check, fidelity."""

from __future__ import annotations

from typing import Any

import pandas as pd

from plantbench.grading import metrics
from plantbench.markdown import ci, method_label, num, pct, signed
from plantbench.paths import MODELS


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
                "AP, model A": num(by_model.loc[(m, "A"), "ap"]),
                "AP, model B": num(by_model.loc[(m, "B"), "ap"]),
                "Recall@10": pct(p["recall_at_10"]),
                f"AP, {lo} documents": num(p[f"ap_{lo}"], "{:.2f}"),
                f"AP, {hi} documents": num(p[f"ap_{hi}"], "{:.2f}"),
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
            row[header[f]] = " / ".join(num(by.loc[(m, x, f), "ap"]) for x in MODELS)
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
            cells = [ci(r, "raw"), signed(r["vs_length"]), signed(r["vs_difficulty"])]
            cells.append(ci(r, "controlled"))
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
                "mass vs final loss (Pearson, all facts)": signed(r["vs_final_loss"]),
                "same, within-cell ranks": signed(r["vs_final_loss_within"]),
                "mean mass, learned": (
                    f"{num(r['mass_learned'], '{:+.2f}')} ({int(r['n_learned'])})"
                ),
                "mean mass, not learned": (
                    f"{num(r['mass_not_learned'], '{:+.2f}')} ({int(r['n_not_learned'])})"
                ),
            }
        )
    return pd.DataFrame(rows)


def in_context_table(rates: pd.DataFrame) -> pd.DataFrame:
    """Reading and following rates: rows by query form, columns by twin role."""
    label = {"reader": "twin that read it", "other": "twin that never read it"}
    rows = []
    for r in rates.itertuples(index=False):
        rows.append(
            {
                "query form": "both" if r.form == "all" else r.form,
                "twin": label[r.role],
                "true answer first, no context": pct(r.no_context_first),
                "reading rate (sentence in context)": pct(r.reading_rate),
                "following rate (counterfactual)": pct(r.following_rate),
                "log p gain from context (nats)": signed(r.gain_nats),
            }
        )
    return pd.DataFrame(rows)


def mean_range(s: Any) -> str:
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
            row[f"model {model}"] = mean_range(summary.get(name))
        rows.append(row)
    return pd.DataFrame(rows)


def projection_label(r: Any) -> str:
    """``LoGra k_out x k_in per module`` or ``count sketch``, for a sweep row."""
    if r.get("projection", "logra") == "sketch":
        return "count sketch"
    if "k_out" not in r:
        return "LoGra"
    return f"LoGra {int(r['k_out'])} x {int(r['k_in'])} per module"


def findings_table(found: pd.DataFrame) -> pd.DataFrame:
    """Findings against the papers (:func:`plantbench.grading.findings.evaluate`): finding, seed,
    the seed's number, the line, this run's number with its interval (and what it is of), the
    verdict (with why, when not testable), and over replicates in how many it holds."""
    rows = []
    for r in found.itertuples(index=False):
        ours = f"{r.this_run} ({r.on})" if r.on else r.this_run
        row = {
            "Finding": f"{r.statement} `{r.id}`",
            "Seed": r.seed,
            "Seed's number": r.seed_number,
            "Line": r.line,
            "This run [95% interval]": ours,
            "Verdict": f"{r.verdict}: {r.why}" if r.verdict == "not testable" else r.verdict,
        }
        if r.holds:
            row["Holds"] = r.holds
        rows.append(row)
    return pd.DataFrame(rows)
