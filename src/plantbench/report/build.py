"""``plantbench report``: results/report/report.md plus figures (matplotlib, Agg backend), and
report.html, the same markdown rendered to one self-contained HTML file (figures inlined) that
the Snakemake report shows on its main page (workflow/report/workflow.rst). The report opens
with the seeds' findings checked on this run (plantbench.grading.findings), also written as
report/findings.csv."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from plantbench import io
from plantbench.config import study_hash
from plantbench.grading import findings
from plantbench.markdown import markdown_table
from plantbench.paths import MODELS, Paths
from plantbench.randomtwins import report as random_report
from plantbench.report import figures, sections, tables
from plantbench.report.html import HTML_NAME, markdown_html
from plantbench.suites.context import report as context_report
from plantbench.suites.grounding import report as grounding_report
from plantbench.suites.membership import report as membership_report
from plantbench.truth import reading


@dataclass
class _Inputs:
    """What the report is made from: the answer key, both twins and (if graded) the analysis."""

    causal: dict[str, Any]
    models: dict[str, dict[str, Any]]
    facts: pd.DataFrame
    analysis: dict[str, Any] | None
    curve: pd.DataFrame | None  # the reading curve (reading/reading_curve.parquet), if made
    chance: float  # one in the candidates (0 without a reading curve)


@dataclass
class _Section:
    """One section's markdown, the input hashes it read and the figures it wrote."""

    text: str
    inputs: dict[str, str]
    figures: list[str]


NOT_GRADED = (
    "The attribution methods have not been graded yet: run `plantbench analysis` "
    "(or `snakemake`) and then this report again.\n"
)
SUITES = (context_report, grounding_report, membership_report)
FINDINGS_CSV = "findings.csv"  # the findings against the papers, the report's first section


def _read_inputs(paths: Paths) -> _Inputs:
    causal = io.read_meta(paths.causal, "causal")
    models = {m: io.read_meta(paths.model(m), "pretrain", verify=False) for m in MODELS}
    for m in MODELS:
        io.check_input(causal, f"model_{m}", models[m], str(paths.causal))
    analysis_dir = paths.analysis
    analysis = None
    if (analysis_dir / io.META).is_file():
        analysis = io.read_meta(analysis_dir, "analysis", verify=False)
        io.check_input(analysis, "causal", causal, str(analysis_dir))
    facts = io.read_parquet(paths.causal / "facts.parquet")
    curve, chance = None, 0.0
    if (paths.reading / io.META).is_file():  # the reading step (the workflow always runs it)
        made = io.read_meta(paths.reading, "reading")
        for m in MODELS:
            io.check_input(made, f"model_{m}", models[m], str(paths.reading))
        curve = io.read_parquet(paths.reading / reading.TABLE)
        cands = io.read_parquet(paths.facts / "candidates.parquet")
        chance = 1.0 / int(cands.groupby("fact_id").size().max())
    return _Inputs(causal, models, facts, analysis, curve, chance)


def _optional_sections(cfg: dict[str, Any], paths: Paths, out_dir: Path) -> list[_Section]:
    """Fidelity, the three suites, the summary over replicates and the random twins, in the
    report's order (a section that has nothing to show is left out)."""
    fidelity_text, fidelity_input = sections.fidelity_section(paths)
    out = [_Section(fidelity_text, fidelity_input, [])]
    out += [_Section(*suite.section(paths, out_dir)) for suite in SUITES]
    out.append(_Section(*sections.replicates_section(cfg, paths), []))
    out.append(_Section(*random_report.section(cfg, paths)))
    return [s for s in out if s.text or s.inputs or s.figures]


def _hashes(cfg: dict[str, Any], paths: Paths, inp: _Inputs) -> dict[str, str]:
    """The run's artifact hashes the report closes with."""
    shared = {
        stage: io.read_meta(getattr(paths, stage), stage, verify=False)["hash"]
        for stage in ("facts", "corpus", "tokenizer")
    }
    hashes = {
        "config (study)": study_hash(cfg),
        **shared,
        **{
            f"stream {m}": io.read_meta(paths.stream(m), "stream", verify=False)["hash"]
            for m in MODELS
        },
        **{f"model {m}": inp.models[m]["hash"] for m in MODELS},
        "causal": inp.causal["hash"],
    }
    if inp.analysis is not None:
        hashes["analysis"] = inp.analysis["hash"]
    return hashes


