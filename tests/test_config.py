from __future__ import annotations

from pathlib import Path

import pytest

from plantbench import config, layout
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
        ({"train": {"steps": 100}}, "leaves no paired part"),
        ({"train": {"steps": 4900}}, "does not fit in the stream"),
        (
            {
                "facts": {
                    "distractors_per_entity": 4,
                    "facts_per_cell": 2,
                    "n_docs": [2, 8, 32, 128],
                },
                "train": {"steps": 300, "prefix_steps": 0},
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


def test_the_reference_study_hashes_are_unchanged():
    """Optional keys (e.g. stream.max_background_passes) stay out of config.yaml, so the study
    hashes that select results/reference/*.json do not move."""
    import json

    for name, files in (
        ("default", ["config.yaml"]),
        ("smoke", ["config.yaml", "tests/smoke/config.yaml"]),
    ):
        ref = json.loads((ROOT / "results" / "reference" / f"{name}.json").read_text())
        cfg = config.load([ROOT / f for f in files], {"results": "unused-results"})
        assert config.study_hash(cfg) == ref["study_hash"], name


@pytest.mark.parametrize(("steps", "every"), [(1200, 300), (120, 40), (100, 30), (5, 10), (7, 7)])
def test_n_checkpoints_counts_what_pretraining_saves(steps, every):

    t = {"steps": steps, "checkpoint_every_steps": every}
    assert config.n_checkpoints(t) == len(layout.checkpoint_steps(t))


@pytest.mark.parametrize(
    ("text", "integer"),
    [
        ("3e-3", False),
        ("1e4", False),
        ("5E-2", False),
        ("-1e-3", False),
        ("2.5e2", False),
        ("1.2e3", True),
    ],
)
def test_the_yaml_spelling_hint_reads_back_as_the_same_number(text, integer):
    import yaml

    spelled = config._yaml_spelling(text, integer)
    assert isinstance(yaml.safe_load(text), str)  # the gotcha itself
    back = yaml.safe_load(spelled)
    assert isinstance(back, int if integer else float) and back == float(text)


def test_results_location_refuses_nesting_only_of_runs(tmp_path, monkeypatch):
    """The repository layout (results/README.md, results/reference/) is not a run; once a run
    writes results/config.json, a results folder below it is refused, named relatively."""
    import json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "reference").mkdir(parents=True)
    (tmp_path / "results" / "README.md").write_text("# results\n")
    (tmp_path / "results" / "reference" / "default.json").write_text('{"study_hash": "x"}')
    config.check_results_location("results")
    config.check_results_location("results/smoke")
    run = {"results": "results", "seed": 1, "facts": {}, "train": {}}
    (tmp_path / "results" / "config.json").write_text(json.dumps(run))
    with pytest.raises(ConfigError) as err:
        config.check_results_location("results/smoke")
    assert "results folder of another run ('results')" in str(err.value)
    assert str(tmp_path) not in str(err.value)
    (tmp_path / "results" / "smoke").mkdir()
    (tmp_path / "results" / "smoke" / "config.json").write_text(
        json.dumps(run | {"results": "results/smoke"})
    )
    with pytest.raises(
        ConfigError, match=r"holds the results folder of another run \('results/smoke'\)"
    ):
        config.check_results_location("results")


def test_a_plugin_may_bind_score_any_top_level_way(tmp_path):
    base = config.load([ROOT / "config.yaml"], {"results": str(tmp_path / "results")})
    for i, text in enumerate(["from math import fsum as score\n", "score = lambda c, q, p: 0\n"]):
        f = tmp_path / f"p{i}.py"
        f.write_text(text)
        plugins = {"methods": {"plugins": [{"name": "mine", "path": str(f)}]}}
        assert (
            config.validate(config.deep_merge(base, plugins))["methods"]["plugins"][0]["name"]
            == "mine"
        )


def test_a_repeated_configfile_flag_is_refused() -> None:
    """Snakemake keeps only the last --configfile flag's files: two flags would drop the first
    file without a word (the rehearsal's paper.yaml), so they are refused, one flag passes."""
    from plantbench.config import check_configfile_flags

    with pytest.raises(ConfigError, match="after one flag"):
        check_configfile_flags(["--configfile", "a.yaml", "--configfile=b.yaml"])
    with pytest.raises(ConfigError):
        check_configfile_flags(["--configfiles", "a.yaml", "--configf", "b.yaml"])
    check_configfile_flags(["--configfile", "a.yaml", "b.yaml", "--config", "x=1"])


def test_model_vocab_size_pads_the_embedding_and_is_never_smaller() -> None:
    from plantbench.model.modeling import model_rows

    assert model_rows({}, 5000) == 5000
    assert model_rows({"vocab_size": 32768}, 5000) == 32768
    with pytest.raises(ConfigError, match="model.vocab_size"):
        model_rows({"vocab_size": 4096}, 5000)
