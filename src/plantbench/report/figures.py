"""The study report's figures (PNG): loss curves, the learned-rate grid, AP by documents per fact,
attributed mass against causal effect."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from plantbench.markdown import method_label, plt, save_figure, signed
from plantbench.paths import MODELS, Paths

# the pretraining figures (always written) and the grading figures (with the analysis sections)
TRAINING_FIGURES = ("loss_curves.png", "reading_curve.png")
FIGURES = ("learned_rate.png", "ap_by_n_docs.png", "mass_vs_effect.png")


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
                f"{method_label(m)}\nr={signed(c.loc[m, 'raw'])}, "
                f"controlled {signed(c.loc[m, 'controlled'])}",
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
    save_figure(fig, out)
