"""Every path a user gives is checked by one function (src/plantbench/userpaths.py): each cause
(does not exist, a folder where a file belongs, a file where a folder belongs, cannot be read)
is one line naming the config key or option and the path, whichever reader meets it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from plantbench import config
from plantbench.cli import main
from plantbench.errors import PlantbenchError

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "config.yaml")
SCORE = "def score(ctx, query_rows, pool_rows):\n    return query_rows[:, None] * 0.0\n"


def _cli_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The message of the one ``plantbench: error:`` line of ``plantbench *argv`` (exit 2)."""
    assert main(argv) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("plantbench: ")]
    assert len(lines) == 1, lines
    return lines[0].removeprefix("plantbench: error: ")


def _raised(fn: Callable[[], object]) -> str:
    with pytest.raises(PlantbenchError) as err:
        fn()
    return str(err.value)


# --- the readers: each returns the one-line message for the path ---------------------------


def _configfile(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    return _cli_error(capsys, ["config", "-c", str(path), "--out", str(tmp / "out.json")])


def _plugin(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    over = {
        "results": str(tmp / "results"),
        "methods": {"plugins": [{"name": "mine", "path": str(path)}]},
    }
    return _raised(lambda: config.load([DEFAULT], over))


def _registry(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from plantbench.attribution.methods import registry

    return _raised(lambda: registry.load_plugin("mine", path))


def _corpus(kind: str) -> Callable[[Path, Path, pytest.CaptureFixture[str]], str]:
    def read(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
        from plantbench.data import corpus

        cfg = {"corpus": {"sources": [{"kind": "stdlib"}, {"kind": kind, "path": str(path)}]}}
        return _raised(lambda: corpus.collect(cfg))

    return read


def _encoder(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    from plantbench.attribution.encoder import resolve_encoder

    return _raised(lambda: resolve_encoder(str(path)))


def _bundle(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The bundle's checks fail with the path's line (its table prints it too)."""
    line = _cli_error(capsys, ["verify", "--bundle", str(path)])
    first = "verify: 1 check(s) failed; first: bundle: "
    assert line.startswith(first), line
    return line.removeprefix(first)


def _measured(tmp: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    return _cli_error(capsys, ["plan", "-c", DEFAULT, "--measured", str(path)])


CONFIG_FILE = ("config file", "a YAML config file")
PLUGIN = ("config key 'methods.plugins.0.path' =", "the plug-in's .py file")
REGISTRY = ("methods.plugins: plug-in 'mine' file", "the plug-in's .py file")
TEXT = ("config key 'corpus.sources.1.path' =", "a .txt file or a folder of them")
DATASETS = ("config key 'corpus.sources.1.path' =", "a folder written by datasets' save_to_disk")
ENCODER = (
    "config key 'features.encoder' =",
    "a sentence-transformers model folder (or the name of an installed encoder package)",
)
BUNDLE = ("--bundle", "a release bundle folder (written by plantbench export)")
MEASURED = ("--measured", "a run's benchmarks folder")

Reader = Callable[[Path, Path, pytest.CaptureFixture[str]], str]

# (reader id, reader, (what, noun)) per cause
MISSING_READERS: list[tuple[str, Reader, tuple[str, str]]] = [
    ("configfile", _configfile, CONFIG_FILE),
    ("plugin", _plugin, PLUGIN),
    ("registry", _registry, REGISTRY),
    ("corpus", _corpus("text"), TEXT),
    ("encoder", _encoder, ENCODER),
    ("bundle", _bundle, BUNDLE),
]
FOLDER_READERS = MISSING_READERS[:3]  # they want a file
FILE_READERS: list[tuple[str, Reader, tuple[str, str]]] = [  # they want a folder
    ("corpus-datasets", _corpus("datasets"), DATASETS),
    ("encoder", _encoder, ENCODER),
    ("bundle", _bundle, BUNDLE),
    ("measured", _measured, MEASURED),
]
UNREADABLE_READERS = [*MISSING_READERS[:4]]


def _ids(readers: list[tuple[str, Reader, tuple[str, str]]]) -> list[str]:
    return [r[0] for r in readers]


@pytest.mark.parametrize(("reader", "read", "names"), MISSING_READERS, ids=_ids(MISSING_READERS))
def test_a_missing_path_is_one_line(tmp_path, capsys, reader, read, names):
    what, noun = names
    path = tmp_path / "ghost" / "nothing.txt"
    assert read(tmp_path, path, capsys) == (
        f"{what} '{path}' does not exist; give the path of {noun}"
    )


@pytest.mark.parametrize(("reader", "read", "names"), FOLDER_READERS, ids=_ids(FOLDER_READERS))
def test_a_folder_where_a_file_belongs_is_one_line(tmp_path, capsys, reader, read, names):
    what, noun = names
    path = tmp_path / "a folder.py"
    path.mkdir()
    assert read(tmp_path, path, capsys) == (
        f"{what} '{path}' is a folder where a file belongs; give the path of {noun}"
    )


@pytest.mark.parametrize(("reader", "read", "names"), FILE_READERS, ids=_ids(FILE_READERS))
def test_a_file_where_a_folder_belongs_is_one_line(tmp_path, capsys, reader, read, names):
    what, noun = names
    path = tmp_path / "notes.txt"
    path.write_text("a file\n")
    assert read(tmp_path, path, capsys) == (
        f"{what} '{path}' is a file where a folder belongs; give the path of {noun}"
    )


def _unreadable_file(tmp: Path) -> Path:
    path = tmp / "secret.py"
    path.write_text(SCORE)
    path.chmod(0)
    return path


@pytest.mark.parametrize(
    ("reader", "read", "names"), UNREADABLE_READERS, ids=_ids(UNREADABLE_READERS)
)
def test_an_unreadable_file_is_one_line(tmp_path, capsys, monkeypatch, reader, read, names):
    """As root every file is readable: there the operating system's answer is replaced by a
    refusal for this one file (what a user without read permission gets)."""
    what, noun = names
    path = _unreadable_file(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and Path(p) != path)
    assert read(tmp_path, path, capsys) == (
        f"{what} '{path}' cannot be read (permission denied); make it readable (chmod u+r '{path}')"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_a_file_without_read_permission_is_one_line(tmp_path, capsys):
    path = _unreadable_file(tmp_path)
    assert "cannot be read (permission denied)" in _configfile(tmp_path, path, capsys)
    assert "cannot be read (permission denied)" in _plugin(tmp_path, path, capsys)


def test_a_relative_missing_path_names_the_working_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _configfile(tmp_path, Path("ghost.yaml"), capsys) == (
        f"config file 'ghost.yaml' does not exist (relative paths start at the working directory "
        f"'{tmp_path}'); give the path of a YAML config file"
    )
