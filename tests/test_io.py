from __future__ import annotations

import os

import pandas as pd
import pytest

from plantbench import io
from plantbench.errors import ArtifactError


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("boom")
    assert not target.exists()
    assert os.listdir(tmp_path) == []


def test_atomic_dir_replaces_whole(tmp_path):
    final = tmp_path / "d"
    with io.atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    with io.atomic_dir(final) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]


def test_parquet_is_byte_deterministic(tmp_path):
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    io.write_parquet(tmp_path / "1.parquet", df)
    io.write_parquet(tmp_path / "2.parquet", df)
    assert (tmp_path / "1.parquet").read_bytes() == (tmp_path / "2.parquet").read_bytes()


def test_meta_detects_a_flipped_byte_and_names_the_file(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00" * 100)
    meta = io.write_meta(tmp_path, "demo", ["x.bin"], config_hash="c")
    assert io.read_meta(tmp_path, "demo")["hash"] == meta["hash"]
    data = bytearray((tmp_path / "x.bin").read_bytes())
    data[50] ^= 0xFF
    (tmp_path / "x.bin").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="x.bin"):
        io.read_meta(tmp_path, "demo")


def test_meta_wrong_stage_and_missing(tmp_path):
    with pytest.raises(ArtifactError, match="no meta.json"):
        io.read_meta(tmp_path, "demo")
    io.write_meta(tmp_path, "other", [], config_hash="c")
    with pytest.raises(ArtifactError, match="expected 'demo'"):
        io.read_meta(tmp_path, "demo")


def test_check_input_refuses_other_upstream(tmp_path):
    meta = {"inputs": {"stream": "aaa"}}
    with pytest.raises(ArtifactError, match="different 'stream'"):
        io.check_input(meta, "stream", {"hash": "bbb"}, "scores")