def _title_lines(inp: _Inputs) -> list[str]:
    info = inp.models["A"]["info"]
    return [
        "# plantbench study report",
        "",
        f"{len(inp.facts)} planted facts, two twins of {info['params']:,} parameters each, "
        f"{info['tokens']:,} training tokens per model.",
        "",
    ]


def _learned_lines(inp: _Inputs) -> list[str]:
    facts = inp.facts
    return [
        "## Which facts the twins learned",
        "",
        "A fact is learned when its causal effect is positive (the reading model gives the answer "
        "more log-probability than the model that never read it) and the reading model ranks the "
        "true answer first among the candidates. Cells show the learned rate and (number of "
        "facts).",
        "",
        markdown_table(tables.learned_table(facts)),
        "",
        f"Mean causal effect: {facts['effect'].mean():+.3f} nats; "
        f"facts with a positive effect: {100 * (facts['effect'] > 0).mean():.0f}%.",
        "",
    ]


def warning_lines(paths: Paths) -> list[str]:
    """A section listing the data steps' warnings (a corpus source that contributed nothing, a
    vocabulary smaller than asked), none when there are none."""
    found = [
        f"- {stage}: {line}"
        for stage in ("corpus", "tokenizer")
        for line in (io.peek_meta(getattr(paths, stage)) or {}).get("info", {}).get("warnings", [])
    ]
    return ["## Warnings", "", *found, ""] if found else []


def _closing_lines(inp: _Inputs, hashes: dict[str, str]) -> list[str]:
    info = {m: inp.models[m]["info"] for m in MODELS}
    reading_lines = [
        "Reading rate at the fork and at every checkpoint: the twin's true answer ranks first "
        "with the fact's sentence among the context's segments, on the facts that twin never "
        "read (data: `reading/reading_curve.parquet`).",
        "",
        "![reading curve](reading_curve.png)",
        "",
    ]
    return [
        "## Pretraining",
        "",
        "![loss curves](loss_curves.png)",
        "",
        *(reading_lines if inp.curve is not None else []),
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


def run(cfg: dict[str, Any], paths: Paths) -> Path:
    """Write ``report/``: report.md, report.html, the figures and the folder's meta.json."""
    inp = _read_inputs(paths)
    out_dir = paths.report
    out_dir.mkdir(parents=True, exist_ok=True)
    figures.loss_figure(paths, out_dir / "loss_curves.png")
    if inp.curve is not None:
        figures.reading_figure(inp.curve, inp.chance, out_dir / "reading_curve.png")
    graded = NOT_GRADED
    if inp.analysis is not None:
        graded = sections.analysis_sections(paths, out_dir, paper=figures.is_paper(cfg))
    optional = _optional_sections(cfg, paths, out_dir)
    found = findings.evaluate(cfg, paths)
    io.write_csv(out_dir / FINDINGS_CSV, found)
    lines = [
        *_title_lines(inp),
        sections.findings_section(found),
        *_learned_lines(inp),
        sections.recipe_line(inp.causal),
        sections.in_context_section(paths, inp.causal),
        graded,
        *[s.text for s in optional if s.text],
        *warning_lines(paths),
        *_closing_lines(inp, _hashes(cfg, paths, inp)),
    ]
    inputs = {
        "causal": inp.causal["hash"],
        **{f"model_{m}": inp.models[m]["hash"] for m in MODELS},
        **({"analysis": inp.analysis["hash"]} if inp.analysis is not None else {}),
    }
    for s in optional:
        inputs.update(s.inputs)
    extra = [f for s in optional for f in s.figures]
    return write_outputs(cfg, out_dir, "\n".join(lines), inputs, extra, [FINDINGS_CSV])


def write_outputs(
    cfg: dict[str, Any],
    out_dir: Path,
    md: str,
    inputs: dict[str, str],
    extra_figures: list[str] | None = None,
    tables: list[str] | None = None,
) -> Path:
    """report.md, its HTML rendering and the folder's meta.json (the figures and ``tables``,
    files in ``out_dir``, are written)."""
    path = out_dir / "report.md"
    io.write_text(path, md)
    io.write_text(out_dir / HTML_NAME, markdown_html(md, out_dir))
    written = [
        *(f for f in figures.TRAINING_FIGURES if f"]({f})" in md),  # the ones the report shows
        *(figures.FIGURES if "analysis" in inputs else ()),
        *(extra_figures or []),
    ]
    io.write_meta(
        out_dir,
        "report",
        ["report.md", HTML_NAME, *(tables or []), *written],
        config_hash=study_hash(cfg),
        inputs=inputs,
        info={"figures": written, "graded": "analysis" in inputs},
    )
    return path
