"""The release bundle (`plantbench export`) of the smoke run, and `plantbench verify --bundle`."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
from pathlib import Path

import datasets
import pandas as pd
import pyarrow.parquet as pq
import pytest

from plantbench import artifacts, cli, io
from plantbench.ops import export
from plantbench.paths import MODELS

SINGLE = {
    "facts": "facts/facts.parquet",
    "documents": "facts/documents.parquet",
    "distractors": "facts/distractors.parquet",
    "queries": "facts/queries.parquet",
    "candidates": "facts/candidates.parquet",
    "causal_facts": "causal/facts.parquet",
    "causal_queries": "causal/queries.parquet",
    "in_context": "causal/in_context.parquet",
}
PER_MODEL = {"stream": "stream/{m}/manifest.parquet", "pool": "pool/{m}/pool.parquet"}
PER_SCORE = {"scores_own": "own.parquet", "scores_topk": "topk.parquet"}
PER_SCORE["scores_queries"] = "queries.parquet"


@pytest.fixture(scope="module")
def bundles(smoke_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The smoke run exported twice, into two folders."""
    base = tmp_path_factory.mktemp("bundle")
    out = (base / "one", base / "two")
    config = str(smoke_run / "config.json")
    for o in out:
        assert cli.main(["export", "-c", config, "--out", str(o)]) == 0
    return out


def _methods(results: Path) -> list[str]:
    meta = io.read_meta(results / "analysis", "analysis", verify=False)
    return list(meta["info"]["methods"])


def _source_rows(results: Path) -> dict[str, int]:
    """Rows per table, counted from the run's own artifacts."""
    rows = {n: pq.read_metadata(results / rel).num_rows for n, rel in SINGLE.items()}
    for name, rel in PER_MODEL.items():
        rows[name] = sum(pq.read_metadata(results / rel.format(m=m)).num_rows for m in MODELS)
    for name, file in PER_SCORE.items():
        rows[name] = sum(
            pq.read_metadata(results / "scores" / meth / m / file).num_rows
            for meth in _methods(results)
            for m in MODELS
        )
    return rows


def test_bundle_loads_with_datasets_and_counts_match(bundles, smoke_run: Path) -> None:
    dd = datasets.load_from_disk(str(bundles[0] / "dataset"))
    assert isinstance(dd, datasets.DatasetDict)
    expected = _source_rows(smoke_run)
    assert {name: len(ds) for name, ds in dd.items()} == expected
    assert all(n > 0 for n in expected.values())
    # per-model tables: each model's rows are its own manifest, in order
    stream = dd["stream"].to_pandas()
    for m in MODELS:
        src = io.read_parquet(smoke_run / "stream" / m / "manifest.parquet")
        mine = stream[stream["model"] == m].drop(columns="model").reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, src)
    assert set(dd["scores_own"].unique("method")) == set(_methods(smoke_run))


def test_parquet_and_dataset_copies_agree(bundles, smoke_run: Path) -> None:
    bundle = bundles[0]
    dd = datasets.load_from_disk(str(bundle / "dataset"))
    names = sorted(p.stem for p in (bundle / "data").glob("*.parquet"))
    assert names == sorted(dd)
    for name in names:
        table = pd.read_parquet(bundle / "data" / f"{name}.parquet")
        pd.testing.assert_frame_equal(dd[name].to_pandas(), table, check_dtype=True)
    for name, rel in SINGLE.items():  # the one-artifact tables are the artifact's rows, as is
        table = pd.read_parquet(bundle / "data" / f"{name}.parquet")
        pd.testing.assert_frame_equal(table, io.read_parquet(smoke_run / rel))


