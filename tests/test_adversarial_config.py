"""Adversarial configurations: each is refused by ``plantbench config`` with one line naming the
key and the fix, and nothing is written (the results folder is not created, the files around it
are unchanged). Cases already in tests/test_bad_input.py and tests/test_config.py are not
repeated here. The tiny-corpus case, known only once the corpus is built, runs the data steps."""

from __future__ import annotations

import json
import random
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from plantbench import config
from plantbench.cli import main
from plantbench.config import deep_merge

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "config.yaml")
SMOKE = str(ROOT / "tests" / "smoke" / "config.yaml")
SCORE = "def score(ctx, query_rows, pool_rows):\n    return query_rows[:, None] * 0.0\n"


def _plugin(tmp: Path, name: str = "mine", file: str = "mine.py", text: str = SCORE) -> dict:
    (tmp / file).write_text(text)
    return {"methods": {"plugins": [{"name": name, "path": str(tmp / file)}]}}


def _run_folder(folder: Path) -> None:
    """What the `config` step leaves: a results folder holding the run's config.json."""
    folder.mkdir(parents=True)
    cfg = {"results": str(folder), "seed": 1, "facts": {}, "train": {}}
    (folder / "config.json").write_text(json.dumps(cfg))


def _nested_in_run(tmp: Path) -> dict:
    _run_folder(tmp / "outer")
    return {"results": str(tmp / "outer" / "inner")}


def _holds_run(tmp: Path) -> dict:
    _run_folder(tmp / "results" / "old")
    return {}


def _results_is_file(tmp: Path) -> dict:
    (tmp / "notes.txt").write_text("not a folder\n")
    return {"results": str(tmp / "notes.txt")}


def _results_under_file(tmp: Path) -> dict:
    (tmp / "notes.txt").write_text("not a folder\n")
    return {"results": str(tmp / "notes.txt" / "results")}


Setup = Callable[[Path], dict[str, Any]]
SPANS = "stream.position_spans"

