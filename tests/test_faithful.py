"""The faithful preset (``workflow/presets/faithful.yaml``): answers whose lengths vary more, the
seed's 22 facts per cell and the reading curriculum off, for seed 003's central finding at a size
two cores can run. Its measurement is docs/results/2026-12-06-central-finding.md (arms 12, 13); here:
it is a valid config that changes what the page says it changes, and its DAG plans."""

from __future__ import annotations

from pathlib import Path

from plantbench import config
from smokerun import planned_jobs

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "workflow" / "presets" / "faithful.yaml"
PAPER = ROOT / "workflow" / "presets" / "paper.yaml"


def test_the_preset_is_a_valid_config_with_wider_answers_beside_the_default() -> None:
    default = config.load([ROOT / "config.yaml"])
    cfg = config.load([ROOT / "config.yaml", PRESET])
    assert cfg["results"] != default["results"]  # never the default study's folder
    assert cfg["facts"]["answer_extra_syllables"] >= 1
    assert "answer_extra_syllables" not in default["facts"]
    # the seed's cells (22 facts each: 11 per twin), as in the paper preset
    paper = config.load([ROOT / "config.yaml", PAPER])
    assert cfg["facts"]["facts_per_cell"] == paper["facts"]["facts_per_cell"] == 11
    assert cfg["facts"]["facts_per_cell"] > default["facts"]["facts_per_cell"]
    # the reading curriculum off, where the default keeps it on (the suites need it)
    assert cfg["stream"]["recall"]["prefix_share"] == cfg["stream"]["recall"]["paired_share"] == 0
    assert default["stream"]["recall"]["prefix_share"] > 0
    assert default["stream"]["recall"]["paired_share"] > 0
    assert cfg["model"] == default["model"]  # the same twins' shape: only data and scale change


def test_the_preset_plans_the_whole_study(tmp_path: Path) -> None:
    counts = planned_jobs(tmp_path / "results", str(PRESET))
    assert counts["pretrain"] == 2 and counts["report"] == 1 and counts["analysis"] == 1