def test_checkpoints_load_with_transformers(bundles, smoke_run: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from plantbench.paths import Paths

    params = {}
    for m in MODELS:
        model = AutoModelForCausalLM.from_pretrained(bundles[0] / "checkpoints" / m)
        run = AutoModelForCausalLM.from_pretrained(
            artifacts.final_checkpoint_path(Paths(smoke_run), m)
        )
        mine, theirs = model.state_dict(), run.state_dict()
        assert list(mine) == list(theirs)
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
        params[m] = next(iter(model.parameters())).detach()
    assert not torch.equal(params["A"], params["B"])  # the twins, not one model twice


def test_card_and_meta_describe_the_sources(bundles, smoke_run: Path) -> None:
    bundle = bundles[0]
    card = (bundle / "README.md").read_text()
    meta = json.loads((bundle / "meta.json").read_text())
    assert card.startswith("---\n")
    for name in meta["info"]["tables"]:
        assert f"- config_name: {name}\n  data_files: data/{name}.parquet" in card
        assert f"### {name}\n" in card
    for key in ("facts", "causal", "stream_A", "pool_B", "model_A", "checkpoint_B"):
        h = meta["inputs"][key]
        assert f"| {key} | `{h}` |" in card
    assert meta["inputs"]["causal"] == io.read_meta(smoke_run / "causal", "causal")["hash"]
    assert str(smoke_run) not in card and str(smoke_run) not in json.dumps(meta)
    on_disk = sorted(export.bundle_files(bundle))
    assert sorted(meta["files"]) == on_disk


def test_export_twice_is_byte_identical(bundles) -> None:
    one, two = bundles
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    differ = [f for f in files if not filecmp.cmp(one / f, two / f, shallow=False)]
    assert differ == []


def _verify(bundle: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["verify", "--bundle", str(bundle)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_verify_passes_then_names_a_flipped_byte(bundles, tmp_path: Path, capsys) -> None:
    rc, text = _verify(bundles[0], capsys)
    assert rc == 0, text
    assert "FAIL" not in text and "bundle answer key" in text
    copy = tmp_path / "bundle"
    shutil.copytree(bundles[0], copy)
    victim = copy / "checkpoints" / "B" / "model.safetensors"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    rc, text = _verify(copy, capsys)
    assert rc != 0
    fails = [line for line in text.splitlines() if line.startswith("FAIL")]
    assert any("checkpoints/B/model.safetensors" in line for line in fails), text
    assert not any("checkpoints/A" in line for line in fails)


def test_verify_checks_the_answer_key(bundles, tmp_path: Path, capsys) -> None:
    """An answer key whose effect is not logp_reader - logp_other fails even when the bundle's
    meta.json was rewritten to match the edited file."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundles[0], copy)
    path = copy / "data" / "causal_facts.parquet"
    key = pd.read_parquet(path)
    key.loc[0, "effect"] += 1.0
    io.write_parquet(path, key)
    meta = json.loads((copy / "meta.json").read_text())
    io.write_meta(
        copy,
        "export",
        list(meta["files"]),
        config_hash=meta["config_hash"],
        inputs=meta["inputs"],
        info=meta["info"],
    )
    rc, text = _verify(copy, capsys)
    assert rc != 0
    assert "PASS  bundle files" in text
    assert "effect is not logp_reader - logp_other" in text
    assert "FAIL  bundle table causal_facts" in text  # the dataset copy still has the old row


def test_verify_of_no_bundle_fails_cleanly(tmp_path: Path, capsys) -> None:
    rc, text = _verify(tmp_path / "nothing", capsys)
    assert rc != 0 and "FAIL" in text and "Traceback" not in text


def test_export_is_a_snakemake_target_outside_all(smoke_run: Path, plugin_config: Path) -> None:
    from smokerun import ROOT, snakemake

    extra = ("-n", "export", "--rerun-triggers", "mtime")
    proc = snakemake(smoke_run, *extra, configfiles=(str(plugin_config),))
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    stats = text.split("Job stats:", 1)[1].split("total", 1)[0]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)\s*$", stats, re.M))
    assert jobs == {"export": "1"}, text[-3000:]
    assert "plantbench export -c" in text
    all_block = (ROOT / "Snakefile").read_text().split("rule all:", 1)[1]
    assert "export" not in all_block
