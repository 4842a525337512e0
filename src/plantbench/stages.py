"""The workflow's stages, one row per Snakemake rule: what each rule reads, where its
artifacts lie, and what the plan, ``verify`` and the timeline call it. No torch: the Snakefile,
the CLI and ``verify`` read it at start-up.

A row names the rule, the CLI command that runs it, the config keys its outputs depend on
(``sections``: top-level sections or dotted keys; ``key?`` is optional, counted only where the
config sets it), the rules whose artifacts it reads (``upstream``), and its artifact folders
(``places``) relative to its replicate's root (``per_replicate``) or to the results folder, as
patterns whose ``{wildcards}`` (:data:`WILDCARDS`) are the rule's: one job per value (a folder
without one is made by the rule's single job). From a row follow:

- ``folders``: the places as glob patterns; the lineage check (:mod:`plantbench.lineage`) reads
  them and walks ``upstream`` to find every artifact a step's outputs were made from, and the
  rules' params hash ``sections`` (:mod:`plantbench.runconfig`);
- :func:`artifact_of`: the row (and wildcard values) an artifact folder belongs to, so
  ``verify`` knows the stage its ``meta.json`` records (``meta_stage``) and the CLI call that
  remakes it (``command`` with :meth:`Stage.cli_args`);
- :func:`rule_of_job`: the rule a job's benchmark or log name belongs to (the job name is
  ``job`` or the rule, then the wildcards' values, joined by ``_``), for the timeline;
- ``plan_stage``: the ``plantbench plan`` row its jobs count in, or None with the reason
  (``unplanned``) for a rule the plan leaves out (:mod:`plantbench.ops.plan_measured`);
- :func:`place` and :func:`per_replicate`: where a rule's artifacts lie, with wildcard values
  filled in. The places are the one definition of the results layout: the CLI's
  :class:`plantbench.paths.Paths` and the rules files (``artifact`` in
  workflow/rules/layout.smk) build their artifact folders from them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

ALL = ("*",)  # every key of the config (the report and the steps that read the whole run)
TWINS = ("A", "B")  # the twins (plantbench.paths.MODELS)


class Wildcard(NamedTuple):
    regex: str  # the Snakefile's constraint (workflow/rules/layout.smk), a shard of any width
    glob: str
    flag: str  # the CLI argument that takes its value
    number: bool = False  # given to the CLI as a number (shard_0003 -> --shard 3)


WILDCARDS: dict[str, Wildcard] = {
    "model": Wildcard("|".join(TWINS), f"[{''.join(TWINS)}]", "--model"),
    "checkpoint": Wildcard("step_[0-9]+", "step_*", "--checkpoint"),
    "shard": Wildcard("[0-9]+", "[0-9]*", "--shard", True),
    "method": Wildcard("[a-z][a-z0-9_]*", "[a-z]*", "--method"),
    "draw": Wildcard("[0-9]+", "[0-9]*", "--draw", True),
}
_WILD = re.compile(r"\{(\w+)\}")


def _regex(pattern: str) -> str:
    """``pattern`` with each ``{wildcard}`` a named group of its constraint."""
    parts = _WILD.split(pattern)  # text, name, text, name, ..., text
    return "".join(
        f"(?P<{p}>{WILDCARDS[p].regex})" if i % 2 else re.escape(p) for i, p in enumerate(parts)
    )


@dataclass(frozen=True)
class Stage:
    rule: str
    command: str
    sections: tuple[str, ...]
    upstream: tuple[str, ...] = ()
    places: tuple[str, ...] = ()  # its artifact folders, as {wildcard} patterns
    per_replicate: bool = True
    meta: str = ""  # the stage its artifacts' meta.json records ("": the rule)
    plan: str = ""  # the plan row its jobs count in ("": the rule)
    unplanned: str = ""  # why the plan has no row for it (then ``plan_stage`` is None)
    job: str = ""  # its job name before the wildcards' values ("": the rule)
    flags: str = ""  # CLI arguments beside its wildcards' (grads_queries: ``--queries``)

    @property
    def meta_stage(self) -> str:
        return self.meta or self.rule

    @property
    def plan_stage(self) -> str | None:
        return None if self.unplanned else self.plan or self.rule

    @property
    def wildcards(self) -> tuple[str, ...]:
        """The rule's wildcards, in the order its places (and job names) give them."""
        return tuple(dict.fromkeys(w for p in self.places for w in _WILD.findall(p)))

    @property
    def folders(self) -> tuple[str, ...]:
        """The places as glob patterns (each wildcard its constraint's glob)."""
        return tuple(_WILD.sub(lambda m: WILDCARDS[m[1]].glob, p) for p in self.places)

    def match(self, name: str) -> dict[str, str] | None:
        """The wildcards' values if ``name`` is one of this rule's artifact folders."""
        for place in self.places:
            found = re.fullmatch(_regex(place), name)
            if found:
                return found.groupdict()
        return None

    def job_of(self, name: str) -> bool:
        """Whether ``name`` (a benchmark or log file's stem) is one of this rule's jobs."""
        pattern = "_".join([self.job or self.rule, *(f"{{{w}}}" for w in self.wildcards)])
        return re.fullmatch(_regex(pattern), name) is not None

    def cli_args(self, values: dict[str, str]) -> str:
        """The CLI arguments of the job that made the artifact with wildcard ``values``."""
        args = ""
        for w in self.wildcards:
            spec = WILDCARDS[w]
            args += f" {spec.flag} {int(values[w]) if spec.number else values[w]}"
        return args + self.flags


