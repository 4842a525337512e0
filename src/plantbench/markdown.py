"""How the project prints numbers, tables and figures: one place for every report and suite.

``markdown_table`` (a pipe table), the number formats (``num``, ``signed``, ``pct``, ``ci``),
the methods' display names (``method_label``), and matplotlib on its file-only (Agg) backend with
``save_figure`` (an atomic PNG without a timestamp, so a figure's bytes depend on its data only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from plantbench import io  # noqa: E402

__all__ = ["ci", "markdown_table", "method_label", "num", "pct", "plt", "save_figure", "signed"]


def markdown_table(df: pd.DataFrame) -> str:
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


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
    "trackstar": "TrackStar",
    "ekfac_astra": "EK-FAC influence with ASTRA",
}


def method_label(name: str) -> str:
    return METHOD_LABELS.get(name, f"{name} (plug-in)")


def save_figure(fig: Any, out: Path) -> None:
    fig.tight_layout()
    with io.atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def num(x: Any, fmt: str = "{:.3f}") -> str:
    v = float(x)
    return "n/a" if not np.isfinite(v) else fmt.format(v)


def signed(x: Any) -> str:
    return num(x, "{:+.2f}")


def pct(x: Any) -> str:
    return num(x, "{:.0%}")


def ci(row: Any, key: str) -> str:
    return f"{signed(row[key])} [{signed(row[f'{key}_lo'])}, {signed(row[f'{key}_hi'])}]"
