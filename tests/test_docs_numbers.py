"""The numbers in the guide pages that follow from the config and the code agree with them.

Each check reads one number from a page with a pattern anchored on the words around it and
compares it with what ``config.yaml``, the presets and the registries give (issue 48: the docs
said 6,120 documents where the grid made 3,060, five context methods where seven were
registered, 15,288 projected dimensions where the paper preset used 15,360). Every occurrence of
a pattern must agree, and a pattern that no longer matches fails too: reword the sentence and the
check together. Measurements are not checked: they live on dated pages under ``docs/results/``
(a snapshot of one commit and one machine), which this test does not read.

Fast: the configs, the facts tables of the default grid (about a second), the plan's arithmetic
and a model built on the meta device; nothing trains.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from plantbench import config, layout
from plantbench.paths import MODELS

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "workflow" / "presets" / "paper.yaml"
REHEARSAL = ROOT / "workflow" / "presets" / "rehearsal.yaml"

WORDS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve".split()
    )
}


def _page(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def _value(text: str) -> float:
    """``3,060`` / ``seven`` / ``6e-4`` / ``5.00`` as a number."""
    t = text.strip().lower()
    if t in WORDS:
        return WORDS[t]
    return float(t.replace(",", ""))


def _numbers(rel: str, pattern: str) -> list[tuple[float, ...]]:
    """Every match of ``pattern`` (whitespace in it matches any run of whitespace, line breaks
    included) in the page, as a tuple of its groups' numbers; at least one match."""
    rx = re.compile(re.sub(r"(\\ |\s)+", r"\\s+", pattern))
    found = [tuple(_value(g) for g in m.groups()) for m in rx.finditer(_page(rel))]
    assert found, f"{rel}: no sentence matches {pattern!r} any more; update this check with it"
    return found


def _check(rel: str, pattern: str, expected: tuple[float, ...] | float) -> None:
    want = expected if isinstance(expected, tuple) else (expected,)
    for got in _numbers(rel, pattern):
        assert got == pytest.approx(want), f"{rel}: {pattern!r} says {got}, the code gives {want}"


# --------------------------------------------------------------------------- the facts


@pytest.fixture(scope="module")
def default() -> dict[str, Any]:
    return config.load([ROOT / "config.yaml"])


@pytest.fixture(scope="module")
def paper() -> dict[str, Any]:
    return config.load([ROOT / "config.yaml", PAPER])


@pytest.fixture(scope="module")
def rehearsal() -> dict[str, Any]:
    return config.load([ROOT / "config.yaml", PAPER, REHEARSAL])


@pytest.fixture(scope="module")
def tables(default: dict[str, Any]) -> dict[str, Any]:
    """The default grid's facts tables, made by the facts step's own generator."""
    from plantbench.data import facts

    return facts.build(default)


