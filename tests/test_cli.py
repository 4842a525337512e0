"""The CLI's help: plain text, every option explained, --threads exactly where it is used."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

from plantbench import cli

ROOT = Path(__file__).resolve().parents[1]
# reST / Markdown markup that argparse would print raw: ``literal``, `x`, :role:, "::" blocks
MARKUP = re.compile(r"``|`|:[a-z]+:|::")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUB = _subparsers(cli.build_parser())


def _undocumented(p: argparse.ArgumentParser) -> list[str]:
    return [
        "/".join(a.option_strings) or a.dest
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
    ]


def test_every_step_has_a_subcommand() -> None:
    assert set(SUB) == set(cli.COMMANDS)
    assert "export" in SUB


def test_top_level_help_is_plain_and_documented() -> None:
    parser = cli.build_parser()
    text = parser.format_help()
    assert not MARKUP.search(text), MARKUP.search(text)
    assert _undocumented(parser) == []
    for name in cli.COMMANDS:
        assert re.search(rf"^\s+{name}\s+\S", text, re.M), f"{name} has no summary line"


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_subcommand_help_is_plain_text(name: str) -> None:
    text = SUB[name].format_help()
    match = MARKUP.search(text)
    assert match is None, f"plantbench {name} --help prints markup {match.group()!r}"


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_option_has_help(name: str) -> None:
    assert _undocumented(SUB[name]) == [], f"plantbench {name}"


def _reads_threads(name: str) -> bool:
    return "args.threads" in inspect.getsource(cli.COMMANDS[name][0])


def _rule_threads() -> set[str]:
    """The subcommands the Snakemake rules call with --threads."""
    found = set()
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^rule ", smk.read_text(), flags=re.M)[1:]:
            shell = block.split("shell:", 1)[-1].split("\n\n", 1)[0]  # not the comments after
            if "--threads" not in shell:
                continue
            words = re.findall(r"[\w}-]+", shell)
            found.update(w for w in words if w in cli.COMMANDS)
    return found


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_threads_only_where_used(name: str) -> None:
    offered = any("--threads" in a.option_strings for a in SUB[name]._actions)
    assert offered == _reads_threads(name), f"plantbench {name}: --threads offered={offered}"
    assert offered == (name in cli.THREADED)


def test_rules_pass_threads_exactly_to_the_threaded_steps() -> None:
    assert _rule_threads() == set(cli.THREADED)


def test_threads_refused_where_unused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["analysis", "--threads", "2"])
    assert exc.value.code == 2
    assert "--threads" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["score", "--method", "bm25", "--model", "A"])
    assert args.threads is None


def test_a_step_ends_its_log_with_its_peak_memory(tmp_path: Path) -> None:
    """A step's own process (stderr a log, not a terminal) ends with its exact peak memory, which
    ``plantbench plan --measured`` reads back (plantbench.ops.process)."""
    import subprocess
    import sys

    from plantbench.ops import process

    log = tmp_path / "plan.log"
    with open(log, "w") as err:
        cmd = [sys.executable, "-m", "plantbench", "plan", "-c", str(ROOT / "config.yaml")]
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    assert proc.returncode == 0
    assert log.read_text().splitlines()[-1].startswith(process.PEAK_LINE)
    peak = process.logged_peak_mb(log)
    assert peak is not None and peak > 1.0
