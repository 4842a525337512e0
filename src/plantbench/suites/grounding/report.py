"""The grounding suite's section of the study report (nothing when the suite has not run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from plantbench import io
from plantbench.markdown import markdown_table, num
from plantbench.paths import Paths

FIGURES = {"ck.png": "grounding_ck.png", "cr.png": "grounding_cr.png"}
SEED_FINDINGS = (
    "The seed's findings for comparison (six LLMs, English): CK about 70–76 on factual "
    "contexts (49–55 for the reasoning models), lower under all-counterfactual contexts "
    "(65–69; 46–53) with true-first above false-first; context recall highest in the first "
    'quartile and lowest in the last ("lost in the later").'
)


def _table(df: pd.DataFrame, fmt: str = "{:.1f}") -> str:
    return markdown_table(df.map(lambda v: v if isinstance(v, str) else num(v, fmt)))


def _ck_table(ck: pd.DataFrame) -> pd.DataFrame:
    t = ck[
        [
            "role",
            "condition",
            "responses",
            "empty",
            "ck",
            "ck_lo",
            "ck_hi",
            "pk",
            "pk_trained",
            "pk_other_twin",
            "pk_unsupported",
        ]
    ].copy()
    t["CK [95%]"] = [
        f"{m:.1f} [{lo:.1f}, {hi:.1f}]" if pd.notna(m) else "–"
        for m, lo, hi in zip(t["ck"], t["ck_lo"], t["ck_hi"], strict=True)
    ]
    t[["responses", "empty"]] = t[["responses", "empty"]].astype(int).astype(str)
    return t[
        [
            "role",
            "condition",
            "responses",
            "empty",
            "CK [95%]",
            "pk",
            "pk_trained",
            "pk_other_twin",
            "pk_unsupported",
        ]
    ]


def _cr_table(cr: pd.DataFrame) -> pd.DataFrame:
    t = cr.pivot_table(index=["role", "condition"], columns="segment", values="cr", sort=False)
    t.columns = [f"Q{int(q) + 1}" for q in t.columns]
    return t.reset_index()


def _answers_table(ans: pd.DataFrame) -> pd.DataFrame:
    t = ans[["role", "condition", "states_true", "states_false", "states_other"]].copy()
    t[["states_true", "states_false", "states_other"]] *= 100
    return t


def section(paths: Paths, out_dir: Path) -> tuple[str, dict[str, str], list[str]]:
    """(markdown, input hashes, figures copied into the report folder)."""
    folder = paths.grounding("analysis")
    if not (folder / io.META).is_file():
        return "", {}, []
    meta = io.read_meta(folder, "grounding_analysis")
    ctx = io.read_meta(paths.grounding("contexts"), "grounding_contexts")["info"]
    ck = pd.read_csv(folder / "ck_by_condition.csv")
    cr = pd.read_csv(folder / "cr_by_segment.csv")
    ans = pd.read_csv(folder / "answers.csv")
    for src, dst in FIGURES.items():
        shutil.copyfile(folder / src, out_dir / dst)
    text = [
        "## Contextual vs parametric knowledge (seed 002)",
        "",
        f"{ctx['facts']} facts × {len(ctx['conditions'])} conditions, each context "
        f"{ctx['segments']} segments of {ctx['sentences_per_segment']} atomic sentence(s) "
        "(the fact's own sentence, its entity's other details, other facts' sentences), then an "
        "open question about the entity; one greedy response per twin, atomized and judged by "
        "the exact checker (`results/grounding/`). PK is split by what the twin read: "
        "*trained* (a statement it read in training), *other twin* (one only the other twin "
        "read: a control) and *unsupported*. An empty response (no atomic sentence) has no CK "
        f"and is counted apart; {meta['info']['empty_responses']} of "
        f"{meta['info']['responses']} responses were empty.",
        "",
        "CK and PK by condition (the seed's Table 4; %, intervals over facts):",
        "",
        _table(_ck_table(ck)),
        "",
        SEED_FINDINGS,
        "",
        "![grounding CK](grounding_ck.png)",
        "",
        "Context recall CR per segment (the seed's Figure 4; % of the segment's sentences "
        "entailed by the response):",
        "",
        _table(_cr_table(cr)),
        "",
        "![grounding CR](grounding_cr.png)",
        "",
        "Responses naming the fact's entity with its true answer, the counterfactual's wrong "
        "answer, or another answer (% of responses): how much what a twin read pulls its "
        "answer away from the context.",
        "",
        _table(_answers_table(ans)),
        "",
    ]
    return "\n".join(text), {"grounding": meta["hash"]}, list(FIGURES.values())
