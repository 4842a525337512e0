from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

from plantbench import config, io
from plantbench.cli import build_parser, main
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_file
from plantbench.ops import verify
from plantbench.paths import Paths


@pytest.fixture
def run_copy(smoke_stream, tmp_path):
    """A private copy of the smoke upstream that a test may corrupt."""
    src = smoke_stream["root"] / "results"
    dst = tmp_path / "results"
    shutil.copytree(src, dst)
    cfg = config.deep_merge(smoke_stream["cfg"], {"results": str(dst)})
    cfg_path = dst / "config.json"  # the copy's own: recoveries name it
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


# --------------------------------------------------------------------------------------------
# A reference is checked before it is believed (results/reference/<name>.json)
# --------------------------------------------------------------------------------------------

REFERENCE_FIX = re.compile(
    r"; recover: restore it from git \(`git restore (\S+)`\) or rewrite it from a run you trust "
    r"\(`plantbench verify -c (\S+) --write-reference (\S+)`\)$"
)


def _stand_ins(cfg):
    """Tiny artifacts for what a reference records and the upstream lacks (pools, weights,
    the causal table, hidden states), so that a reference can be written from the copy."""
    paths = Paths(cfg)
    for name in (*verify.PORTABLE, *verify.FLOAT_REFERENCED):
        folder = paths.root / name
        if not (folder / "meta.json").is_file():
            folder.mkdir(parents=True)
            (folder / "part.bin").write_bytes(name.encode())
            io.write_meta(folder, verify.step_of(name).stage, ["part.bin"], config_hash="x")


@pytest.fixture
def referenced_run(run_copy, tmp_path):
    """The copy with every referenced artifact, and a reference written from it."""
    cfg, cfg_path = run_copy
    _stand_ins(cfg)
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    verify.write_reference(cfg, Paths(cfg), "mine", ref_dir)
    return cfg, cfg_path, ref_dir / "mine.json"


def _reference_lines(cfg, ref_path, edit=None):
    if edit is not None:
        ref = json.loads(ref_path.read_text())
        edit(ref)
        ref_path.write_text(json.dumps(ref))
    checks = verify.run(cfg, Paths(cfg), ref_dir=ref_path.parent)
    return [c for c in checks if c.artifact.startswith("reference")]


def test_a_written_reference_is_whole_and_holds(referenced_run):
    cfg, _, ref_path = referenced_run
    lines = _reference_lines(cfg, ref_path)
    assert sorted(c.artifact for c in lines) == sorted(
        f"reference {n}" for n in (*verify.PORTABLE, *verify.FLOAT_REFERENCED)
    )
    assert {c.status for c in lines} == {"PASS"}


def _drop(key):
    return lambda ref: ref.pop(key)


def _set(key, value):
    return lambda ref: ref.__setitem__(key, value)


def _hash(name, value):
    return lambda ref: ref["hashes"].__setitem__(name, value)


MALFORMED = [
    ("empty-hashes", _set("hashes", {}), "'hashes' is empty"),
    ("null-hash", _hash("facts", None), "hashes['facts'] is null"),
    ("empty-hash", _hash("stream/A", ""), "hashes['stream/A'] is empty"),
    ("not-a-hash", _hash("corpus", 7), "hashes['corpus'] is 7, not an xxh3 hash (32 hex digits)"),
    (
        "artifact-left-out",
        lambda ref: ref["hashes"].pop("models/A"),
        "'hashes' lacks models/A (a reference records every one of "
        + ", ".join((*verify.PORTABLE, *verify.FLOAT_REFERENCED))
        + ")",
    ),
    ("unknown-artifact", _hash("scores/bm25/A", "0" * 32), "'hashes' names scores/bm25/A"),
    ("no-pinned", _drop("pinned"), "lacks the key 'pinned'"),
    ("no-float-platforms", _drop("float_platforms"), "lacks the key 'float_platforms'"),
    ("hashes-a-list", _set("hashes", ["facts"]), "'hashes' is a list, not a JSON object"),
    ("name-a-number", _set("name", 3), "'name' is a number, not a string"),
    (
        "float-path-left-out",
        lambda ref: ref["float_platforms"].pop("causal"),
        "'float_platforms' lacks causal",
    ),
]