_FEATURE_RULES = (
    "grads_pool",
    "grads_queries",
    "curvature",
    "hidden",
    "embed",
    "ekfac",
    "ekfac_tracin",
    "trackstar",
)
_TWIN = ("facts", "tokenizer", "pool", "pretrain")  # what a model step on the pool reads
_CONTEXT = ("seed", "context?", "causal.context_segments?")
_GROUNDING = ("seed", "grounding?")
_MEMBERSHIP = ("seed", "membership?")
_BY_NAME = "asked for by name"


def _suite(name: str, sections: tuple[str, ...], first: Stage, twin: Stage) -> tuple[Stage, ...]:
    """A provenance suite's rules: its first step, one pass per twin, the analysis (all at the
    results folder: the suites read replicate 0's twins)."""
    analysis = Stage(
        f"{name}_analysis", f"{name}-analysis", sections, (twin.rule,), (f"{name}/analysis",), False
    )
    return first, twin, analysis


def _twin_pass(name: str, part: str, sections: tuple[str, ...], upstream: tuple[str, ...]) -> Stage:
    return Stage(
        f"{name}_{part}", f"{name}-{part}", sections, upstream, (f"{name}/{{model}}",), False
    )


def _first(
    name: str, part: str, folder: str, sections: tuple[str, ...], upstream: tuple[str, ...]
) -> Stage:
    """A suite's first step; its artifact records the stage ``<suite>_<folder>``."""
    place = (f"{name}/{folder}",)
    rule = f"{name}_{part}"
    return Stage(rule, f"{name}-{part}", sections, upstream, place, False, f"{name}_{folder}")


