"""The workflow's stages, one row per Snakemake rule: what each rule reads and where its
artifacts lie. No torch: the Snakefile, the CLI and ``verify`` read it at start-up.

A row names the rule, the CLI command that runs it, the config keys its outputs depend on
(``sections``: top-level sections or dotted keys; ``key?`` is optional, counted only where the
config sets it), the rules whose artifacts it reads (``upstream``), and its artifact folders as
glob patterns (``folders``) relative to its replicate's root (``per_replicate``) or to the
results folder. The lineage check (:mod:`plantbench.lineage`) walks ``upstream`` to find every
artifact a step's outputs were made from, and the rules' params hash ``sections``
(:mod:`plantbench.runconfig`).
"""

from __future__ import annotations

from dataclasses import dataclass

ALL = ("*",)  # every key of the config (the report and the steps that read the whole run)


@dataclass(frozen=True)
class Stage:
    rule: str
    command: str
    sections: tuple[str, ...]
    upstream: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()
    per_replicate: bool = True


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
_TWINS = ("A", "B")


def _suite(name: str, sections: tuple[str, ...], first: Stage, twin: Stage) -> tuple[Stage, ...]:
    """A provenance suite's rules: its first step, one pass per twin, the analysis (all at the
    results folder: the suites read replicate 0's twins)."""
    analysis = Stage(
        f"{name}_analysis", f"{name}-analysis", sections, (twin.rule,), (f"{name}/analysis",), False
    )
    return first, twin, analysis


def _twin_pass(name: str, part: str, sections: tuple[str, ...], upstream: tuple[str, ...]) -> Stage:
    folders = tuple(f"{name}/{m}" for m in _TWINS)
    return Stage(f"{name}_{part}", f"{name}-{part}", sections, upstream, folders, False)


def _first(
    name: str, part: str, folder: str, sections: tuple[str, ...], upstream: tuple[str, ...]
) -> Stage:
    return Stage(
        f"{name}_{part}", f"{name}-{part}", sections, upstream, (f"{name}/{folder}",), False
    )


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
        ("stream/A", "stream/B"),
    ),
    Stage(
        "pretrain_prefix",
        "prefix",
        ("seed", "model", "train"),
        ("stream", "tokenizer"),
        ("models/prefix",),
    ),
    Stage(
        "pretrain",
        "pretrain",
        ("seed", "model", "train"),
        ("stream", "tokenizer", "pretrain_prefix"),
        ("models/A", "models/B"),
    ),
    Stage("causal", "causal", ("causal",), ("facts", "pretrain"), ("causal",)),
    Stage("reading", "reading", ("causal",), ("facts", "pretrain"), ("reading",)),
    Stage("pool", "pool", ("seed", "pool"), ("stream",), ("pool/A", "pool/B")),
    Stage(
        "grads_pool",
        "grads",
        ("features",),
        ("pool", "pretrain"),
        ("features/*/grads/*/pool/shard_*",),
    ),
    Stage(
        "grads_queries",
        "grads",
        ("features",),
        ("facts", "pretrain"),
        ("features/*/grads/*/queries",),
    ),
    Stage(
        "curvature",
        "curvature",
        ("features", "curvature"),
        ("grads_pool",),
        ("features/*/curvature/*",),
    ),
    Stage("hidden", "hidden", ("features",), _TWIN, ("features/A/hidden", "features/B/hidden")),
    Stage(
        "embed_shared",
        "embed-shared",
        ("features",),
        ("pool", "facts", "tokenizer"),
        ("features/shared/embed",),
    ),
    Stage(
        "embed",
        "embed",
        ("features",),
        ("pool", "embed_shared", "facts", "tokenizer"),
        ("features/A/embed", "features/B/embed"),
    ),
    Stage(
        "score",
        "score",
        ("scoring", "features", "curvature", "analysis.haystack?"),
        (*_TWIN, *_FEATURE_RULES),
        ("scores/*/*",),
    ),
    Stage(
        "ekfac",
        "ekfac",
        ("features.batch_windows", "curvature.damping_ratio"),
        (*_TWIN, "grads_pool"),
        ("features/A/ekfac", "features/B/ekfac"),
    ),
    Stage(
        "ekfac_tracin",
        "ekfac",
        ("features.batch_windows", "curvature.damping_ratio"),
        (*_TWIN, "grads_pool"),
        ("features/*/ekfac_tracin/*",),
    ),
    Stage(
        "trackstar",
        "trackstar",
        ("features",),
        _TWIN,
        ("features/A/trackstar", "features/B/trackstar"),
    ),
    Stage(
        "fidelity",
        "fidelity",
        ("features", "curvature", "fidelity?"),
        (*_TWIN, "grads_pool", "grads_queries", "curvature"),
        ("fidelity/A", "fidelity/B"),
    ),
    Stage("analysis", "analysis", ("analysis", "methods"), ("causal", "score"), ("analysis",)),
    Stage(
        "replicates",
        "replicates",
        ("replicates?", "analysis", "methods"),
        ("analysis",),
        ("replicates/summary",),
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
    ),
    Stage("verify", "verify", ALL, ("report",), (), False),
    Stage("bench", "bench", ALL, (), (), False),
    Stage(
        "export",
        "export",
        ALL,
        ("facts", "tokenizer", "causal", "stream", "pool", "pretrain", "score"),
        ("export",),
        False,
    ),
)

BY_RULE: dict[str, Stage] = {s.rule: s for s in STAGES}


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