@pytest.mark.parametrize(("case", "edit", "problem"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_reference_is_one_fail_blaming_the_file(referenced_run, case, edit, problem):
    """Never "all checks passed" without it, never advice to delete a good artifact."""
    cfg, cfg_path, ref_path = referenced_run
    lines = _reference_lines(cfg, ref_path, edit)
    assert len(lines) == 1, verify.format_checks(lines)
    line = lines[0]
    assert (line.artifact, line.status) == ("reference", "FAIL")
    assert line.detail.startswith(f"'{ref_path}' is malformed: {problem}")
    restore, config_file, name = REFERENCE_FIX.search(line.detail).groups()
    assert (restore, config_file, name) == (str(ref_path), str(cfg_path), "mine")
    assert "delete" not in line.detail


def test_a_corrupt_reference_names_the_file_and_the_fix(referenced_run):
    cfg, cfg_path, ref_path = referenced_run
    ref_path.write_text("{not json")
    (line,) = _reference_lines(cfg, ref_path)
    assert (line.artifact, line.status) == ("reference", "FAIL")
    assert line.detail.startswith(f"'{ref_path}' is malformed: not JSON;")
    assert REFERENCE_FIX.search(line.detail) and "delete" not in line.detail


def test_reference_roundtrip(referenced_run):
    cfg, _, ref_path = referenced_run
    st = statuses(_reference_lines(cfg, ref_path))
    assert st["reference facts"] == "PASS" and st["reference stream/A"] == "PASS"
    st = statuses(_reference_lines(cfg, ref_path, _hash("facts", "f" * 32)))
    assert st["reference facts"] == "FAIL"


def test_the_prefix_is_referenced_only_with_a_prefix(run_copy):
    cfg, _ = run_copy
    assert "models/prefix" in verify.referenced(cfg)
    cfg = config.deep_merge(cfg, {"train": {"prefix_steps": 0}})
    assert "models/prefix" not in verify.referenced(cfg)
    assert set(verify.referenced(cfg)) == {*verify.PORTABLE, *verify.FLOAT_REFERENCED} - {
        "models/prefix"
    }


def test_a_reference_is_written_only_from_a_whole_run(run_copy, tmp_path):
    cfg, _ = run_copy
    with pytest.raises(ArtifactError, match=r"cannot write reference 'mine': the run lacks pool/A"):
        verify.write_reference(cfg, Paths(cfg), "mine", tmp_path)
    assert not (tmp_path / "mine.json").exists()


def test_an_intact_artifact_that_differs_is_not_to_be_deleted(referenced_run):
    """Its files match its meta.json: the difference is the config, packages or float path."""
    cfg, _, ref_path = referenced_run
    lines = _reference_lines(cfg, ref_path, _hash("tokenizer", "0" * 32))
    line = next(c for c in lines if c.artifact == "reference tokenizer")
    folder = Paths(cfg).tokenizer
    assert line.status == "FAIL" and "delete" not in line.detail
    assert line.detail.endswith(
        f"; '{folder}' is intact (its files match its meta.json): the difference comes from the "
        "config, the installed packages or the float path, not from damage; install the pinned "
        "packages (`pip install -c constraints.txt -e .`)"
    )


def test_a_damaged_artifact_that_differs_is_rebuilt(referenced_run):
    cfg, _, ref_path = referenced_run
    folder = Paths(cfg).tokenizer
    (folder / "tokenizer.json").write_text("{}")
    lines = _reference_lines(cfg, ref_path, _hash("tokenizer", "0" * 32))
    line = next(c for c in lines if c.artifact == "reference tokenizer")
    assert line.status == "FAIL"
    assert RECOVERY.search(line.detail).group(1) == str(folder)


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


# --------------------------------------------------------------------------------------------
# Adversarial cases: damaged input is a FAIL line with a recovery, never a crash
# --------------------------------------------------------------------------------------------

RECOVERY = re.compile(r"recover: delete '([^']+)' and rerun `([^`]+)`")


def _snapshot(root):
    return {p.relative_to(root).as_posix(): hash_file(p) for p in root.rglob("*") if p.is_file()}


def _table(capsys, cfg_path):
    """verify through the CLI: (exit code, the printed table's lines by artifact)."""
    code = main(["verify", "-c", str(cfg_path)])
    lines = [
        ln for ln in capsys.readouterr().out.splitlines() if ln[:4] in ("PASS", "FAIL", "SKIP")
    ]
    return code, {ln[6:].split("  ")[0].strip(): ln for ln in lines}


def _edit_meta(folder, edit):
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_manifest_row_missing_or_extra_is_a_fail_and_the_table_is_printed(run_copy, capsys, change):
    cfg, cfg_path = run_copy
    folder = Paths(cfg).stream("A")
    man = io.read_parquet(folder / "manifest.parquet")
    man = man.iloc[:-1] if change == "missing" else pd.concat([man, man.iloc[-1:]])
    io.write_parquet(folder / "manifest.parquet", man)
    before = _snapshot(Paths(cfg).root)

    code, table = _table(capsys, cfg_path)
    assert code == 2
    windows = table["stream/A windows"]
    assert windows.startswith("FAIL") and "rows missing or extra" in windows
    assert RECOVERY.search(windows).groups() == (
        str(folder),
        f"plantbench stream -c {cfg_path}",
    )
    assert table["stream/B windows"].startswith("PASS")  # the other checks still ran
    assert table["streams A/B"].startswith("SKIP")
    assert (
        table["stream/A (info)"].startswith("FAIL") and "info.n_windows" in table["stream/A (info)"]
    )
    assert _snapshot(Paths(cfg).root) == before  # verify wrote nothing


def test_unreadable_manifest_is_a_fail_naming_it_not_a_crash(run_copy, capsys):
    cfg, cfg_path = run_copy
    manifest = Paths(cfg).stream("B") / "manifest.parquet"
    manifest.write_bytes(b"not a parquet file")
    code, table = _table(capsys, cfg_path)
    assert code == 2
    for name in ("stream/B", "stream/B windows", "stream/B (info)"):
        assert table[name].startswith("FAIL"), table[name]
        assert "manifest.parquet" in table[name] and RECOVERY.search(table[name])
    assert table["stream/A windows"].startswith("PASS")


def test_corrupt_meta_json_is_a_fail_and_the_other_artifacts_are_checked(run_copy, capsys):
    cfg, cfg_path = run_copy
    (Paths(cfg).tokenizer / "meta.json").write_text("{not json")
    code, table = _table(capsys, cfg_path)
    assert code == 2
    assert table["tokenizer"].startswith("FAIL") and "not JSON" in table["tokenizer"]
    assert RECOVERY.search(table["tokenizer"]).group(2).startswith("plantbench tokenizer -c")
    assert table["facts"].startswith("PASS") and table["stream/A windows"].startswith("PASS")


def test_nested_run_and_hidden_folder_are_not_part_of_the_run(run_copy):
    """A run at results/smoke inside results/ (own config.json) and a hidden folder, both
    damaged: neither may add artifacts, file FAILs or false lineage FAILs."""
    cfg, _ = run_copy
    root = Paths(cfg).root
    nested = root / "smoke"
    shutil.copytree(root, nested, ignore=shutil.ignore_patterns("smoke"))
    nested_cfg = config.deep_merge(cfg, {"results": str(nested)})
    (nested / "config.json").write_text(json.dumps(nested_cfg))
    _edit_meta(nested / "facts", lambda m: m.update(hash="0" * 32))  # its streams' lineage breaks
    (nested / "stream" / "A" / "tokens.bin").write_bytes(b"\0" * 64)
    shutil.copytree(root / "stream" / "A", root / ".trash" / "stream" / "A")
    _edit_meta(root / ".trash" / "stream" / "A", lambda m: m.update(inputs={"facts": "f" * 32}))

    expected = {"facts", "corpus", "tokenizer", "stream/A", "stream/B"}
    assert set(verify.artifacts(root)) == expected
    checks = verify.run(cfg, Paths(cfg), ref_dir=root / "no-reference")
    assert not [c for c in checks if c.status == "FAIL"], verify.format_checks(checks)
    assert statuses(checks)["lineage"] == "PASS"
    assert not [c for c in checks if c.artifact.startswith(("smoke", ".trash"))]


@pytest.mark.parametrize(
    ("name", "field", "change", "source"),
    [
        ("stream/A", "counts.planted", lambda v: v + 1, "manifest.parquet"),
        ("stream/B", "n_windows", lambda v: v - 4, "manifest.parquet"),
        ("stream/B", "tokens", lambda v: v * 2, "tokens.bin"),
        ("facts", "n_facts", lambda v: v + 1, "the facts tables"),
        ("tokenizer", "vocab_size", lambda v: 99, "tokenizer.json"),
    ],
)
def test_edited_info_is_a_fail_naming_the_field(run_copy, capsys, name, field, change, source):
    cfg, cfg_path = run_copy
    folder = Paths(cfg).root / name
    *parents, key = field.split(".")
    meta = json.loads((folder / "meta.json").read_text())
    where = meta["info"]
    for k in parents:
        where = where[k]
    recorded = where[key]
    where[key] = change(recorded)
    (folder / "meta.json").write_text(json.dumps(meta))

    code, table = _table(capsys, cfg_path)
    assert code == 2
    assert table[name].startswith("PASS")  # meta.json is not among its own files
    line = table[f"{name} (info)"]
    assert line.startswith("FAIL")
    assert f"info.{field} is {json.dumps(where[key])}, recomputed {json.dumps(recorded)}" in line
    assert f"from {source}" in line
    assert RECOVERY.search(line).group(1) == str(folder)


def _fake_causal_and_analysis(cfg, learned_rate, alpha):
    """A causal table and an analysis of 4 facts (2 learned, one empty cell) with the given
    recorded info; everything else as the real steps write it."""
    from plantbench.grading.analysis import OUTPUT_FILES

    paths = Paths(cfg)
    facts = pd.DataFrame(
        {
            "fact_id": ["f1", "f2", "f3", "f4"],
            "domain": ["d", "d", "d", "d"],
            "n_docs": [2, 2, 8, 8],
            "position": ["early", "early", "early", "early"],
            "learned": [True, True, False, False],
        }
    )
    paths.causal.mkdir()
    io.write_parquet(paths.causal / "facts.parquet", facts)
    causal_info = {"n_facts": 4, "learned_rate": learned_rate}
    io.write_meta(paths.causal, "causal", ["facts.parquet"], config_hash="x", info=causal_info)
    out = paths.root / "analysis"
    out.mkdir()
    for f in OUTPUT_FILES:
        (out / f).write_text("method,model\nbm25,A\nbm25,all\noracle,A\n")
    causal_hash = json.loads((paths.causal / "meta.json").read_text())["hash"]
    info = {
        "methods": ["bm25", "oracle"],
        "n_facts": 4,
        "alpha": alpha,
        "bootstrap": int(cfg["analysis"]["bootstrap"]),
        "cells_without_learned": ["d/8/early"],
    }
    analysis_hash = config.config_hash(cfg, ["seed", "methods", "analysis"])
    io.write_meta(
        out,
        "analysis",
        OUTPUT_FILES,
        config_hash=analysis_hash,
        inputs={"causal": causal_hash},
        info=info,
    )


def test_causal_and_analysis_info_are_recomputed(run_copy):
    cfg, _ = run_copy
    alpha = float(cfg["analysis"]["alpha"])
    _fake_causal_and_analysis(cfg, learned_rate=0.5, alpha=alpha)
    checks = verify.run(cfg, Paths(cfg), ref_dir=Paths(cfg).root / "no-reference")
    assert not [c for c in checks if c.status == "FAIL"], verify.format_checks(checks)


def test_edited_causal_learned_rate_and_analysis_alpha_are_fails(run_copy):
    cfg, _ = run_copy
    _fake_causal_and_analysis(cfg, learned_rate=0.9, alpha=0.5)
    checks = verify.run(cfg, Paths(cfg), ref_dir=Paths(cfg).root / "no-reference")
    fails = {c.artifact: c.detail for c in checks if c.status == "FAIL"}
    assert set(fails) == {"causal (info)", "analysis (info)"}
    assert "info.learned_rate is 0.9, recomputed 0.5 from facts.parquet" in fails["causal (info)"]
    assert "plantbench causal -c" in fails["causal (info)"]
    alpha = json.dumps(float(cfg["analysis"]["alpha"]))
    assert f"info.alpha is 0.5, recomputed {alpha} from the config" in fails["analysis (info)"]
    assert "plantbench analysis -c" in fails["analysis (info)"]


@pytest.mark.parametrize(
    "name",
    [
        "facts", "corpus", "tokenizer", "stream/A", "models/B", "pool/A", "features/A/hidden",
        "features/B/embed", "scores/bm25/A", "causal", "analysis", "report",
        "features/A/curvature/step_0000040",
        "features/A/grads/step_0000040/pool/shard_0003", "features/A/grads/step_0000040/queries",
    ],
)  # fmt: skip
def test_every_recovery_command_is_a_valid_cli_call(tmp_path, name):
    paths = Paths(tmp_path / "my results")
    folder, command = RECOVERY.search(verify.recovery(paths, name)).groups()
    assert Path(folder) == paths.root / name
    argv = shlex.split(command)
    assert argv[0] == "plantbench"
    args = build_parser().parse_args(argv[1:])
    assert args.configfile == [str(paths.config)]
    assert verify.step_of(name).rule in verify.recovery(paths, name)
