from __future__ import annotations

import json
import shutil

import pytest

from plantbench import config, verify
from plantbench.cli import main
from plantbench.paths import Paths


@pytest.fixture
def run_copy(smoke_stream, tmp_path):
    """A private copy of the smoke upstream that a test may corrupt."""
    src = smoke_stream["root"] / "results"
    dst = tmp_path / "results"
    shutil.copytree(src, dst)
    cfg = config.deep_merge(smoke_stream["cfg"], {"results": str(dst)})
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    return cfg, cfg_path


def statuses(checks):
    return {c.artifact: c.status for c in checks}


def test_clean_run_passes(run_copy, capsys):
    cfg, cfg_path = run_copy
    assert main(["verify", "-c", str(cfg_path)]) == 0
    out = capsys.readouterr().out
    assert "streams A/B" in out and "FAIL" not in out


def test_flipped_byte_in_window_file_is_named(run_copy, capsys):
    cfg, cfg_path = run_copy
    tokens = Paths(cfg).stream("A") / "tokens.bin"
    data = bytearray(tokens.read_bytes())
    data[1000] ^= 0x01
    tokens.write_bytes(bytes(data))
    checks = verify.run(cfg, Paths(cfg))
    st = statuses(checks)
    assert st["stream/A"] == "FAIL" and st["stream/A windows"] == "FAIL"
    assert any("tokens.bin" in c.detail for c in checks if c.status == "FAIL")
    assert main(["verify", "-c", str(cfg_path)]) == 2
    assert "tokens.bin" in capsys.readouterr().err


def test_rebuilt_upstream_breaks_lineage(run_copy):
    cfg, _ = run_copy
    facts = Paths(cfg).facts / "meta.json"
    meta = json.loads(facts.read_text())
    meta["hash"] = "0" * 32  # as if facts had been rebuilt differently after the stream
    facts.write_text(json.dumps(meta))
    st = statuses(verify.run(cfg, Paths(cfg)))
    assert st["stream/A (lineage)"] == "FAIL"


def test_reference_roundtrip(run_copy, tmp_path):
    cfg, _ = run_copy
    ref_dir = tmp_path / "ref"
    verify.write_reference(cfg, Paths(cfg), "smoke", ref_dir)
    st = statuses(verify.run(cfg, Paths(cfg), ref_dir=ref_dir))
    assert st["reference facts"] == "PASS" and st["reference stream/A"] == "PASS"
    ref = json.loads((ref_dir / "smoke.json").read_text())
    ref["hashes"]["facts"] = "f" * 32
    (ref_dir / "smoke.json").write_text(json.dumps(ref))
    st = statuses(verify.run(cfg, Paths(cfg), ref_dir=ref_dir))
    assert st["reference facts"] == "FAIL"


def test_committed_smoke_reference_matches(smoke_stream):
    """The committed reference for the smoke config holds for a fresh build here."""
    cfg = smoke_stream["cfg"]
    found = verify.find_reference(cfg, verify.REFERENCE_DIR)
    if found is None:
        pytest.skip("no committed reference for the smoke config")
    checks = verify.check_reference(
        cfg, verify.check_files(Paths(cfg).root)[1], verify.REFERENCE_DIR
    )
    assert not [c for c in checks if c.status == "FAIL"], checks