STAGES: tuple[Stage, ...] = (
    Stage("facts", "facts", ("seed", "facts"), (), ("facts",), False),
    Stage("corpus", "corpus", ("seed", "corpus"), (), ("corpus",), False),
    Stage(
        "tokenizer",
        "tokenizer",
        ("seed", "corpus", "tokenizer"),
        ("corpus",),
        ("tokenizer",),
        False,
    ),
    Stage(
        "stream",
        "stream",
        (
            "seed",
            "facts",
            "corpus",
            "tokenizer",
            "stream",
            "train.steps",
            "train.batch_windows",
            "train.prefix_steps?",
            "causal.context_segments?",
        ),
        ("facts", "corpus", "tokenizer"),
        tuple(f"stream/{m}" for m in TWINS),  # one job makes both
    ),
    Stage(
        "pretrain_prefix",
        "prefix",
        ("seed", "model", "train"),
        ("stream", "tokenizer"),
        ("models/prefix",),
        meta="prefix",
    ),
    Stage(
        "pretrain",
        "pretrain",
        ("seed", "model", "train"),
        ("stream", "tokenizer", "pretrain_prefix"),
        ("models/{model}",),
    ),
    Stage("causal", "causal", ("causal",), ("facts", "pretrain"), ("causal",)),
    Stage("reading", "reading", ("causal",), ("facts", "pretrain"), ("reading",)),
    Stage("pool", "pool", ("seed", "pool"), ("stream",), ("pool/{model}",)),
    Stage(
        "grads_pool",
        "grads",
        ("features",),
        ("pool", "pretrain"),
        ("features/{model}/grads/{checkpoint}/pool/shard_{shard}",),
        meta="grads",
        plan="grads",
    ),
    Stage(
        "grads_queries",
        "grads",
        ("features",),
        ("facts", "pretrain"),
        ("features/{model}/grads/{checkpoint}/queries",),
        meta="grads",
        plan="grads",
        flags=" --queries",
    ),
    Stage(
        "curvature",
        "curvature",
        ("features", "curvature"),
        ("grads_pool",),
        ("features/{model}/curvature/{checkpoint}",),
    ),
    Stage("hidden", "hidden", ("features",), _TWIN, ("features/{model}/hidden",)),
    Stage(
        "embed_shared",
        "embed-shared",
        ("features",),
        ("pool", "facts", "tokenizer"),
        ("features/shared/embed",),
        plan="embed",
    ),
    Stage(
        "embed",
        "embed",
        ("features",),
        ("pool", "embed_shared", "facts", "tokenizer"),
        ("features/{model}/embed",),
    ),
    Stage(
        "score",
        "score",
        ("scoring", "features", "curvature", "analysis.haystack?"),
        (*_TWIN, *_FEATURE_RULES),
        ("scores/{method}/{model}",),
        meta="scores",
    ),
    Stage(
        "ekfac",
        "ekfac",
        ("features.batch_windows", "curvature.damping_ratio"),
        (*_TWIN, "grads_pool"),
        ("features/{model}/ekfac",),
    ),
    Stage(
        "ekfac_tracin",
        "ekfac",
        ("features.batch_windows", "curvature.damping_ratio"),
        (*_TWIN, "grads_pool"),
        ("features/{model}/ekfac_tracin/{checkpoint}",),
        meta="ekfac",
        job="ekfac",
    ),
    Stage(
        "trackstar",
        "trackstar",
        ("features",),
        _TWIN,
        ("features/{model}/trackstar",),
        unplanned="off by default (methods.enabled without trackstar)",
    ),
    Stage(
        "fidelity",
        "fidelity",
        ("features", "curvature", "fidelity?"),
        (*_TWIN, "grads_pool", "grads_queries", "curvature"),
        ("fidelity/{model}",),
    ),
    Stage(
        "analysis",
        "analysis",
        ("analysis", "methods"),
        ("causal", "score"),
        ("analysis",),
        plan="analysis+report",
    ),
    Stage(
        "replicates",
        "replicates",
        ("replicates?", "analysis", "methods"),
        ("analysis",),
        ("replicates/summary",),
        False,
        unplanned="the summary over replicates (replicates > 1): small tables",
    ),
    Stage(
        "random_twin",
        "random-twin",
        ("seed", "model", "train", "random_twins.seed?"),
        ("stream", "tokenizer", "pretrain_prefix", "facts"),
        ("models/random/{draw}",),
        False,
        meta="pretrain",
    ),
    Stage(
        "random_effect",
        "random-effect",
        ("random_twins?", "causal", "analysis", "methods"),
        ("random_twin", "causal", "analysis", "score"),
        ("random",),
        False,
    ),
    *_suite(
        "context",
        _CONTEXT,
        _first("context", "build", "contexts", _CONTEXT, ("facts", "causal", "tokenizer")),
        _twin_pass("context", "attribute", _CONTEXT, ("context_build", "pretrain")),
    ),
    *_suite(
        "grounding",
        _GROUNDING,
        _first("grounding", "build", "contexts", _GROUNDING, ("facts", "causal", "tokenizer")),
        _twin_pass("grounding", "respond", _GROUNDING, ("grounding_build", "pretrain")),
    ),
    *_suite(
        "membership",
        _MEMBERSHIP,
        _first("membership", "samples", "samples", _MEMBERSHIP, ("facts", "causal")),
        _twin_pass(
            "membership",
            "detect",
            (*_MEMBERSHIP, "features.encoder"),
            ("membership_samples", "pretrain", "tokenizer"),
        ),
    ),
    Stage(
        "report",
        "report",
        ALL,
        (
            "causal",
            "reading",
            "pretrain",
            "analysis",
            "replicates",
            "fidelity",
            "context_analysis",
            "grounding_analysis",
            "membership_analysis",
        ),
        ("report",),
        False,
        plan="analysis+report",
    ),
    Stage(
        "verify",
        "verify",
        ALL,
        ("report",),
        (),
        False,
        unplanned=f"a recheck of a finished run's hashes, {_BY_NAME}",
    ),
    Stage("bench", "bench", ALL, (), (), False, unplanned=f"this machine's benchmark, {_BY_NAME}"),
    Stage(
        "export",
        "export",
        ALL,
        ("facts", "tokenizer", "causal", "stream", "pool", "pretrain", "score"),
        ("export",),
        False,
        unplanned=f"the release bundle of a finished run, {_BY_NAME}",
    ),
)

