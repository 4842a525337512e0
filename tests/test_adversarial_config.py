"""Adversarial configurations: each is refused by ``plantbench config`` with one line naming the
key and the fix, and nothing is written (the results folder is not created, the files around it
are unchanged). Cases already in tests/test_bad_input.py and tests/test_config.py are not
repeated here. The tiny-corpus case, known only once the corpus is built, runs the data steps."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    ("results-is-a-file", _results_is_file, "notes.txt' is a file; give a folder"),
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
