"""The report's "Random twins" section (rule random_effect's tables; only when
``random_twins.m`` > 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from plantbench import io, layout
from plantbench.markdown import markdown_table
from plantbench.paths import Paths


def _ci(row: pd.Series, key: str) -> str:
    return f"{row[key]:+.2f} [{row[f'{key}_lo']:+.2f}, {row[f'{key}_hi']:+.2f}]"


def method_rows(grades: pd.DataFrame) -> pd.DataFrame:
    """One row per method: AP, the controlled correlation against the A/B effect and both
    against the random-twin effect, and LDS, each with its interval."""
    rows = [
        {
            "method": str(r["method"]),
            "AP": f"{r['ap']:.3f}",
            "controlled vs A/B effect": _ci(r, "controlled_ab"),
            "raw vs random-twin effect": _ci(r, "raw_rt"),
            "controlled vs random-twin effect": _ci(r, "controlled_rt"),
            "LDS": _ci(r, "lds"),
        }
        for _, r in grades.iterrows()
    ]
    return pd.DataFrame(rows)


def _effect_lines(info: dict[str, Any]) -> list[str]:
    a = info["agreement"]
    return [
        f"Each fact's effect from the {info['draws']} random twins (the readers' mean answer "
        "log p minus the others', with its standard error) against the A/B pair's: Pearson "
        f"{a['pearson']:+.2f}, Spearman {a['spearman']:+.2f} over {a['n_facts']} facts; mean "
        f"standard error {a['mean_se']:.2f} nats, mean |A/B - random| {a['mean_abs_difference']:.2f}. "
        f"The A/B effect lies outside what one random pair gives 95% of the time for "
        f"{a['outside']} facts ({100 * a['outside_share']:.0f}%, about 5% expected); "
        f"{a['significant_rt']} random-twin effects clear zero, and the A/B effect has the "
        f"opposite sign for {a['opposite_sign']} of them (random/disagreements.csv).",
        "",
    ]


def _ranking_lines(info: dict[str, Any]) -> list[str]:
    r = info["ranking"]
    return [
        "Where LDS and the causal grades agree on the order of the methods (Spearman across "
        f"methods): LDS vs raw random-twin correlation {r['lds_vs_raw_rt']:+.2f}, vs controlled "
        f"{r['lds_vs_controlled_rt']:+.2f}, vs AP {r['lds_vs_ap']:+.2f}. Best first: LDS "
        f"{', '.join(r['order_lds'])}; raw random-twin correlation "
        f"{', '.join(r['order_raw_rt'])}.",
        "",
    ]


def section(cfg: dict[str, Any], paths: Paths) -> tuple[str, dict[str, str], list[str]]:
    """The section, its input hash and no figure; nothing without random twins."""
    if not layout.random_draws(cfg):
        return "", {}, []
    folder: Path = paths.random
    meta = io.read_meta(folder, "random_effect")
    info = meta["info"]
    grades = pd.read_csv(folder / "grades.csv")
    opt = info["optimizer"]
    text = [
        "## Random twins",
        "",
        f"{info['draws']} more twins from the shared prefix, each reading the documents of a "
        "seeded half of the fact pairs (all of a fact's documents or none), trained like A and "
        "B (results/models/random/, results/random/).",
        "",
        *_effect_lines(info),
        markdown_table(method_rows(grades)),
        "",
        "LDS: per query on the twin that read its fact, the Spearman correlation across the "
        "random twins between the method's scores summed over the pool windows the twin read "
        "and the twin's answer log p; mean over queries, 95% bootstrap interval. It moves with "
        f"the optimizer: AdamW, lr {opt['lr']}, betas ({opt['beta1']}, {opt['beta2']}), eps "
        f"{opt['eps']}, weight decay {opt['weight_decay']}, {opt['paired_steps']} paired steps, "
        f"{opt['precision']} precision (the float path: random/meta.json, platform).",
        "",
        *_ranking_lines(info),
    ]
    return "\n".join(text), {"random_effect": meta["hash"]}, []