BY_RULE: dict[str, Stage] = {s.rule: s for s in STAGES}


def place(rule: str, index: int = 0, **values: str) -> str:
    """``rule``'s artifact folder ``index`` (its row's ``places``), each wildcard given a value
    filled in and the others left as ``{name}`` (Snakemake's wildcard syntax): the one
    definition of the results layout, read by :class:`plantbench.paths.Paths` and by the rules
    (``artifact`` in workflow/rules/layout.smk). Relative to the replicate's root when
    :func:`per_replicate`, else to the results folder."""
    pattern = BY_RULE[rule].places[index]
    unknown = sorted(set(values) - set(_WILD.findall(pattern)))
    if unknown:
        raise ValueError(f"{rule}'s place '{pattern}' has no wildcard {unknown}")
    return _WILD.sub(lambda m: values.get(m[1], m[0]), pattern)


def per_replicate(rule: str) -> bool:
    """Whether ``rule``'s places lie in each replicate's root (else in the results folder)."""
    return BY_RULE[rule].per_replicate


def rule_of_command(
    command: str, *, queries: bool = False, checkpoint: str | None = None
) -> str | None:
    """The rule a CLI command runs (None: a command that is no workflow step)."""
    if command == "grads":
        return "grads_queries" if queries else "grads_pool"
    if command == "ekfac":
        return "ekfac_tracin" if checkpoint else "ekfac"
    rules = [s.rule for s in STAGES if s.command == command]
    return rules[0] if rules else None


def upstream_closure(rule: str) -> list[str]:
    """Every rule whose artifacts ``rule``'s outputs were made from, nearest first, each once."""
    seen: list[str] = []
    todo = list(BY_RULE[rule].upstream)
    while todo:
        r = todo.pop(0)
        if r not in seen:
            seen.append(r)
            todo += BY_RULE[r].upstream
    return seen


def artifact_of(name: str) -> tuple[Stage, dict[str, str]] | None:
    """The row whose places hold the artifact folder ``name`` (relative to its replicate's
    root), with the wildcards' values; None: no rule makes such a folder."""
    for stage in STAGES:
        values = stage.match(name)
        if values is not None:
            return stage, values
    return None


def rule_of_job(name: str) -> str | None:
    """The rule whose job has the benchmark or log name ``name`` (a file's stem, e.g.
    ``grads_pool_A_step_0000080_0000``); None: no rule's."""
    return next((s.rule for s in STAGES if s.job_of(name)), None)
