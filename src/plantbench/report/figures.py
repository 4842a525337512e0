"""The study report's figures (PNG): loss curves, the learned-rate grid, AP by documents per fact,
the correlation of attributed mass with causal effect (a forest plot) and raw mass against raw
effect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from plantbench.markdown import method_label, plt, save_figure
from plantbench.paths import MODELS, Paths

# the pretraining figures (always written) and the grading figures (with the analysis sections)
TRAINING_FIGURES = ("loss_curves.png", "reading_curve.png")
FIGURES = ("learned_rate.png", "ap_by_n_docs.png", "mass_vs_effect.png", "mass_raw_scatter.png")


def reading_figure(curve: pd.DataFrame, chance: float, out: Path) -> None:
    """The reading curve (``reading/reading_curve.parquet``): each twin's reading rate on the
    facts it never read, by training tokens, from the fork (the shared prefix's end) on."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for m in MODELS:
        c = curve[curve["model"] == m].sort_values("tokens")
        ax.plot(c["tokens"] / 1e6, c["reading_rate"], marker="o", lw=1.2, label=f"model {m}")
    fork = curve[curve["checkpoint"] == "fork"]
    if len(fork):
        ax.axvline(float(fork["tokens"].iloc[0]) / 1e6, color="grey", ls=":", lw=1)
        ax.text(float(fork["tokens"].iloc[0]) / 1e6, 0.02, " fork", color="grey", fontsize=8)
    ax.axhline(chance, color="grey", ls="--", lw=1, label=f"chance ({chance:.0%})")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel("true answer first, sentence in context")
    ax.set_title("Reading never-read facts from the context")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, out)


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
    save_figure(fig, out)
    return curves


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
    save_figure(fig, out)


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
    save_figure(fig, out)


# the seed's correlation table (seed 003, the paper-scale study): method -> (raw, lo, hi,
# controlled, lo, hi); drawn beside ours when the run's config is the paper's (:func:`is_paper`)
SEED_CORRELATIONS: dict[str, tuple[float, float, float, float, float, float]] = {
    "embedding": (0.21, 0.14, 0.29, 0.15, 0.07, 0.23),
    "hidden": (0.08, -0.01, 0.17, 0.13, 0.04, 0.21),
    "grad_dot": (0.32, 0.23, 0.39, 0.09, -0.00, 0.17),
    "grad_cos": (0.32, 0.23, 0.40, 0.09, 0.00, 0.17),
    "tracin_dot": (0.34, 0.26, 0.41, 0.06, -0.02, 0.15),
    "tracin_influence": (0.41, 0.33, 0.48, 0.04, -0.04, 0.14),
    "influence": (0.35, 0.28, 0.43, 0.03, -0.06, 0.12),
    "bm25": (0.13, 0.05, 0.22, -0.02, -0.10, 0.06),
}
# what makes a config the paper's: the seed's grid and model shape (workflow/presets/paper.yaml)
PAPER_SHAPE = {("facts", "n_docs"): [2, 8, 32, 128], ("facts", "facts_per_cell"): 11,
               ("model", "n_layer"): 12, ("model", "n_embd"): 768}  # fmt: skip


def is_paper(cfg: dict) -> bool:
    """Whether the run has the seed's grid and model shape (the paper preset)."""
    return all(cfg.get(a, {}).get(b) == v for (a, b), v in PAPER_SHAPE.items())


def forest_order(corr: pd.DataFrame) -> list[str]:
    """Methods with a controlled correlation, highest first (ties: config order)."""
    c = corr[corr["controlled"].notna()]
    return c.sort_values("controlled", ascending=False, kind="stable")["method"].tolist()


def _interval(ax, y: float, v: float, lo: float, hi: float, **kw) -> None:
    err = [[max(v - lo, 0.0)], [max(hi - v, 0.0)]] if np.isfinite(lo) and np.isfinite(hi) else None
    ax.errorbar([v], [y], xerr=err, capsize=2, lw=1, ms=5, ls="none", **kw)


def mass_figure(corr: pd.DataFrame, out: Path, paper: bool = False) -> None:
    """Forest plot: per method the raw and the controlled correlation of mass with effect, with
    their intervals side by side (and the seed's, when ``paper``), sorted by the controlled."""
    methods = forest_order(corr)
    c = corr.set_index("method")
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * max(len(methods), 2) + 1.4), dpi=110)
    for i, m in enumerate(methods):
        y, r = len(methods) - 1 - i, c.loc[m]
        _interval(ax, y + 0.27, r["raw"], r["raw_lo"], r["raw_hi"], fmt="o", color="tab:grey")
        _interval(ax, y - 0.09, r["controlled"], r["controlled_lo"], r["controlled_hi"],
                  fmt="s", color="tab:blue")  # fmt: skip
        if paper and m in SEED_CORRELATIONS:
            s = SEED_CORRELATIONS[m]
            _interval(ax, y + 0.11, *s[:3], fmt="o", color="tab:grey", mfc="white")
            _interval(ax, y - 0.25, *s[3:], fmt="s", color="tab:blue", mfc="white")
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(range(len(methods)), [method_label(m) for m in reversed(methods)], fontsize=8)
    ax.set_xlim(-1.0, 1.0)
    ax.set_xlabel("correlation of attributed mass with causal effect (within-cell ranks)")
    handles = [
        plt.Line2D([], [], marker="o", color="tab:grey", ls="none", label="raw"),
        plt.Line2D([], [], marker="s", color="tab:blue", ls="none", label="controlled"),
    ]
    if paper:
        handles.append(
            plt.Line2D([], [], marker="s", color="tab:blue", mfc="white", ls="none", label="seed")
        )
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    ax.set_title("Did the documents that mattered get the mass? (95% intervals)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, out)


def scatter_figure(per_fact: pd.DataFrame, out: Path) -> None:
    """Raw attributed mass against raw causal effect, one panel per method with a mass, learned
    facts in orange."""
    pf = per_fact[per_fact["mass"].notna()]
    methods = list(dict.fromkeys(pf["method"]))
    ncol = min(4, max(1, len(methods)))
    nrow = max(1, int(np.ceil(len(methods) / ncol)))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.0 * ncol, 2.6 * nrow), dpi=110, squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        if k >= len(methods):
            ax.axis("off")
            continue
        sub = pf[pf["method"] == methods[k]]
        colours = np.where(sub["learned"].to_numpy(dtype=bool), "tab:orange", "tab:blue")
        ax.scatter(sub["effect"], sub["mass"], s=8, c=colours, alpha=0.7, lw=0)
        ax.set_title(method_label(methods[k]), fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("causal effect (nats)", fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("attributed mass (z)", fontsize=7)
    fig.suptitle("Raw attributed mass vs raw causal effect (orange: learned facts)", fontsize=9)
    save_figure(fig, out)