def _block_linears(cfg: dict[str, Any]) -> tuple[int, int]:
    """(block linears, their weights) of the configured model, built on the meta device (no
    memory, no initialisation cost) and counted by the gradient capture's own selection."""
    import torch
    from transformers import LlamaForCausalLM

    from plantbench.model import modeling

    lc = modeling.llama_config(
        cfg["model"], int(cfg["tokenizer"]["vocab_size"]), int(cfg["stream"]["window"]),
        bos=0, eos=1, pad=2,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(lc)
    names = modeling.block_linear_names(model)
    mods = dict(model.named_modules())
    return len(names), sum(mods[n].weight.numel() for n in names)


def _grad_dims(cfg: dict[str, Any]) -> int:
    from plantbench.ops import plan

    return plan.grad_dims(cfg)


def _methods() -> list[str]:
    """The built-in methods (plug-ins an earlier test registered are not counted)."""
    from plantbench.config import builtin_methods

    return list(builtin_methods())


def _context_methods() -> list[str]:
    from plantbench.suites.context.methods import registry

    return registry.names()


# --------------------------------------------------------------------------- the default study


def test_workflow_facts_row(default: dict[str, Any], tables: dict[str, Any]) -> None:
    """docs/workflow.md's facts row: facts and the grid that makes them, documents, styles,
    distractors, query forms, candidates."""
    from plantbench.data.facts import FORMS, STYLES

    f = default["facts"]
    page = "docs/workflow.md"
    grid = (
        r"(\d+) invented facts \((\d+) domains x (\d+) frequencies x (\d+) positions x "
        r"(\d+) twins x (\d+)\)"
    )
    n_facts = len(tables["facts"])
    assert n_facts == layout.n_facts(default)
    _check(
        page,
        grid,
        (n_facts, len(f["domains"]), len(f["n_docs"]), len(f["positions"]), len(MODELS),
         f["facts_per_cell"]),
    )  # fmt: skip
    # documents per study: every planted document of both twins (the pool's planted windows
    # are one twin's)
    docs = len(tables["documents"])
    assert docs == len(MODELS) * layout.pool_counts(default)["planted"]
    _check(page, r"([\d,]+) documents in (\w+) styles per domain", (docs, len(STYLES["world"])))
    assert len({len(s) for s in STYLES.values()}) == 1, "the page says one count for all domains"
    got = _numbers(page, r"styles per domain \((\d+) / (\d+) / (\d+) / (\d+) per fact\)")
    assert all(g == tuple(f["n_docs"]) for g in got)
    distractors = len(tables["distractors"])
    assert distractors == layout.pool_counts(default)["distractor"]
    _check(page, r"([\d,]+) distractors, (\d+) query forms", (distractors, len(FORMS)))
    per_fact = tables["candidates"].groupby("fact_id").size()
    assert set(per_fact) == {f["candidates"]}
    _check(page, r"(\d+) candidates per fact", f["candidates"])


def test_workflow_stage_numbers(default: dict[str, Any]) -> None:
    """docs/workflow.md's other stage rows: tokenizer, pool, gradient dims, fidelity, haystack,
    the suites."""
    from plantbench.suites.grounding import settings as grounding

    page = "docs/workflow.md"
    _check(page, r"byte-level BPE \(([\d,]+) tokens\)", default["tokenizer"]["vocab_size"])
    _check(
        page, r"\+ ([\d,]+) seeded background windows", layout.pool_counts(default)["background"]
    )
    _check(page, r"count sketch of the exact gradients, ([\d,]+) dims", _grad_dims(default))
    _check(page, r"on (\d+) seeded pool windows", layout.fidelity_windows(default))
    (k,) = layout.sweep_dims(default)
    (d,) = layout.sketch_sweep_dims(default)
    _check(page, r"at LoGra (\d+) × (\d+) and a sketch of ([\d,]+) dims", (k, k, d))
    _check(
        page,
        r"default (\d+)% / (\d+)% / (\d+)%\)",
        tuple(100 * x for x in config.haystack_fractions(default)),
    )
    _check(page, r"(\w+) context-attribution methods under each twin", len(_context_methods()))
    _check(
        page,
        r"contexts of atomic sentences in (\d+) segments",
        grounding.settings(default).segments,
    )


def test_workflow_paper_memory(paper: dict[str, Any]) -> None:
    """docs/workflow.md's memory paragraph: the paper preset's model rules ask the plan's per-job
    memory plus a quarter (workflow/rules/config.smk, plan_mem_mb)."""
    from plantbench.ops import plan

    stages = plan.plan(paper)
    gb = [round(plan.rule_mem_mb(stages, s, 0) / 1000) for s in ("grads", "ekfac")]
    _check(
        "docs/workflow.md",
        r"paper preset's grads jobs ask for (\d+) GB and EK-FAC for (\d+) GB",
        tuple(gb),
    )


def test_readme_methods(default: dict[str, Any]) -> None:
    """README: the methods graded by default, the registered ones, the context suite's."""
    from plantbench.attribution.methods import registry

    enabled = list(default["methods"]["enabled"])
    assert "ekfac" in enabled
    _check(
        "README.md", r"the seed's (\w+) attribution methods and EK-FAC influence", len(enabled) - 1
    )
    _check("README.md", r"The (\w+) built-in methods", len(_methods()))
    _check("README.md", r"\(`plantbench methods`; (\w+) enabled by default\)", len(enabled))
    assert registry.enabled(default) == enabled  # no plug-in in the default config
    _check("README.md", r"context attribution with\s+(\w+) methods", len(_context_methods()))


def test_suites_context_methods(default: dict[str, Any]) -> None:
    """docs/suites.md: the context suite's method count and its prompt passes per twin (2^k
    ablations a context while 2^k fits the lattice, one context per query)."""
    from plantbench.suites.context import settings

    st = settings.settings(default)
    assert len(st.methods) == len(_context_methods())  # the default runs every registered one
    _check("docs/suites.md", r"There are (\w+) methods", len(_context_methods()))
    queries = len(MODELS) * layout.n_facts(default)
    assert 2**st.segments <= st.lattice
    _check(
        "docs/suites.md",
        r"(\d+) prompt passes per context at k = (\d+), ([\d,]+) per twin",
        (2**st.segments, st.segments, 2**st.segments * queries),
    )


def test_methods_page(default: dict[str, Any], paper: dict[str, Any]) -> None:
    """docs/methods.md: the seed's methods, the default's block linears and sketch D, LoGra's
    default D, EK-FAC's query chunks at the paper size."""
    n_mod, _ = _block_linears(default)
    page = "docs/methods.md"
    enabled = list(default["methods"]["enabled"])
    _check(page, r"The first (\w+) are the seed's", len(enabled) - 1)
    _check(
        page, r"every `nn.Linear` in the transformer blocks \((\d+) in the default model\)", n_mod
    )
    _check(
        page,
        r"`features.grad_dims` = ([\d,]+) buckets that all (\d+)\s+layers share",
        (_grad_dims(default), n_mod),
    )
    f = default["features"]
    _check(
        page,
        r"\(`grad_k_out` × `grad_k_in`, (\d+) × (\d+) = ([\d,]+) dims\)",
        (f["grad_k_out"], f["grad_k_in"], n_mod * f["grad_k_out"] * f["grad_k_in"]),
    )
    _, weights = _block_linears(paper)
    n_q = len(MODELS) * layout.n_facts(paper)
    chunks = layout.ekfac_query_chunks(n_q, weights, layout.ekfac_memory_bytes(paper))
    _check(page, r"one\s+chunk in the default study, (\d+) at the paper size", len(chunks))


# --------------------------------------------------------------------------- the paper preset


def test_readme_paper_preset(paper: dict[str, Any]) -> None:
    """README's paper-scale paragraph against workflow/presets/paper.yaml."""
    m, t, page = paper["model"], paper["train"], "README.md"
    tokens_per_step = t["batch_windows"] * paper["stream"]["window"]
    _check(
        page,
        r"(\d+) layers, width (\d+), ([\d,]+)-token\s+windows, (\d+)k tokenizer",
        (m["n_layer"], m["n_embd"], paper["stream"]["window"], paper["tokenizer"]["vocab_size"] / 1024),
    )  # fmt: skip
    _check(
        page,
        r"(\d+) windows \(([\d,]+) tokens\) per step, ([\d,]+) steps \(([\d.]+)B tokens\)",
        (t["batch_windows"], tokens_per_step, t["steps"],
         round(t["steps"] * tokens_per_step / 1e9, 2)),
    )  # fmt: skip
    _check(page, r"lr ([\d.e-]+) cosine to ([\d.e-]+)", (t["lr"], t["lr"] * t["min_lr_ratio"]))
    _check(page, r"a checkpoint every ([\d,]+) steps", t["checkpoint_every_steps"])
    _check(page, r"TracIn over (\d+)\s+checkpoints", len(layout.tracin_checkpoints(paper)))
    n_mod, _ = _block_linears(paper)
    assert paper["features"]["projection"] == "sketch"
    _check(
        page,
        r"count sketch of the (\d+) block linears' gradients into D = ([\d,]+) dimensions",
        (n_mod, _grad_dims(paper)),
    )
    _check(
        page,
        r"(\d+)\s+facts with ([\d,]+) planted documents",
        (layout.n_facts(paper), len(MODELS) * layout.pool_counts(paper)["planted"]),
    )
    _check(page, r"\+ ([\d,]+) background windows", layout.pool_counts(paper)["background"])


def test_readme_rehearsal(rehearsal: dict[str, Any]) -> None:
    """README's rehearsal paragraph against workflow/presets/rehearsal.yaml over the paper
    preset, and the D that tests/test_rehearsal.py shrinks the sketch to."""
    m, t, page = rehearsal["model"], rehearsal["train"], "README.md"
    _check(
        page,
        r"width (\d+), (\d+) heads, SwiGLU ([\d,]+), vocabulary ([\d,]+), ([\d,]+)-token windows, "
        r"the ([\d,]+)-dim\s+count sketch",
        (m["n_embd"], m["n_head"], m["intermediate"], m["vocab_size"],
         rehearsal["stream"]["window"], _grad_dims(rehearsal)),
    )  # fmt: skip
    n_facts = layout.n_facts(rehearsal)
    _, weights = _block_linears(rehearsal)
    n_q = len(MODELS) * n_facts
    chunks = layout.ekfac_query_chunks(n_q, weights, layout.ekfac_memory_bytes(rehearsal))
    _check(
        page,
        r"(\d+) layer, (\d+) steps of (\d+) windows, (\d+) facts \((\d+)\s+queries\), a (\d+)-window "
        r"pool in (\d+) feature shards, EK-FAC in (\d+) query chunks",
        (m["n_layer"], t["steps"], t["batch_windows"], n_facts, n_q, layout.pool_size(rehearsal),
         layout.n_shards(rehearsal), len(chunks)),
    )  # fmt: skip
    shrunk = re.search(r'"grad_dims":\s*(\d+)', _page("tests/test_rehearsal.py"))
    assert shrunk is not None
    _check(page, r"runs it with the sketch's D\s+at ([\d,]+)", int(shrunk.group(1)))


# --------------------------------------------------------------------------- benchmarks


def test_benchmarks_peer_side(default: dict[str, Any]) -> None:
    """docs/benchmarks.md: the peers' per-layer side at our D (their D = modules x p^2) and the
    larger sides bergson also runs."""
    from plantbench.ops.bench import peers

    n_mod, _ = _block_linears(default)
    d = _grad_dims(default)
    p = peers.peer_side(d, n_mod)
    _check(
        "docs/benchmarks.md",
        r"at our D = ([\d,]+) over the (\d+) block linears they run p = (\d+) per layer\s+"
        r"\(D = ([\d,]+)\)",
        (d, n_mod, p, n_mod * p * p),
    )
    _check(
        "docs/benchmarks.md",
        r"bergson at (\d+) × \d+ and\s+(\d+) × \d+ per layer",
        tuple(peers.LARGER_SIDES),
    )


# --------------------------------------------------------------------------- the README itself


def test_readme_is_a_guide() -> None:
    """Issue 48: the README is a guide of at most 250 lines; measurements live on dated pages."""
    lines = _page("README.md").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in text.splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page: str) -> None:
    """Every relative link of the README and docs/ names a file that exists and, with a
    #fragment, a heading of that file (pages move; their links must follow)."""
    src = ROOT / page
    bad = []
    for target in LINK.findall(src.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, frag = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif frag and dest.suffix == ".md" and frag not in _anchors(dest.read_text("utf-8")):
            bad.append(f"{target} (no such heading)")
    assert not bad, f"{page}: broken links: {bad}"
