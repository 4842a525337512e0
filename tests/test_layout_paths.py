"""One definition of the results layout: the stage catalogue's places
(:func:`plantbench.stages.place`). The CLI's :class:`plantbench.paths.Paths` and the rules files
(``artifact`` in workflow/rules/layout.smk) build every artifact folder from them; no rules file
spells one."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plantbench import layout, stages
from plantbench.paths import MODELS, Paths

ROOT = Path(__file__).resolve().parents[1]
RULES = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
# a path spelled from the results folder or a replicate's root: {R}/x, {RR}x, {rep}x, {{rep}}x
ROOTED = re.compile(r"\{R\}/(\w+)|\{RR\}(\w+)|\{\{?rep\}\}?(\w+)")


def _first_parts() -> set[str]:
    """The first folder of every catalogue place (facts, models, features, context, ...)."""
    return {p.split("/")[0] for s in stages.STAGES for p in s.places}


def _spelled(text: str) -> set[str]:
    """The first folders of the rooted paths ``text`` spells that are catalogue places."""
    found = {next(g for g in m.groups() if g) for m in ROOTED.finditer(text)}
    return found & _first_parts()


def test_the_scan_sees_an_artifact_folder_spelled_in_a_rule() -> None:
    """The check below would see the old spellings (and leaves logs and benchmarks alone)."""
    assert _spelled('model=f"{RR}models/{{model}}/meta.json",') == {"models"}
    assert _spelled('expand("{R}/{{rep}}stream/{model}/meta.json", R=R)') == {"stream"}
    assert _spelled('f"{R}/facts/meta.json" f"{R}/logs/x.log" f"{RR}benchmarks/x.tsv"') == {"facts"}


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.name)
def test_no_rules_file_spells_an_artifact_folder(path: Path) -> None:
    assert _spelled(path.read_text()) == set()


# --------------------------------------------------------------------------- stages.place


def test_place_fills_the_given_wildcards_and_keeps_the_others() -> None:
    full = "features/{model}/grads/{checkpoint}/pool/shard_{shard}"
    assert stages.place("grads_pool") == full
    assert (
        stages.place("grads_pool", model="B") == "features/B/grads/{checkpoint}/pool/shard_{shard}"
    )
    assert (
        stages.place("grads_pool", model="A", checkpoint="step_0000080", shard="0003")
        == "features/A/grads/step_0000080/pool/shard_0003"
    )
    assert stages.place("stream", 1) == "stream/B"
    assert stages.place("facts") == "facts"
    assert stages.place("context_attribute", model="A") == "context/A"


def test_place_refuses_a_wildcard_its_rule_has_not() -> None:
    with pytest.raises(ValueError, match="no wildcard"):
        stages.place("pool", checkpoint="step_1")
    with pytest.raises(ValueError, match="no wildcard"):
        stages.place("stream", model="A")  # one place per twin: by index
    with pytest.raises(KeyError):
        stages.place("no_such_rule")
    with pytest.raises(IndexError):
        stages.place("stream", 2)


def test_every_filled_place_is_its_rules_artifact() -> None:
    """Filled with values, each place is an artifact folder of its own row (round trip)."""
    sample = {
        "model": "B",
        "checkpoint": "step_0000160",
        "shard": "0002",
        "method": "grad_dot",
        "draw": "007",
    }
    for s in stages.STAGES:
        for i in range(len(s.places)):
            values = {w: sample[w] for w in s.wildcards if f"{{{w}}}" in s.places[i]}
            assert stages.artifact_of(stages.place(s.rule, i, **values)) == (s, values), s.rule


def test_per_replicate_is_the_rows() -> None:
    assert not stages.per_replicate("facts")
    assert stages.per_replicate("pretrain")
    assert not stages.per_replicate("context_attribute")  # the suites read replicate 0's twins
    assert [s.rule for s in stages.STAGES if stages.per_replicate(s.rule) != s.per_replicate] == []


# --------------------------------------------------------------------------- Paths

CKPT = "step_0000080"
# each catalogue row's folder as Paths gives it, with the wildcard values and place index
FOLDERS: dict[str, tuple[Callable[[Paths], Path], dict[str, str], int]] = {
    "facts": (lambda p: p.facts, {}, 0),
    "corpus": (lambda p: p.corpus, {}, 0),
    "tokenizer": (lambda p: p.tokenizer, {}, 0),
    "stream": (lambda p: p.stream("B"), {}, 1),
    "pretrain_prefix": (lambda p: p.model("prefix"), {}, 0),
    "pretrain": (lambda p: p.model("A"), {"model": "A"}, 0),
    "causal": (lambda p: p.causal, {}, 0),
    "reading": (lambda p: p.reading, {}, 0),
    "pool": (lambda p: p.pool("B"), {"model": "B"}, 0),
    "grads_pool": (
        lambda p: p.pool_shard("A", CKPT, 3),
        {"model": "A", "checkpoint": CKPT, "shard": "0003"},
        0,
    ),
    "grads_queries": (lambda p: p.query_grads("A", CKPT), {"model": "A", "checkpoint": CKPT}, 0),
    "curvature": (
        lambda p: p.curvature("B", CKPT).parent,
        {"model": "B", "checkpoint": CKPT},
        0,
    ),
    "hidden": (lambda p: p.hidden("A"), {"model": "A"}, 0),
    "embed_shared": (lambda p: p.embed("shared"), {}, 0),
    "embed": (lambda p: p.embed("B"), {"model": "B"}, 0),
    "score": (lambda p: p.scores("bm25", "A"), {"method": "bm25", "model": "A"}, 0),
    "ekfac": (lambda p: p.ekfac("A"), {"model": "A"}, 0),
    "ekfac_tracin": (lambda p: p.ekfac("B", CKPT), {"model": "B", "checkpoint": CKPT}, 0),
    "trackstar": (lambda p: p.trackstar("A"), {"model": "A"}, 0),
    "fidelity": (lambda p: p.fidelity("B"), {"model": "B"}, 0),
    "analysis": (lambda p: p.analysis, {}, 0),
    "replicates": (lambda p: p.replicate_summary, {}, 0),
    "context_build": (lambda p: p.context("contexts"), {}, 0),
    "context_attribute": (lambda p: p.context("B"), {"model": "B"}, 0),
    "context_analysis": (lambda p: p.context("analysis"), {}, 0),
    "grounding_build": (lambda p: p.grounding("contexts"), {}, 0),
    "grounding_respond": (lambda p: p.grounding("A"), {"model": "A"}, 0),
    "grounding_analysis": (lambda p: p.grounding("analysis"), {}, 0),
    "membership_samples": (lambda p: p.membership("samples"), {}, 0),
    "membership_detect": (lambda p: p.membership("B"), {"model": "B"}, 0),
    "membership_analysis": (lambda p: p.membership("analysis"), {}, 0),
    "random_twin": (lambda p: p.random_twin(7), {"draw": "007"}, 0),
    "random_effect": (lambda p: p.random, {}, 0),
    "report": (lambda p: p.report, {}, 0),
    "export": (lambda p: p.export, {}, 0),
}


def test_every_catalogue_place_has_its_paths_folder() -> None:
    assert set(FOLDERS) == {s.rule for s in stages.STAGES if s.places}


@pytest.mark.parametrize("rule", sorted(FOLDERS))
def test_paths_folders_are_the_catalogue_places(rule: str, tmp_path: Path) -> None:
    """Replicate 2 of a run: a per-replicate row under replicates/2/, the others at the top."""
    paths = Paths({"results": str(tmp_path), "replicates": 3, "replicate": 2})
    get, values, index = FOLDERS[rule]
    base = tmp_path / "replicates" / "2" if stages.per_replicate(rule) else tmp_path
    assert get(paths) == base / stages.place(rule, index, **values)
    assert get(paths) == paths.place(rule, index, **values)


def test_paths_keep_the_results_layout(tmp_path: Path) -> None:
    """The layout itself, spelled out once here: renaming a folder must be deliberate."""
    p = Paths(str(tmp_path))
    got = {
        "shard": p.pool_shard("A", CKPT, 3),
        "queries": p.query_grads("B", CKPT),
        "grads": p.grads("A", CKPT),
        "curvature": p.curvature("A", CKPT),
        "ekfac_tracin": p.ekfac("B", CKPT),
        "prefix": p.model("prefix"),
        "moments": p.moments("A", CKPT),
        "state": p.train_state("B"),
        "shared_embed": p.embed("shared"),
        "summary": p.replicate_summary,
        "membership": p.membership("samples"),
    }
    assert {k: str(v.relative_to(tmp_path)) for k, v in got.items()} == {
        "shard": f"features/A/grads/{CKPT}/pool/shard_0003",
        "queries": f"features/B/grads/{CKPT}/queries",
        "grads": f"features/A/grads/{CKPT}",
        "curvature": f"features/A/curvature/{CKPT}/curvature.npz",
        "ekfac_tracin": f"features/B/ekfac_tracin/{CKPT}",
        "prefix": "models/prefix",
        "moments": f"models/A/moments/{CKPT}.pt",
        "state": "models/B/state",
        "shared_embed": "features/shared/embed",
        "summary": "replicates/summary",
        "membership": "membership/samples",
    }


def test_a_suite_folder_no_row_makes_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no folder"):
        Paths(str(tmp_path)).context("samples")


def test_method_feature_files_come_from_paths(smoke_cfg: dict[str, Any]) -> None:
    """The score rule's inputs (layout.feature_files) are Paths', so the catalogue's."""
    p = Paths(smoke_cfg)
    final = layout.final_checkpoint(smoke_cfg)
    files = layout.feature_files(smoke_cfg, "A", ["grads", "ekfac"])
    assert files[0] == str(p.pool_shard("A", final, 0) / layout.SHARD_JSON)
    assert files[-1] == str(p.place("ekfac", model="A") / layout.META)


