"""The bad-input suite: each case exits 2 with one line naming the problem and the fix, and
leaves no partial output. The table below is the list of cases."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from plantbench import config
from plantbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "config.yaml")

# (case id, config override written as YAML, words the error must contain)
CONFIG_CASES = [
    ("wrong-type", "train:\n  steps: ten\n", "'train.steps'"),
    ("unknown-key", "colour: blue\n", "unknown config key 'colour'"),
    ("unknown-nested-key", "model:\n  layers: 4\n", "unknown config key 'model.layers'"),
    ("impossible-grid", "train:\n  steps: 4850\n", "does not fit in the stream"),
    ("prefix-leaves-nothing", "train:\n  steps: 50\n", "leaves no paired part"),
    ("negative-window", "stream:\n  window: -128\n", "'stream.window' = -128 is out of range"),
    ("unknown-domain", "facts:\n  domains: [mars]\n", "facts.domains.0"),
    ("heads-do-not-divide", "model:\n  n_embd: 100\n  n_head: 3\n", "divisible"),
    ("bad-yaml", "train: [unclosed\n", "is not valid YAML"),
    ("not-a-mapping", "- a\n- b\n", "must hold a mapping"),
    ("negative-pool", "pool:\n  random_windows: -1\n", "'pool.random_windows'"),
]


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("plantbench: error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("case", "yaml_text", "expect"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES]
)
def test_config_cases(tmp_path, capsys, case, yaml_text, expect):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text)
    out = tmp_path / "out.json"
    assert main(["config", "-c", DEFAULT, "-c", str(bad), "--out", str(out)]) == 2
    assert expect in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_missing_config_file(tmp_path, capsys):
    assert main(["facts", "-c", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml' does not exist" in one_error_line(capsys.readouterr().err)


def _corpus_source(tmp_path: Path, make: Callable[[Path], Path]) -> Path:
    src = make(tmp_path)
    cfg = config.load(
        [DEFAULT],
        {
            "results": str(tmp_path / "results"),
            "corpus": {"sources": [{"kind": "text", "path": str(src)}]},
        },
    )
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    return p


CORPUS_CASES = [
    ("missing-path", lambda d: d / "absent.txt", "absent.txt"),
    (
        "empty-file",
        lambda d: (d / "empty.txt").write_text("") and d / "empty.txt" or d / "empty.txt",
        "empty.txt",
    ),
    (
        "binary-file",
        lambda d: (d / "blob.txt").write_bytes(b"\x00\x01\x02" * 500) and d / "blob.txt",
        "blob.txt",
    ),
    (
        "non-utf8",
        lambda d: (
            (d / "latin.txt").write_bytes(("caf\xe9 " * 300).encode("latin-1")) and d / "latin.txt"
        ),
        "latin.txt",
    ),
]


@pytest.mark.parametrize(("case", "make", "expect"), CORPUS_CASES, ids=[c[0] for c in CORPUS_CASES])
def test_corpus_cases(tmp_path, capsys, case, make, expect):
    cfg_path = _corpus_source(tmp_path, make)
    assert main(["corpus", "-c", str(cfg_path)]) == 2
    assert expect in one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "results" / "corpus").exists() or not any(
        (tmp_path / "results" / "corpus").iterdir()
    )


@pytest.fixture
def built(smoke_stream, tmp_path):
    dst = tmp_path / "results"
    shutil.copytree(smoke_stream["root"] / "results", dst)
    cfg = config.deep_merge(smoke_stream["cfg"], {"results": str(dst)})
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return dst, p


def test_truncated_window_file(built, capsys):
    root, cfg = built
    tokens = root / "stream" / "A" / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-100])
    assert main(["pretrain", "-c", str(cfg), "--model", "A"]) == 2
    assert "tokens.bin" in one_error_line(capsys.readouterr().err)
    assert not (root / "models" / "A" / "meta.json").exists()


def test_corrupt_parquet_is_named(built, capsys):
    root, cfg = built
    (root / "facts" / "documents.parquet").write_bytes(b"not parquet at all")
    assert main(["stream", "-c", str(cfg)]) == 2
    assert "documents.parquet" in one_error_line(capsys.readouterr().err)


def test_tokenizer_from_another_corpus(built, capsys):
    root, cfg = built
    meta_path = root / "corpus" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["hash"] = "1" * 32
    meta_path.write_text(json.dumps(meta))
    before = (root / "stream" / "A" / "meta.json").read_bytes()
    assert main(["stream", "-c", str(cfg)]) == 2
    assert "different 'corpus'" in one_error_line(capsys.readouterr().err)
    assert (root / "stream" / "A" / "meta.json").read_bytes() == before


def test_window_shorter_than_document(built, tmp_path, capsys):
    root, cfg = built
    data = json.loads(cfg.read_text())
    data["stream"]["window"] = 32
    cfg.write_text(json.dumps(data))
    before = (root / "stream" / "B" / "tokens.bin").stat().st_mtime_ns
    assert main(["stream", "-c", str(cfg)]) == 2
    assert "raise stream.window" in one_error_line(capsys.readouterr().err)
    assert (root / "stream" / "B" / "tokens.bin").stat().st_mtime_ns == before


def test_missing_checkpoint(built, capsys):
    _, cfg = built
    assert main(["causal", "-c", str(cfg)]) == 2
    assert "pretrain" in one_error_line(capsys.readouterr().err)


def test_batch_step_out_of_range(built, capsys):
    _, cfg = built
    assert main(["batch", "-c", str(cfg), "--model", "B", "--step", "-1"]) == 2
    assert "--step -1 is out of range" in one_error_line(capsys.readouterr().err)


def test_write_error_leaves_no_partial_file(tmp_path, monkeypatch):
    """A disk-full error in the middle of a write: the error surfaces, nothing is left."""
    import os

    from plantbench import io

    real_fsync = os.fsync

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        io.write_bytes(tmp_path / "x.bin", b"data" * 1000)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert list(tmp_path.iterdir()) == []


def test_permission_error_is_one_line(tmp_path, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    cfg = config.load([DEFAULT], {"results": str(ro / "results")})
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    assert main(["facts", "-c", str(p)]) == 2


def test_disk_full_through_the_cli_is_one_line(tmp_path, monkeypatch, capsys):
    import os

    def full(fd):
        raise OSError(28, "No space left on device")

    cfg = config.load([DEFAULT], {"results": str(tmp_path / "results")})
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    monkeypatch.setattr(os, "fsync", full)
    assert main(["facts", "-c", str(p)]) == 2
    assert "No space left on device" in one_error_line(capsys.readouterr().err)
    leftovers = [f for f in (tmp_path / "results").rglob("*") if f.is_file()]
    assert leftovers == []
