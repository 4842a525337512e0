"""The study report: results/report/report.md plus figures (matplotlib, Agg backend)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from . import io, metrics  # noqa: E402
from .config import config_hash  # noqa: E402
from .paths import MODELS, Paths  # noqa: E402

log = logging.getLogger(__name__)


def markdown_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


def learned_table(facts: pd.DataFrame) -> pd.DataFrame:
    """The seed's learned-rate table as strings: documents per fact x position, with All."""
    grid = metrics.learned_grid(facts)
    rates, counts = grid.rates, grid.n_facts
    out = pd.DataFrame({"Documents per fact": [str(i) for i in rates.index]})
    for col in rates.columns:
        out[str(col).capitalize() if col != "All" else "All"] = [
            f"{100 * r:.0f}% ({int(n)})" if n else "-" for r, n in zip(rates[col], counts[col], strict=True)
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


def run(cfg: dict[str, Any], paths: Paths) -> Path:
    causal_meta = io.read_meta(paths.causal, "causal")
    model_metas = {m: io.read_meta(paths.model(m), "pretrain", verify=False) for m in MODELS}
    for m in MODELS:
        io.check_input(causal_meta, f"model_{m}", model_metas[m], str(paths.causal))
    facts = io.read_parquet(paths.causal / "facts.parquet")
    out_dir = paths.report
    out_dir.mkdir(parents=True, exist_ok=True)
    loss_figure(paths, out_dir / "loss_curves.png")

    hashes = {
        "config": config_hash(cfg),
        "facts": io.read_meta(paths.facts, "facts", verify=False)["hash"],
        "corpus": io.read_meta(paths.corpus, "corpus", verify=False)["hash"],
        "tokenizer": io.read_meta(paths.tokenizer, "tokenizer", verify=False)["hash"],
        **{f"stream {m}": io.read_meta(paths.stream(m), "stream", verify=False)["hash"] for m in MODELS},
        **{f"model {m}": model_metas[m]["hash"] for m in MODELS},
        "causal": causal_meta["hash"],
    }
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
        "true answer first among the candidates. Cells show the learned rate and (number of facts).",
        "",
        markdown_table(learned_table(facts)),
        "",
        f"Mean causal effect: {facts['effect'].mean():+.3f} nats; "
        f"facts with a positive effect: {100 * (facts['effect'] > 0).mean():.0f}%.",
        "",
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
    path = out_dir / "report.md"
    io.write_text(path, "\n".join(lines))
    return path
