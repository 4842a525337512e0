"""The seeds' findings, stated once and checked against every run's own tables.

Each finding is one registered entry (:func:`finding`): a stable id (``003.bm25_best_ap``), the
statement, the seed's number as the seed gives it, a line (threshold) with the side of it the
finding claims (``above``, ``below`` or ``within`` a band) and where the line comes from in the
seed's own words, and a function from the run's tables to one or more measurements (a number
with a low and a high end of its 95% interval). The lines are derived from the seeds' words,
beside each finding in its seed's module (``seed003``, ``seed000``, ``seed001``, ``seed002``)
and nowhere else; none is fitted to this project's results.

Verdict of one measurement: ``reproduced`` when its whole interval is strictly on the finding's
side of the line, ``not reproduced`` when it is wholly on the other side, ``inconclusive`` when
it straddles or touches the line. A finding with several measurements (one per method, per twin)
claims them all: reproduced when every one is, not reproduced when any one is, else inconclusive;
the row shows the measurement that decides. ``not testable``: a table, suite or method it needs
is absent from the run (the row says which), or its number is undefined there.

Intervals: the analysis's own bootstrap where a table carries one (``correlations.csv``'s
``*_lo`` / ``*_hi``, the suites' ``lo`` / ``hi``); elsewhere a seeded percentile bootstrap of
facts resampled within their cells (:func:`plantbench.grading.metrics.resample_within_cells`,
the config's ``seed``, ``analysis.bootstrap`` resamples and ``analysis.alpha``, tag
``findings/<id>``), paired when a finding compares two methods on the same facts.

:func:`evaluate` reads a run (every replicate when the config has several: ``holds`` = in how
many the finding is reproduced); :func:`evaluate_tables` is the same on tables given directly.

Modules: ``core`` (verdict rules, the registry, the measures' shared pieces), ``tables`` (reading
a run, evaluating the registry), one module per seed. A new finding is one registered function
in its seed's module.
"""

from __future__ import annotations

from plantbench.grading.findings.core import (
    CELLS,
    GRADIENT_METHODS,
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    PLAIN_GRADIENT,
    REPRODUCED,
    SEED_METHODS,
    TABLES,
    VERDICTS,
    Finding,
    Line,
    Measure,
    Measurement,
    NotTestable,
    RunTables,
    Side,
    Stat,
    combine,
    finding,
    margin,
    registered,
    verdict,
)
from plantbench.grading.findings.tables import (
    COLUMNS,
    Run,
    evaluate,
    evaluate_tables,
    holds,
    line_text,
    read_tables,
    replicate_runs,
    this_run,
    verdict_counts,
)

# isort: off
# importing a seed's module registers its findings; this order (003 first) is the report's
from plantbench.grading.findings import seed003  # noqa: F401
from plantbench.grading.findings import seed000  # noqa: F401
from plantbench.grading.findings import seed001  # noqa: F401
from plantbench.grading.findings import seed002  # noqa: F401

# isort: on

FINDINGS: tuple[Finding, ...] = registered()

__all__ = [
    "CELLS",
    "COLUMNS",
    "FINDINGS",
    "GRADIENT_METHODS",
    "INCONCLUSIVE",
    "NOT_REPRODUCED",
    "NOT_TESTABLE",
    "PLAIN_GRADIENT",
    "REPRODUCED",
    "SEED_METHODS",
    "TABLES",
    "VERDICTS",
    "Finding",
    "Line",
    "Measure",
    "Measurement",
    "NotTestable",
    "Run",
    "RunTables",
    "Side",
    "Stat",
    "combine",
    "evaluate",
    "evaluate_tables",
    "finding",
    "holds",
    "line_text",
    "margin",
    "read_tables",
    "registered",
    "replicate_runs",
    "this_run",
    "verdict",
    "verdict_counts",
]