# (case id, override: a dict, a function of the tmp folder returning one, or raw YAML text,
#  the distinctive part of the one-line message)
CASES: list[tuple[str, dict | Setup | str, str]] = [
    (
        "no-method-to-score",
        {"methods": {"enabled": [], "plugins": []}},
        "'methods.enabled' is empty and 'methods.plugins' lists none: there is no method to score",
    ),
    (
        "overlapping-spans",
        {"stream": {"position_spans": {"early": [0.0, 0.5], "middle": [0.4, 0.6]}}},
        f"'{SPANS}.early' = [0.0, 0.5] and '{SPANS}.middle' = [0.4, 0.6] overlap",
    ),
    (
        "spans-out-of-order",
        {"stream": {"position_spans": {"early": [0.85, 1.0], "late": [0.0, 0.2]}}},
        f"'{SPANS}.middle' = [0.4, 0.6] starts before '{SPANS}.early' = [0.85, 1.0]",
    ),
    (
        "span-above-one",
        {"stream": {"position_spans": {"late": [0.85, 1.2]}}},
        f"'{SPANS}.late.1' = 1.2 is out of range; it must be <= 1",
    ),
    (
        "span-below-zero",
        {"stream": {"position_spans": {"early": [-0.1, 0.2]}}},
        f"'{SPANS}.early.0' = -0.1 is out of range; it must be >= 0",
    ),
    (
        "span-one-number",
        {"stream": {"position_spans": {"late": [0.9]}}},
        f"'{SPANS}.late' = [0.9] has too few items; give at least 2",
    ),
    (
        "tracin-more-than-saved",
        {"features": {"tracin_checkpoints": 5}},
        "'features.tracin_checkpoints' = 5 asks for more checkpoints than the 4 that "
        "train.steps = 6080 with train.checkpoint_every_steps = 320 saves",
    ),
    (
        "tracin-with-one-checkpoint",
        {"train": {"checkpoint_every_steps": 1280}},
        "'features.tracin_checkpoints' = 2 asks for more checkpoints than the 1 that",
    ),
    ("yaml-exponent", "train:\n  lr: 3e-3\n", "YAML reads 3e-3 as a string: write 3.0e-3"),
    ("yaml-exponent-no-sign", "model:\n  rope_theta: 1e4\n", "write 1.0e+4"),
    ("yaml-exponent-integer", "train:\n  steps: 1.2e3\n", "'train.steps' = \"1.2e3\""),
    ("quoted-number", "train:\n  steps: '1200'\n", "expected integer; write it without quotes"),
    ("duplicate-yaml-key", "train:\n  lr: 1.0e-3\n  lr: 4.0e-3\n", "gives key 'lr' twice (line 3)"),
    ("scalar-file", "just some words\n", "must hold a mapping of keys, not str"),
    ("null-section", "train:\n", "'train' = null has the wrong type; expected object"),
    ("bool-for-integer", "model:\n  n_layer: yes\n", "'model.n_layer' = true has the wrong type"),
    ("fraction-for-integer", {"train": {"steps": 12.5}}, "'train.steps' = 12.5 has the wrong type"),
    ("zero-steps", {"train": {"steps": 0}}, "'train.steps' = 0 is out of range; it must be >= 1"),
    ("zero-batch", {"train": {"batch_windows": 0}}, "'train.batch_windows' = 0 is out of range"),
    ("zero-window", {"stream": {"window": 0}}, "'stream.window' = 0 is out of range"),
    ("tiny-vocab", {"tokenizer": {"vocab_size": 100}}, "'tokenizer.vocab_size' = 100 is out of"),
    ("zero-lr", {"train": {"lr": 0.0}}, "'train.lr' = 0.0 is out of range; it must be > 0"),
    ("heldout-all", {"corpus": {"heldout_fraction": 1.0}}, "it must be < 1"),
    ("passes-zero", {"stream": {"max_background_passes": 0}}, "max_background_passes' = 0"),
    (
        "odd-head-dim",
        {"model": {"n_embd": 36, "n_head": 4}},
        "'model.n_embd' / 'model.n_head' must be even",
    ),
    (
        "devices-do-not-divide",
        {"train": {"devices": 3}},
        "'train.devices' x 'train.micro_batch_windows' = 3 x 8",
    ),
    (
        "min-doc-above-max",
        {"corpus": {"min_doc_chars": 7000}},
        "'corpus.min_doc_chars' must be <= 'corpus.max_doc_chars'",
    ),
    ("unknown-stream-key", {"stream": {"passes": 3}}, "unknown config key 'stream.passes'"),
    ("empty-corpus-sources", {"corpus": {"sources": []}}, "'corpus.sources' = [] has too few"),
    ("unknown-source-kind", {"corpus": {"sources": [{"kind": "http"}]}}, '"stdlib", "text"'),
    (
        "source-without-kind",
        {"corpus": {"sources": [{"path": "x.txt"}]}},
        "missing a required key: 'corpus.sources.0.kind'",
    ),
    (
        "enabled-twice",
        {"methods": {"enabled": ["bm25", "bm25"]}},
        '\'methods.enabled\' = ["bm25", "bm25"] repeats an item',
    ),
    ("empty-results", {"results": ""}, "'results' = \"\" is too short"),
    (
        "plugin-name-pattern",
        lambda t: _plugin(t, name="Mine"),
        "'methods.plugins.0.name' = \"Mine\" is not allowed; it must match",
    ),
    (
        "plugin-unknown-key",
        {"methods": {"plugins": [{"name": "mine", "path": "m.py", "weight": 1}]}},
        "unknown config key 'methods.plugins.0.weight'",
    ),
    (
        "plugin-without-path",
        {"methods": {"plugins": [{"name": "mine"}]}},
        "missing a required key: 'methods.plugins.0.path'",
    ),
    (
        "plugin-names-repeat",
        lambda t: {
            "methods": {
                "plugins": [
                    *_plugin(t, file="a.py")["methods"]["plugins"],
                    *_plugin(t, file="b.py")["methods"]["plugins"],
                ]
            }
        },
        "'methods.plugins.1.name' = 'mine' is used by another plug-in",
    ),
    (
        "plugin-path-missing",
        lambda t: {"methods": {"plugins": [{"name": "mine", "path": str(t / "ghost.py")}]}},
        "ghost.py' does not exist",
    ),
    ("plugin-not-python", lambda t: _plugin(t, file="mine.txt"), "mine.txt' is not a Python file"),
    (
        "plugin-syntax-error",
        lambda t: _plugin(t, text="def score(:\n"),
        "mine.py' is not valid Python (line 1)",
    ),
    (
        "plugin-without-score",
        lambda t: _plugin(t, text="def scores(ctx, q, p):\n    return 0\n"),
        "mine.py' defines no function score(ctx, query_rows, pool_rows)",
    ),
    (
        "plugin-is-a-builtin",
        lambda t: _plugin(t, name="bm25"),
        "'methods.plugins.0.name' = 'bm25' is a built-in method",
    ),
    (
        "plugin-also-enabled",
        lambda t: deep_merge(_plugin(t), {"methods": {"enabled": ["bm25", "mine"]}}),
        "'methods.plugins.0.name' = 'mine' is also in 'methods.enabled'",
    ),
    (
        "results-is-a-file",
        _results_is_file,
        "notes.txt' is a file where a folder belongs; give the path of a folder for the outputs",
    ),
    ("results-under-a-file", _results_under_file, "notes.txt', which is a file, not a folder"),
    (
        "plugin-named-nan",
        lambda t: _plugin(t, name="nan"),
        "'methods.plugins.0.name' = 'nan' reads back from a csv table as a missing value",
    ),
    ("results-inside-a-run", _nested_in_run, "is inside the results folder of another run"),
    ("results-holding-a-run", _holds_run, "holds the results folder of another run"),
]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("plantbench: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _case_files(tmp: Path, override: dict | Setup | str) -> list[str]:
    """``-c`` arguments: the default config, ``results`` inside ``tmp``, then the case (which
    may set ``results`` itself)."""
    (tmp / "results.yaml").write_text(yaml.safe_dump({"results": str(tmp / "results")}))
    case = tmp / "case.yaml"
    if isinstance(override, str):
        case.write_text(override)
    else:
        case.write_text(yaml.safe_dump(override(tmp) if callable(override) else override))
    return ["-c", DEFAULT, "-c", str(tmp / "results.yaml"), "-c", str(case)]


@pytest.mark.parametrize(("case", "override", "expect"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_one_line_and_nothing_written(tmp_path, capsys, case, override, expect):
    files = _case_files(tmp_path, override)
    had_results = (tmp_path / "results").exists()
    before = _snapshot(tmp_path)
    assert main(["config", *files]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert expect in line, line
    assert _snapshot(tmp_path) == before
    assert (tmp_path / "results").exists() == had_results


def test_the_json_route_refuses_a_list(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--json", "[1, 2]"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "'(top level)' = [1, 2] has the wrong type; expected object" in line
    assert list(tmp_path.iterdir()) == []


def test_a_config_file_next_to_the_results_is_not_a_run(tmp_path, capsys):
    """A config passed with -c beside the results folder (not a results folder itself) and a
    checkpoint's config.json inside it are not runs: the config step goes ahead."""
    (tmp_path / "results" / "models" / "A" / "step_1").mkdir(parents=True)
    (tmp_path / "results" / "models" / "A" / "step_1" / "config.json").write_text('{"a": 1}')
    side = {"results": str(tmp_path / "results"), "seed": 1, "facts": {}, "train": {}}
    (tmp_path / "config.json").write_text(json.dumps(side))
    case = tmp_path / "case.yaml"
    case.write_text(yaml.safe_dump({"results": str(tmp_path / "results")}))
    assert main(["config", "-c", DEFAULT, "-c", str(case)]) == 0
    written = json.loads((tmp_path / "results" / "config.json").read_text())
    assert written["results"] == str(tmp_path / "results")


# ---- the tiny corpus: known only once the corpus is built ----------------------------------

WORDS = "oak fern moss reed pine lily rose sage mint basil thyme ivy elm ash yew".split()


def _tiny_corpus(path: Path) -> Path:
    """About 15 kB of distinct paragraphs over a 15-word vocabulary."""
    g = random.Random(7)
    paras = [" ".join(g.choice(WORDS) for _ in range(60)) + "." for _ in range(60)]
    path.write_text("\n\n".join(paras) + "\n")
    return path


def _tiny_study(tmp: Path, **stream: Any) -> str:
    over = {
        "results": str(tmp / "results"),
        "corpus": {
            "sources": [{"kind": "text", "path": str(_tiny_corpus(tmp / "tiny.txt"))}],
            "max_doc_chars": 400,
        },
        "tokenizer": {"reading_bytes": 0},  # the corpus alone: too small for the vocabulary
        "stream": {"window": 1024, **stream},
        "methods": {"plugins": []},
    }
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(over))
    assert main(["config", "-c", DEFAULT, "-c", SMOKE, "-c", str(tmp / "tiny.yaml")]) == 0
    return str(tmp / "results" / "config.json")


def test_tiny_corpus_warns_at_the_tokenizer_and_is_refused_by_the_stream(tmp_path, capsys):
    cfg = _tiny_study(tmp_path)
    for step in ("facts", "corpus"):
        assert main([step, "-c", cfg]) == 0, step
    capsys.readouterr()
    assert main(["tokenizer", "-c", cfg]) == 0
    warnings = [
        ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("plantbench: warning:")
    ]
    assert len(warnings) == 1 and "fewer than tokenizer.vocab_size = 1024" in warnings[0]
    info = json.loads((tmp_path / "results" / "tokenizer" / "meta.json").read_text())["info"]
    assert info["vocab_size"] < 1024
    assert info["warnings"] == [warnings[0].removeprefix("plantbench: warning: ")]

    assert main(["stream", "-c", cfg]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "the corpus is too small for the stream" in line
    assert "more than stream.max_background_passes = 4" in line
    assert "raise stream.max_background_passes" in line
    assert not (tmp_path / "results" / "stream").exists()


def test_raising_max_background_passes_lets_the_tiny_corpus_through(tmp_path, capsys):
    cfg = _tiny_study(tmp_path, max_background_passes=1000)
    for step in ("facts", "corpus", "tokenizer", "stream"):
        assert main([step, "-c", cfg]) == 0, step
    info = json.loads((tmp_path / "results" / "stream" / "A" / "meta.json").read_text())["info"]
    assert 4 < info["background_epochs"] <= 1000


def test_clean_results_keeps_the_committed_reference_and_readme(tmp_path):
    """`make clean-results` removes what runs wrote under results/, never results/reference/."""
    import shutil
    import subprocess

    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "results" / "reference").mkdir(parents=True)
    (tmp_path / "results" / "reference" / "default.json").write_text("{}")
    (tmp_path / "results" / "README.md").write_text("docs")
    for made in ("facts/meta.json", "config.json", ".plantbench/config/x.json"):
        (tmp_path / "results" / made).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / made).write_text("{}")
    subprocess.run(["make", "-s", "clean-results"], cwd=tmp_path, check=True)
    left = sorted(
        p.relative_to(tmp_path / "results").as_posix() for p in (tmp_path / "results").rglob("*")
    )
    assert left == ["README.md", "reference", "reference/default.json"]


# ---- the last silent and raw failures: one line each (or a clean stop) ----------------------


def _unreadable(tmp: Path, kind: str) -> Path:
    if kind == "folder":
        (tmp / "conf").mkdir()
        return tmp / "conf"
    if kind == "not-utf8":
        (tmp / "latin.yaml").write_bytes("seed: 1 # caf\xe9\n".encode("latin-1"))
        return tmp / "latin.yaml"
    return tmp / "ghost.yaml"


@pytest.mark.parametrize(
    ("kind", "expect"),
    [
        ("folder", "conf' is a folder where a file belongs; give the path of a YAML config file"),
        ("missing", "ghost.yaml' does not exist; give the path of a YAML config file"),
        ("not-utf8", "latin.yaml' is not UTF-8 text (byte 13); save it as UTF-8"),
    ],
)
def test_an_unreadable_config_file_is_one_line(tmp_path, capsys, kind, expect):
    bad = _unreadable(tmp_path, kind)
    before = _snapshot(tmp_path)
    assert main(["config", "-c", DEFAULT, "-c", str(bad)]) == 2
    assert expect in _one_error_line(capsys.readouterr().err)
    assert _snapshot(tmp_path) == before


def test_the_snakefile_reads_config_files_as_the_cli_does(tmp_path):
    """A key given twice in a --configfile is refused (Snakemake alone keeps the last)."""
    from plantbench.config import from_snakemake
    from plantbench.errors import ConfigError

    dup = tmp_path / "dup.yaml"
    dup.write_text("train:\n  lr: 1.0e-3\n  lr: 4.0e-3\n")
    merged = deep_merge(yaml.safe_load(Path(DEFAULT).read_text()), {"train": {"lr": 4.0e-3}})
    with pytest.raises(ConfigError, match=r"dup.yaml' gives key 'lr' twice \(line 3\)"):
        from_snakemake(merged, [DEFAULT, str(dup)], {})


def test_snakemake_config_values_are_typed_as_yaml(tmp_path):
    """``--config 'train={steps: 10}'``: Snakemake's parser leaves "10" a string; it is read as
    the number a config file would give (and a real error names no quotes that were not there)."""
    from plantbench.config import from_snakemake
    from plantbench.errors import ConfigError

    base = yaml.safe_load(Path(DEFAULT).read_text())
    over = {"results": str(tmp_path / "r"), "train": {"steps": "6400"}}
    cfg = from_snakemake(deep_merge(base, over), [DEFAULT], over)
    assert cfg["train"]["steps"] == 6400
    zero = {"results": str(tmp_path / "r"), "train": {"steps": "0"}}
    with pytest.raises(ConfigError, match="'train.steps' = 0 is out of range") as err:
        from_snakemake(deep_merge(base, zero), [DEFAULT], zero)
    assert "quotes" not in str(err.value)


def _snakemake_errors(tmp: Path, *args: str) -> list[str]:
    """The error lines of a dry run of the smoke study with ``args`` (results inside ``tmp``)."""
    import subprocess

    snakemake = Path(sys.executable).parent / "snakemake"
    cmd = [str(snakemake), "-n", "--configfile", SMOKE, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp / "results").exists()
    return [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]


def test_snakemake_refuses_a_duplicate_key_in_one_line(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text(f"results: '{tmp_path / 'results'}'\ntrain:\n  lr: 1.0e-3\n  lr: 4.0e-3\n")
    assert _snakemake_errors(tmp_path, str(dup)) == [
        f"plantbench: config error: config file '{dup}' gives key 'lr' twice (line 4); "
        "keep only one of them"
    ]


def test_snakemake_types_a_nested_config_value(tmp_path):
    over = ["--config", "train={steps: 0}", f"results={tmp_path / 'results'}"]
    assert _snakemake_errors(tmp_path, *over) == [
        "plantbench: config error: config key 'train.steps' = 0 is out of range; it must be >= 1"
    ]


def _snakemake_args_error(tmp: Path, *args: str) -> str:
    """The one stderr line of ``snakemake -n *args``, refused while Snakemake parses its command
    line (by the workflow profile), before the Snakefile runs; nothing written."""
    import subprocess

    snakemake = Path(sys.executable).parent / "snakemake"
    before = _snapshot(tmp)
    proc = subprocess.run([str(snakemake), "-n", *args], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert _snapshot(tmp) == before and not (tmp / "results").exists()
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_snakemake_refuses_a_dotted_config_key_in_one_line(tmp_path):
    assert _snakemake_args_error(
        tmp_path, "--config", "train.steps=10", f"results={tmp_path / 'results'}"
    ) == (
        "plantbench: config error: --config train.steps=10 names a nested key, but Snakemake's "
        "--config takes top-level keys only; write --config 'train={steps: 10}' or set it in a "
        "--configfile"
    )


def test_snakemake_refuses_a_config_folder_in_one_line(tmp_path):
    (tmp_path / "conf").mkdir()
    assert _snakemake_args_error(tmp_path, "--configfile", str(tmp_path / "conf")) == (
        f"plantbench: config error: config file '{tmp_path / 'conf'}' is a folder where a file "
        "belongs; give the path of a YAML config file"
    )


def test_snakemake_refuses_a_missing_config_file_in_one_line(tmp_path):
    assert _snakemake_args_error(tmp_path, "--configfile", str(tmp_path / "ghost.yaml")) == (
        f"plantbench: config error: config file '{tmp_path / 'ghost.yaml'}' does not exist; "
        "give the path of a YAML config file"
    )


@pytest.mark.parametrize(
    ("entries", "expect"),
    [
        (["results=r", "train={steps: 10}"], None),
        (["model.n_layer=4"], "write --config 'model={n_layer: 4}' or set it in a --configfile"),
        (["a.b.c=x"], "write --config 'a={b: {c: x}}'"),
        (["results"], "--config entry 'results' is not key=value; write --config results=VALUE"),
        (["9lives=1"], "--config key '9lives' is not a top-level key name"),
    ],
)
def test_snakemake_args_are_checked_before_snakemake_parses_them(entries, expect):
    from plantbench.config import check_snakemake_args
    from plantbench.errors import ConfigError

    if expect is None:
        check_snakemake_args(entries, [DEFAULT, Path(SMOKE)])
        return
    with pytest.raises(ConfigError) as err:
        check_snakemake_args(entries, [])
    assert expect in str(err.value)


THREADED_STEPS = ["prefix", "pretrain", "grads", "score", "causal", "bench", "membership-detect"]


@pytest.mark.parametrize("value", ["-1", "0", "two"])
@pytest.mark.parametrize("step", THREADED_STEPS)
def test_threads_is_range_checked_by_every_step(capsys, step, value):
    from plantbench.cli import THREADED

    assert set(THREADED_STEPS) <= set(THREADED)
    with pytest.raises(SystemExit) as stop:
        main([step, "--threads", value, "--model", "A"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "argument --threads:" in err[-1] and "give 1 or more" in err[-1], err
    assert "Traceback" not in "\n".join(err)


def test_every_threaded_step_checks_threads():
    from plantbench.cli import THREADED, build_parser

    sub = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for step in THREADED:
        action = next(a for a in sub[step]._actions if "--threads" in a.option_strings)
        with pytest.raises(Exception, match="out of range"):
            action.type("-1")


def test_verify_out_through_a_file_names_the_cause(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"results": str(tmp_path / "results")}))
    assert main(["config", "-c", DEFAULT, "-c", str(tmp_path / "c.yaml")]) == 0
    cfg = str(tmp_path / "results" / "config.json")
    capsys.readouterr()
    assert main(["verify", "-c", cfg, "--out", str(tmp_path / "notes.txt" / "checks.txt")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "notes.txt' while running 'verify'; it is a file where a folder belongs" in line, line
    assert "free disk space" not in line


# ---- every corpus source is accounted for ----------------------------------------------------


def _two_sources(tmp: Path, **second: Any) -> dict[str, Any]:
    big = _tiny_corpus(tmp / "first.txt")
    other = tmp / "second.txt"
    other.write_text("\n\n".join(f"reed {i} " * 40 for i in range(20)) + "\n")
    return {
        "results": str(tmp / "results"),
        "corpus": {
            "sources": [
                {"kind": "text", "path": str(big)},
                {"kind": "text", "path": str(other), **second},
            ],
            "max_doc_chars": 400,
            "max_bytes": big.stat().st_size // 2,
        },
        "methods": {"plugins": []},
    }


def test_a_source_that_contributes_nothing_is_a_warning(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_two_sources(tmp_path)))
    assert main(["config", "-c", DEFAULT, "-c", SMOKE, "-c", str(tmp_path / "c.yaml")]) == 0
    capsys.readouterr()
    assert main(["corpus", "-c", str(tmp_path / "results" / "config.json")]) == 0
    warnings = [
        ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("plantbench: warning:")
    ]
    assert len(warnings) == 1, warnings
    assert "corpus.sources.1 (text" in warnings[0]
    assert "contributes no documents: corpus.max_bytes" in warnings[0]
    info = json.loads((tmp_path / "results" / "corpus" / "meta.json").read_text())["info"]
    assert [s["docs"] > 0 for s in info["sources"]] == [True, False]
    assert info["warnings"] == [warnings[0].removeprefix("plantbench: warning: ")]


def test_a_required_source_that_contributes_nothing_stops_the_corpus(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_two_sources(tmp_path, required=True)))
    assert main(["config", "-c", DEFAULT, "-c", SMOKE, "-c", str(tmp_path / "c.yaml")]) == 0
    capsys.readouterr()
    assert main(["corpus", "-c", str(tmp_path / "results" / "config.json")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "contributes no documents" in line and "required" in line
    assert not (tmp_path / "results" / "corpus").exists()


# ---- batch checks what it reads --------------------------------------------------------------


def test_batch_refuses_a_manifest_with_a_deleted_row(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = _tiny_study(tmp_path, max_background_passes=1000)
    for step in ("facts", "corpus", "tokenizer", "stream"):
        assert main([step, "-c", cfg]) == 0, step
    manifest = tmp_path / "results" / "stream" / "A" / "manifest.parquet"
    table = pq.read_table(manifest)
    pq.write_table(pa.concat_tables([table.slice(0, 10), table.slice(11)]), manifest)
    capsys.readouterr()
    assert main(["batch", "-c", cfg, "--model", "A", "--step", "1"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "manifest.parquet' does not match its recorded hash" in line, line
    assert capsys.readouterr().out == ""


# ---- one error boundary around plug-ins ------------------------------------------------------

TILE = (np.arange(4, 6), np.arange(10, 13))


def _loaded(tmp: Path, name: str, text: str):
    from plantbench.attribution.methods import registry

    (tmp / f"{name}.py").write_text(text)
    return registry.load_plugin(name, tmp / f"{name}.py")


def test_a_plugin_needs_string_is_refused_on_load_not_split(tmp_path):
    from plantbench.errors import ConfigError

    text = f'NEEDS = "grads"\n{SCORE}'
    with pytest.raises(ConfigError, match=r"sets NEEDS = 'grads'; write NEEDS = \['grads'\]"):
        _loaded(tmp_path, "needs_str", text)


def test_a_plugin_description_must_be_text(tmp_path):
    from plantbench.errors import ConfigError

    with pytest.raises(ConfigError, match="sets DESCRIPTION = 3; make DESCRIPTION one line"):
        _loaded(tmp_path, "desc_int", f"DESCRIPTION = 3\n{SCORE}")


def _tile_error(tmp_path, name: str, text: str) -> str:
    """The one-line error a plug-in ``name`` with source ``text`` raises on :data:`TILE`."""
    from plantbench.errors import PlantbenchError

    m = _loaded(tmp_path, name, text)
    with pytest.raises(PlantbenchError) as err:
        m.score(None, *TILE)
    return str(err.value)


def test_a_plugin_returning_strings_is_one_line(tmp_path):
    text = "def score(ctx, q, p):\n    return [['a'] * len(p) for _ in q]\n"
    msg = _tile_error(tmp_path, "strings", text)
    assert "plug-in 'strings'" in msg and "query rows 4-5 x pool rows 10-12" in msg
    assert "returned list that is not numbers; make score() return a [2, 3] array" in msg
    assert "\n" not in msg


def test_a_plugin_that_raises_is_one_line_naming_it(tmp_path):
    text = "def score(ctx, q, p):\n    raise KeyError('embedding')\n"
    msg = _tile_error(tmp_path, "raiser", text)
    assert msg.startswith("plug-in 'raiser' (") and "query rows 4-5 x pool rows 10-12" in msg
    assert "raised KeyError: 'embedding'; fix score() in" in msg and "\n" not in msg


# ---- the audit server is bounded --------------------------------------------------------------


class _EchoAuditor:
    """What app() needs of an auditor; audit() checks its text as the real one does."""

    probe = {"model": "A"}
    layers = [1]
    window = 8

    def audit(self, context: str, query: str) -> dict[str, Any]:
        from plantbench.suites.membership.serve import scalar_text

        scalar_text("context", context)
        scalar_text("query", query)
        return {"tokens": len(context)}


def test_the_audit_server_refuses_a_lone_surrogate_with_422():
    from fastapi.testclient import TestClient

    from plantbench.suites.membership.serve import app

    client = TestClient(app(_EchoAuditor()))  # type: ignore[arg-type]
    body = '{"context": "ok \\ud800 there", "query": "Who?"}'
    r = client.post("/audit", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "U+D800 at character 3, a lone surrogate" in r.json()["detail"]


def test_the_audit_server_refuses_a_request_over_its_size_limit():
    from fastapi.testclient import TestClient

    from plantbench.suites.membership.serve import app

    client = TestClient(app(_EchoAuditor(), max_bytes=1000))  # type: ignore[arg-type]
    assert client.post("/audit", json={"context": "x" * 900, "query": "q"}).status_code == 200
    r = client.post("/audit", json={"context": "x" * 2000, "query": "q"})
    assert r.status_code == 413
    assert "larger than 1000 bytes (membership.max_request_bytes)" in r.json()["detail"]

    def chunks():  # no Content-Length: the limit holds as the body streams in
        yield b'{"context": "'
        for _ in range(10):
            yield b"x" * 200
        yield b'", "query": "q"}'

    r = client.post("/audit", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_the_request_limit_is_a_config_key(tmp_path):
    from plantbench.config import load
    from plantbench.suites.membership.serve import MAX_REQUEST_BYTES, max_request_bytes

    over = tmp_path / "o.yaml"
    over.write_text(yaml.safe_dump({"results": str(tmp_path / "r")}))
    assert max_request_bytes(load([DEFAULT, over])) == MAX_REQUEST_BYTES
    over.write_text(
        yaml.safe_dump({"results": str(tmp_path / "r"), "membership": {"max_request_bytes": 5}})
    )
    assert max_request_bytes(load([DEFAULT, over])) == 5


# ---- a job dies whole --------------------------------------------------------------------------

WORKER = """
import os, pathlib, sys, time
from plantbench.ops.process import die_with_parent
die_with_parent()
out = pathlib.Path(sys.argv[1])
(out.parent / "pid").write_text(str(os.getpid()))
while not (out.parent / "never").exists():
    time.sleep(0.05)  # a long step: it would write its meta.json when it ends
out.write_text("written after the job ended")
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_for_end(pid: int, seconds: float) -> None:
    import time

    deadline = time.monotonic() + seconds
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_sigterm_to_the_job_wrapper_ends_the_step_before_it_writes(tmp_path):
    """Snakemake runs a rule as `bash -c '<command>'`; SIGTERM to that wrapper (a cluster's
    scancel of the job step) ends the Python step under it, which writes nothing afterwards."""
    import signal
    import subprocess
    import time

    (tmp_path / "w.py").write_text(WORKER)
    out = tmp_path / "meta.json"
    wrapper = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" "{tmp_path / "w.py"}" "{out}"; echo done'],
    )
    while not (tmp_path / "pid").exists():
        assert wrapper.poll() is None
        time.sleep(0.05)
    pid = int((tmp_path / "pid").read_text())
    wrapper.send_signal(signal.SIGTERM)
    wrapper.wait()
    _wait_for_end(pid, 30)  # the step ends with its wrapper
    (tmp_path / "never").write_text("")  # an orphan would now go on to write and end
    _wait_for_end(pid, 30)
    assert not out.exists()


def test_the_cli_dies_with_its_parent_when_run_as_a_process(monkeypatch, capsys):
    from plantbench.ops import process

    calls: list[int] = []
    monkeypatch.setattr(process, "die_with_parent", lambda: bool(calls.append(1)) or True)
    monkeypatch.setattr(sys, "argv", ["plantbench", "config", "--json", "[1]"])
    assert main() == 2  # the command line of a process of its own
    assert calls == [1]
    assert main(["config", "--json", "[1]"]) == 2  # a call from Python: left alone
    assert calls == [1]


def test_the_report_lists_the_data_steps_warnings(tmp_path):
    from plantbench.paths import Paths
    from plantbench.report.build import warning_lines

    paths = Paths({"results": str(tmp_path)})
    assert warning_lines(paths) == []  # no warnings: no section (the default report unchanged)
    (tmp_path / "corpus").mkdir()
    meta = {"stage": "corpus", "info": {"warnings": ["corpus.sources.1 (text) contributes no"]}}
    (tmp_path / "corpus" / "meta.json").write_text(json.dumps(meta))
    assert warning_lines(paths) == [
        "## Warnings",
        "",
        "- corpus: corpus.sources.1 (text) contributes no",
        "",
    ]


# ---- the workflow's config file, looked for in the working directory (-d) -------------------


def _snakemake_in(cwd: Path, *args: str) -> list[str]:
    """The stderr lines of ``snakemake -s <checkout>/Snakefile -n *args`` run from ``cwd``
    (exit 1, no traceback, nothing written there)."""
    import subprocess

    snakemake = Path(sys.executable).parent / "snakemake"
    cmd = [str(snakemake), "-s", str(ROOT / "Snakefile"), "-n", *args]
    before = _snapshot(cwd)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert _snapshot(cwd) == before
    return proc.stderr.splitlines()


def _copy(workdir: Path) -> str:
    return f"cp {shlex.quote(DEFAULT)} {shlex.quote(str(workdir))}"


def _workflow_config_missing(workdir: Path) -> str:
    return (
        "plantbench: config error: the workflow's config file 'config.yaml' does not exist "
        f"(relative paths start at the working directory '{workdir}'); copy the checkout's "
        f"config.yaml there ({_copy(workdir)}) or pass --configfile FILE"
    )


def test_snakemake_names_the_config_file_missing_from_the_working_directory(tmp_path):
    """The documented `snakemake -s <checkout>/Snakefile -d <workdir>`, where <workdir> has no
    config.yaml: one line naming the file, where it was looked for, and the fix."""
    workdir = tmp_path / "my work"
    workdir.mkdir()
    errors = [ln for ln in _snakemake_in(tmp_path, "-d", str(workdir)) if "error" in ln.lower()]
    assert errors == [_workflow_config_missing(workdir)]


def test_snakemake_names_a_config_folder_in_the_working_directory(tmp_path):
    """Snakemake would read it even with --configfile (and fail with a traceback)."""
    workdir = tmp_path / "work"
    (workdir / "config.yaml").mkdir(parents=True)
    errors = [ln for ln in _snakemake_in(workdir, "--configfile", DEFAULT) if "error" in ln]
    assert errors == [
        "plantbench: config error: the workflow's config file 'config.yaml' is a folder where a "
        "file belongs; give the path of a YAML config file"
    ]


def test_snakemake_names_the_missing_config_file_behind_a_partial_configfile(tmp_path):
    """With --configfile, Snakemake skips the missing config.yaml without a word: the keys it
    would give are missing, and the line says why."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    partial = tmp_path / "mine.yaml"
    partial.write_text(f"results: '{tmp_path / 'results'}'\ntrain:\n  steps: 100\n")
    lines = _snakemake_in(workdir, "--configfile", str(partial))
    errors = [ln for ln in lines if "error" in ln.lower()]
    more = len(config.schema()["required"]) - 3  # results and train are given, seed named
    assert errors == [
        "plantbench: config error: the workflow's config file 'config.yaml' does not exist "
        f"(relative paths start at the working directory '{workdir}'); without it the config "
        f"lacks 'seed' (and {more} more): copy the checkout's config.yaml there "
        f"({_copy(workdir)}) or give it first: --configfile {shlex.quote(DEFAULT)} FILE ..."
    ]
    assert not (tmp_path / "results").exists()
