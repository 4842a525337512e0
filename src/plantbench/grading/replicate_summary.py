"""How much the study's answers move between replicates.

Replicate ``r`` is the whole study trained again with the same configuration; replicates differ
only in the models' initial weights and the order of the background documents. Each replicate's
``analysis`` step writes ``learned_grid.csv``, ``retrieval.csv`` and ``correlations.csv``; this
module reads them all and reports, per number, the mean and the [min, max] over replicates, and
per verdict (does the controlled correlation's interval exclude zero? which method ranks first?)
whether every replicate agrees. A mean, min or max over replicates is NaN when any replicate's
value is NaN, so a number that is missing somewhere never looks settled.
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.errors import ArtifactError, ConfigError
from plantbench.markdown import markdown_table, method_label
from plantbench.paths import Paths

TABLES = {
    "learned_grid": "learned_grid.csv",
    "retrieval": "retrieval.csv",
    "correlations": "correlations.csv",
}
OUTPUTS = ("learned.csv", "retrieval.csv", "correlations.csv", "ordering.csv")
MODEL_ORDER = ("A", "B", "all")
EXCLUDES = "excludes zero in every replicate"
INCLUDES = "includes zero in every replicate"
UNSTABLE = "unstable"
NOT_ESTIMABLE = "no interval in any replicate"
_TEXT = ("method", "model", "degenerate", "n_docs", "position")


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _read_csv(path: Path) -> pd.DataFrame:
    opts: dict[str, Any] = {"keep_default_na": False, "na_values": []}
    df = pd.read_csv(path, dtype={c: str for c in _TEXT}, **opts)
    for c in df.columns:
        if c not in _TEXT:
            df[c] = pd.to_numeric(df[c].replace("", np.nan))
    return df


def read(folders: list[Path]) -> dict[str, pd.DataFrame]:
    """The three analysis tables of every replicate (``folders[r]`` is replicate ``r``), each
    concatenated over replicates with an int ``replicate`` column."""
    parts: dict[str, list[pd.DataFrame]] = {key: [] for key in TABLES}
    for r, folder in enumerate(folders):
        folder = Path(folder)
        for key, name in TABLES.items():
            path = folder / name
            if not path.is_file():
                raise ArtifactError(
                    f"'{folder}' has no {name}; run the analysis step for replicate {r}"
                )
            parts[key].append(_read_csv(path).assign(replicate=r))
    return {key: pd.concat(dfs, ignore_index=True) for key, dfs in parts.items()}


# --------------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------------


def _replicates(df: pd.DataFrame) -> list[int]:
    return sorted(int(r) for r in df["replicate"].unique())


def _wide(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """One row per key of replicate 0 (in its file's order), one column per replicate."""
    first = df[df["replicate"] == df["replicate"].min()]
    index = pd.MultiIndex.from_frame(first[keys].drop_duplicates())
    wide = df.pivot(index=keys, columns="replicate", values=value)
    wide = wide.reindex(index=index, columns=_replicates(df))
    return wide.astype(float)


def _spread(wide: pd.DataFrame, value: str) -> pd.DataFrame:
    return pd.DataFrame(
        {
            f"{value}_mean": wide.mean(axis=1, skipna=False),
            f"{value}_min": wide.min(axis=1, skipna=False),
            f"{value}_max": wide.max(axis=1, skipna=False),
        }
    )


def learned_table(df: pd.DataFrame) -> pd.DataFrame:
    """Learned rate per (n_docs, position): mean, min, max and one ``rate_r<r>`` per replicate."""
    wide = _wide(df, ["n_docs", "position"], "rate")
    per = wide.rename(columns=lambda r: f"rate_r{r}")
    return pd.concat([_spread(wide, "rate"), per], axis=1).reset_index()


def retrieval_table(df: pd.DataFrame) -> pd.DataFrame:
    """AP and Recall@10 per (method, model): mean, min and max over replicates."""
    keys = ["method", "model"]
    parts = [_spread(_wide(df, keys, v), v) for v in ("ap", "recall_at_10")]
    return pd.concat(parts, axis=1).reset_index()


def _verdict(flags: list[bool], defined: list[bool]) -> str:
    if not any(defined):
        return NOT_ESTIMABLE
    if not all(defined):
        return UNSTABLE
    if all(flags):
        return EXCLUDES
    return INCLUDES if not any(flags) else UNSTABLE


def correlation_table(df: pd.DataFrame) -> pd.DataFrame:
    """The controlled correlation per method: mean, min, max of the point estimate; per
    replicate whether its interval excludes zero ("yes/yes/no"; "none" without an interval); the
    verdict and whether it is stable (the same in every replicate, an interval in each)."""
    est = _wide(df, ["method"], "controlled")
    lo = _wide(df, ["method"], "controlled_lo")
    hi = _wide(df, ["method"], "controlled_hi")
    defined = lo.notna() & hi.notna()
    excl = ((lo > 0) | (hi < 0)) & defined
    out = _spread(est, "controlled")
    out["excludes_zero"] = [
        "/".join(("yes" if f else "no") if d else "none" for f, d in zip(e, ok, strict=True))
        for e, ok in zip(excl.values, defined.values, strict=True)
    ]
    out["verdict"] = [
        _verdict(list(e), list(ok)) for e, ok in zip(excl.values, defined.values, strict=True)
    ]
    out["stable"] = out["verdict"] != UNSTABLE
    return out.reset_index()


def _order(sub: pd.DataFrame) -> list[str]:
    ranked = sub.sort_values(
        ["ap", "method"], ascending=[False, True], na_position="last", kind="stable"
    )
    return list(ranked["method"])


def _pairs_stable(orders: list[list[str]]) -> float:
    """Share of method pairs (of the first replicate's methods) in the same order everywhere."""
    pairs = list(combinations(orders[0], 2))
    if not pairs:
        return 1.0
    ranks = [{m: i for i, m in enumerate(o)} for o in orders]
    agree = 0
    for a, b in pairs:
        if all(a in rk and b in rk for rk in ranks):
            agree += len({rk[a] < rk[b] for rk in ranks}) == 1
    return agree / len(pairs)


def ordering_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per model (A, B, all): the methods by AP (best first, ties by name) in every replicate
    (``order_r<r>``, "m1 > m2 > ..."), ``stable``, ``top`` ("differs" when the best method
    changes) and ``pairs_stable`` (share of method pairs whose order never changes)."""
    rows = []
    reps = _replicates(df)
    for model in [m for m in MODEL_ORDER if m in set(df["model"])]:
        sub = df[df["model"] == model]
        orders = [_order(sub[sub["replicate"] == r]) for r in reps]
        tops = {o[0] if o else "" for o in orders}
        row: dict[str, Any] = {"model": model}
        row.update({f"order_r{r}": " > ".join(o) for r, o in zip(reps, orders, strict=True)})
        row["stable"] = all(o == orders[0] for o in orders)
        row["top"] = tops.pop() if len(tops) == 1 else "differs"
        row["pairs_stable"] = _pairs_stable(orders)
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# The artifact and its report section
# --------------------------------------------------------------------------------------------


def _write_csv(path: Path, df: pd.DataFrame) -> None:
    io.write_text(path, df.to_csv(index=False, float_format="%.10g"))


def summarize(folders: list[Path], out: Path, *, config_hash: str) -> dict[str, Any]:
    """Write ``learned.csv``, ``retrieval.csv``, ``correlations.csv`` and ``ordering.csv`` into
    ``out`` and then its ``meta.json`` (stage "replicates"); returns the meta."""
    out = Path(out)
    data = read(folders)
    hashes = {f"analysis/{r}": io.read_meta(f, "analysis")["hash"] for r, f in enumerate(folders)}
    corr = correlation_table(data["correlations"])
    order = ordering_table(data["retrieval"])
    tables = [learned_table(data["learned_grid"]), retrieval_table(data["retrieval"]), corr, order]
    for name, df in zip(OUTPUTS, tables, strict=True):
        _write_csv(out / name, df)
    info = {
        "replicates": len(folders),
        "stable_verdicts": int(corr["stable"].sum()),
        "unstable_verdicts": [str(m) for m in corr.loc[~corr["stable"], "method"]],
        "stable_orderings": [str(m) for m in order.loc[order["stable"], "model"]]
        if len(order)
        else [],
    }
    return io.write_meta(
        out, "replicates", list(OUTPUTS), config_hash=config_hash, inputs=hashes, info=info
    )


def _fmt(x: Any, fmt: str) -> str:
    v = float(x)
    return "n/a" if not np.isfinite(v) else fmt.format(v)


def _cell(row: Any, key: str, fmt: str) -> str:
    """ "mean [min, max]" of ``key``."""
    lo, hi = _fmt(row[f"{key}_min"], fmt), _fmt(row[f"{key}_max"], fmt)
    return f"{_fmt(row[f'{key}_mean'], fmt)} [{lo}, {hi}]"


def _read_out(out: Path) -> dict[str, pd.DataFrame]:
    text = {c: str for c in (*_TEXT, "excludes_zero", "verdict", "top")}
    opts: dict[str, Any] = {"keep_default_na": False, "na_values": [""]}
    return {name: pd.read_csv(out / name, dtype=text, **opts) for name in OUTPUTS}


def _learned_md(learned: pd.DataFrame) -> pd.DataFrame:
    rows = learned[learned["position"] == "All"]
    return pd.DataFrame(
        {
            "Documents per fact": list(rows["n_docs"]),
            "Facts learned": [_cell(r, "rate", "{:.0%}") for _, r in rows.iterrows()],
        }
    )


def _retrieval_md(ret: pd.DataFrame, label: Any) -> pd.DataFrame:
    rows = []
    models = [m for m in ("A", "B") if m in set(ret["model"])]
    for method in dict.fromkeys(ret["method"]):
        sub = ret[ret["method"] == method].set_index("model")
        row = {"Method": label(method)}
        for m in models:
            row[f"AP, model {m}"] = _cell(sub.loc[m], "ap", "{:.3f}") if m in sub.index else "n/a"
        rows.append(row)
    return pd.DataFrame(rows)


def _correlation_md(corr: pd.DataFrame, label: Any) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "Method": [label(m) for m in corr["method"]],
            "Controlled correlation": [
                _cell(r, "controlled", "{:+.2f}") for _, r in corr.iterrows()
            ],
            "Interval excludes 0 (per replicate)": list(corr["excludes_zero"]),
            "Verdict": list(corr["verdict"]),
        }
    )


def _ordering_lines(order: pd.DataFrame) -> list[str]:
    names = {"A": "Model A", "B": "Model B", "all": "Both models pooled"}
    lines = []
    for _, r in order.iterrows():
        orders = [r[c] for c in order.columns if c.startswith("order_r")]
        head = f"- {names.get(r['model'], r['model'])}: "
        if str(r["stable"]) == "True":
            lines.append(head + f"{orders[0]} (the same in every replicate)")
            continue
        per = "; ".join(f"Replicate {i}: {o}" for i, o in enumerate(orders))
        top = "the best method is the same" if r["top"] != "differs" else "the best method differs"
        share = f"{float(r['pairs_stable']):.0%} of method pairs keep their order"
        lines.append(head + f"differs ({top}; {share}). {per}")
    return lines


def markdown(out: Path, n: int) -> str:
    """The report's replicate section, from the CSVs :func:`summarize` wrote into ``out``."""
    t = _read_out(Path(out))
    intro = (
        f"The study was trained {n} times with the same configuration; the replicates differ "
        "only in the models' initial weights and the order of the background documents. Each "
        "number below is the mean [min, max] over the replicates (n/a when any replicate has no "
        "value). A verdict is stable when every replicate agrees with it."
    )
    parts = [
        f"## Over {n} replicates",
        intro,
        "### Share of facts learned, by documents per fact",
        markdown_table(_learned_md(t["learned.csv"])),
        "### Retrieval average precision",
        markdown_table(_retrieval_md(t["retrieval.csv"], method_label)),
        "### Correlation with the causal effect, controlled",
        markdown_table(_correlation_md(t["correlations.csv"], method_label)),
        "### Methods ordered by AP",
        "\n".join(_ordering_lines(t["ordering.csv"])),
    ]
    return "\n\n".join(parts) + "\n"


def run(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """The ``replicates`` step: summarize every replicate's analysis into
    ``{results}/replicates/summary/``."""
    from plantbench.config import config_hash
    from plantbench.replicates import count

    n = count(cfg)
    if n < 2:
        raise ConfigError(
            f"replicates: {n}: there is nothing to summarize; set replicates to 2 or more"
        )
    folders = [paths.replicate_root(r) / "analysis" for r in range(n)]
    keys = ["replicates", "analysis", "methods"]
    return summarize(folders, paths.replicate_summary, config_hash=config_hash(cfg, keys))
