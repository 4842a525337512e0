from __future__ import annotations

from pathlib import Path

import pytest

from plantbench import config
from plantbench.cli import main
from plantbench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_default_and_smoke_configs_validate(default_cfg, smoke_cfg):
    assert default_cfg["results"] == "results"
    assert smoke_cfg["facts"]["facts_per_cell"] >= 1


def test_config_hash_is_stable_and_sensitive(default_cfg):
    h = config.config_hash(default_cfg)
    assert h == config.config_hash(config.load([ROOT / "config.yaml"]))
    changed = config.deep_merge(default_cfg, {"seed": default_cfg["seed"] + 1})
    assert config.config_hash(changed) != h


def test_deep_merge_keeps_siblings():
    out = config.deep_merge({"a": {"x": 1, "y": 2}, "b": 1}, {"a": {"y": 3}})
    assert out == {"a": {"x": 1, "y": 3}, "b": 1}


@pytest.mark.parametrize(
    ("override", "expect"),
    [
        ({"bogus": 1}, "unknown config key 'bogus'"),
        ({"train": {"lrr": 1.0}}, "unknown config key 'train.lrr'"),
        ({"facts": {"domains": ["world", "mars"]}}, "facts.domains.1"),
        ({"train": {"precision": "fp8"}}, 'use one of: "auto", "fp32", "bf16"'),
        ({"train": {"steps": -5}}, "'train.steps' = -5 is out of range"),
        ({"stream": {"window": "long"}}, "'stream.window' = \"long\" has the wrong type"),
        ({"model": {"n_embd": 130, "n_head": 4}}, "divisible"),
        ({"train": {"batch_windows": 8, "micro_batch_windows": 3}}, "multiple"),
        ({"stream": {"position_spans": {"late": [0.9, 0.8]}}}, "start < end"),
        ({"corpus": {"sources": [{"kind": "jsonl"}]}}, "corpus.sources.0.path"),
        ({"train": {"steps": 100}}, "does not fit in the stream"),
        (
            {
                "facts": {"distractors_per_entity": 4, "facts_per_cell": 2},
                "train": {"steps": 300},
                "stream": {
                    "position_spans": {
                        "early": [0, 0.33],
                        "middle": [0.33, 0.66],
                        "late": [0.66, 1],
                    }
                },
            },
            "distractor windows exceed",
        ),
    ],
)
def test_bad_values_give_one_line_naming_the_key(default_cfg, override, expect):
    bad = config.deep_merge(default_cfg, override)
    with pytest.raises(ConfigError) as err:
        config.validate(bad)
    msg = str(err.value)
    assert expect in msg
    assert "\n" not in msg


def test_cli_config_writes_resolved_copy(tmp_path, capsys):
    out = tmp_path / "cfg.json"
    assert main(["config", "-c", str(ROOT / "config.yaml"), "--out", str(out)]) == 0
    again = config.load([out])
    assert again == config.load([ROOT / "config.yaml"])


def test_cli_bad_config_exits_2_without_output(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: zero\n")
    out = tmp_path / "cfg.json"
    rc = main(["config", "-c", str(ROOT / "config.yaml"), "-c", str(bad), "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.steps" in err[0]
    assert not out.exists()