# --------------------------------------------------------------------------- the rules' helper


def _helpers(results: str) -> dict[str, Any]:
    """layout.smk's artifact(), twins() and stream_of(), run as plain Python."""
    text = (ROOT / "workflow" / "rules" / "layout.smk").read_text()
    space: dict[str, Any] = {"R": results, "MODELS": list(MODELS)}
    space |= {"_pbstages": stages, "_pblayout": layout}
    for name in ("artifact", "twins", "stream_of"):
        found = re.search(rf"^def {name}\(.*?(?=^\S)", text, re.S | re.M)
        assert found, name
        exec(found[0], space)
    return space


def test_the_rules_helper_builds_the_rules_paths() -> None:
    h = _helpers("res")
    artifact, twins = h["artifact"], h["twins"]
    shard = "res/{rep}features/{model}/grads/{checkpoint}/pool/shard_{shard}/shard.json"
    assert artifact("grads_pool", "shard.json") == shard
    assert artifact("facts") == "res/facts/meta.json"
    assert artifact("facts", "queries.parquet", rep="") == "res/facts/queries.parquet"
    assert artifact("causal", rep="") == "res/causal/meta.json"
    assert artifact("analysis", rep="replicates/2/") == "res/replicates/2/analysis/meta.json"
    assert artifact("context_analysis", "ssp.csv") == "res/context/analysis/ssp.csv"
    assert artifact("embed_shared") == "res/{rep}features/shared/embed/meta.json"
    assert twins("stream", "tokens.bin") == [
        "res/{rep}stream/A/tokens.bin",
        "res/{rep}stream/B/tokens.bin",
    ]
    assert twins("score", rep="", method="bm25") == [
        "res/scores/bm25/A/meta.json",
        "res/scores/bm25/B/meta.json",
    ]

    class Job:
        rep, model = "replicates/1/", "B"

    assert h["stream_of"](Job()) == "res/replicates/1/stream/B/meta.json"
