"""The config a run's jobs read and what each rule depends on (plantbench.runconfig)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from plantbench import config, io, runconfig
from plantbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_job_config_is_named_by_its_hash_and_never_rewritten(smoke_cfg):
    path = runconfig.write_run_config(smoke_cfg)
    assert path == runconfig.job_config_path(smoke_cfg)
    assert path.stem == config.config_hash(smoke_cfg)
    assert json.loads(path.read_text()) == smoke_cfg
    other = config.deep_merge(smoke_cfg, {"analysis": {"bootstrap": 50}})
    other_path = runconfig.write_run_config(other)
    assert other_path != path
    assert json.loads(path.read_text()) == smoke_cfg  # the first run's file is untouched
    human = json.loads((Path(smoke_cfg["results"]) / "config.json").read_text())
    assert human["analysis"]["bootstrap"] == 50  # the copy for people follows the last start


def test_an_edited_job_config_is_refused(smoke_cfg, capsys):
    path = runconfig.write_run_config(smoke_cfg)
    data = json.loads(path.read_text())
    data["analysis"]["bootstrap"] = 70
    path.write_text(json.dumps(data))
    assert main(["facts", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "was edited after the run started" in err
    assert not (Path(smoke_cfg["results"]) / "facts").exists()


def test_plain_config_files_are_not_checked_for_a_hash_name(tmp_path):
    cfg = tmp_path / "0123456789abcdef0123456789abcdef.json"
    cfg.write_text("{}")
    runconfig.check_job_config(cfg, {"results": "x"})  # not under .plantbench/config: no check


def test_the_stream_does_not_depend_on_the_learning_rate(smoke_cfg):
    lr = config.deep_merge(smoke_cfg, {"train": {"lr": 2.0e-3}})
    steps = config.deep_merge(smoke_cfg, {"train": {"steps": 200}})
    for rule in ("facts", "corpus", "tokenizer", "stream", "pool", "score"):
        assert runconfig.rule_sections(lr, rule) == runconfig.rule_sections(smoke_cfg, rule), rule
    assert runconfig.rule_sections(lr, "pretrain") != runconfig.rule_sections(smoke_cfg, "pretrain")
    assert runconfig.rule_sections(steps, "stream") != runconfig.rule_sections(smoke_cfg, "stream")


def test_every_rule_of_the_workflow_declares_its_sections():
    rules = set()
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        rules |= set(re.findall(r"^rule (\w+):", smk.read_text(), flags=re.M))
        for name in re.findall(r'sections\("(\w+)"\)', smk.read_text()):
            assert name in runconfig.RULE_SECTIONS, f"{smk.name}: sections({name!r})"
    assert rules - {"all"} <= set(runconfig.RULE_SECTIONS)


def test_unknown_section_keys_are_named(smoke_cfg, monkeypatch):
    monkeypatch.setitem(runconfig.RULE_SECTIONS, "facts", ("facts.nope",))
    with pytest.raises(Exception, match="facts.nope"):
        runconfig.rule_sections(smoke_cfg, "facts")


def test_method_signature_follows_its_own_code_only(smoke_cfg, tmp_path):
    plugin = tmp_path / "mine.py"
    plugin.write_text((ROOT / "tests" / "plugins" / "oracle_method.py").read_text())
    one = config.deep_merge(
        smoke_cfg, {"methods": {"plugins": [{"name": "mine", "path": str(plugin)}]}}
    )
    before = runconfig.method_signature(one, "mine")
    bm25 = runconfig.method_signature(one, "bm25")
    plugin.write_text(plugin.read_text() + "\n# edited\n")
    assert runconfig.method_signature(one, "mine") != before
    second = tmp_path / "other.py"
    second.write_text(plugin.read_text())
    two = config.deep_merge(
        one,
        {
            "methods": {
                "plugins": [*one["methods"]["plugins"], {"name": "other", "path": str(second)}]
            }
        },
    )
    assert runconfig.method_signature(two, "bm25") == bm25


def test_every_artifact_records_the_code_that_made_it(tmp_path):
    meta = io.write_meta(tmp_path, "demo", [], config_hash="x", code={"method": "abc"})
    assert meta["code"] == {"plantbench": io.package_code_hash(), "method": "abc"}
    assert len(io.package_code_hash()) == 32
