"""Every file of a finished smoke run is documented in results/README.md, and every stage
folder holds its meta.json.

The documented names come from the README itself: a backticked file name (``name.ext``, with
``<placeholder>``/``{placeholder}``, ``NNNN`` digit runs and ``*`` wildcards) names that file
relative to the folders of the ``### folder/`` heading above it (or to the results folder); a
backticked folder (``name/``) under a ``###`` heading names everything inside it. The stage
folders are the paragraph that starts with "Stage folders"; one followed by "(only with ...)"
is optional (made only when a method off by default is enabled), so a smoke run need not hold it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "results" / "README.md"
STAGE_PARAGRAPH = "Stage folders"
TICKED = re.compile(r"`([^`]+)`")
NAME = re.compile(r"[\w.<>{}*,/-]+")
OPTIONAL = re.compile(r"`([^`]+/)`\s*\(only with ")


def _regex(path: str) -> str:
    """A documented path as a regex: placeholders and ``*`` match within one folder level,
    runs of ``N`` match digits."""
    out = []
    for part in re.split(r"(<[^>]+>|\{[^}]+\}|\*|N{2,})", path):
        if part.startswith(("<", "{")) or part == "*":
            out.append(r"[^/]+")
        elif re.fullmatch(r"N{2,}", part):
            out.append(r"\d+")
        else:
            out.append(re.escape(part))
    return "".join(out)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def heading_folders(heading: str) -> list[str]:
    """``### stream/A, stream/B`` -> ["stream/A", "stream/B"] (a trailing "(...)" dropped)."""
    text = re.sub(r"\(.*\)\s*$", "", heading).strip()
    return [f.strip().strip("/") for f in text.split(", ") if f.strip()]


def _paragraphs(text: str) -> list[list[str]]:
    paras: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip():
            paras[-1].append(line)
        else:
            paras.append([])
    return [p for p in paras if p]


def stage_patterns(text: str) -> list[re.Pattern[str]]:
    para = next(p for p in _paragraphs(text) if p[0].startswith(STAGE_PARAGRAPH))
    names = [t for t in TICKED.findall(" ".join(para)) if t.endswith("/")]
    return [re.compile(_regex(n.rstrip("/"))) for n in names]


def optional_stages(text: str) -> set[str]:
    """The stage patterns the README marks "(only with ...)": made only when a method off by
    default is enabled."""
    para = next(p for p in _paragraphs(text) if p[0].startswith(STAGE_PARAGRAPH))
    return {_regex(n.rstrip("/")) for n in OPTIONAL.findall(" ".join(para))}


def file_patterns(text: str) -> list[re.Pattern[str]]:
    """Every file pattern the README documents (stage folders' meta.json included)."""
    stage_lines = next(p for p in _paragraphs(text) if p[0].startswith(STAGE_PARAGRAPH))
    regexes = [p.pattern + "/meta\\.json" for p in stage_patterns(text)]
    folders, in_stage_heading = [""], False
    for line in text.splitlines():
        if line.startswith("## "):
            folders, in_stage_heading = [""], False
        elif line.startswith("### "):
            folders, in_stage_heading = heading_folders(line[4:]), True
        if line in stage_lines:
            continue
        for token in TICKED.findall(line):
            if not NAME.fullmatch(token) or token.startswith(("{", "<")):
                continue
            if token.endswith("/") and in_stage_heading:  # a folder documented as a whole
                regexes += [_regex(_join(f, token)) + ".+" for f in folders]
            elif re.search(r"\.\w+$", token):
                regexes += [_regex(_join(f, token)) for f in {*folders, ""}]
    return [re.compile(r) for r in dict.fromkeys(regexes)]


def undocumented(files: list[str], patterns: list[re.Pattern[str]]) -> list[str]:
    return [f for f in files if not any(p.fullmatch(f) for p in patterns)]


def _in_stage(folder: str, stages: list[re.Pattern[str]]) -> bool:
    parts = folder.split("/")
    return any(p.fullmatch("/".join(parts[:i])) for p in stages for i in range(1, len(parts) + 1))


def stage_problems(
    files: list[str], stages: list[re.Pattern[str]], optional: set[str] = frozenset()
) -> list[str]:
    """Stage folders without a meta.json, meta.json files outside the stage list, stage
    patterns that match no folder (unless ``optional``), and files outside every stage folder (other than the run's
    own files at the top, logs/, benchmarks/, .plantbench/ and gradient shards)."""
    folders = {str(Path(f).parent) for f in files} - {"."}
    shards = {str(Path(f).parent) for f in files if Path(f).name == "shard.json"}
    problems = []
    for p in stages:
        matched = [d for d in sorted(folders) if p.fullmatch(d)]
        problems += [
            f"stage folder {d}/ has no meta.json" for d in matched if f"{d}/meta.json" not in files
        ]
        if not matched and p.pattern not in optional:
            problems.append(f"no folder of the run matches the stage folder {p.pattern}")
    for f in files:
        d = str(Path(f).parent)
        if Path(f).name == "meta.json" and not any(p.fullmatch(d) for p in stages):
            problems.append(f"{f} is in no documented stage folder")
        loose = d != "." and d.split("/")[0] not in ("logs", "benchmarks", ".plantbench")
        if loose and d not in shards and not _in_stage(d, stages):
            problems.append(f"{f} is outside every stage folder (a stage without a meta.json?)")
    return problems


def run_files(root: Path) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(root):
        out += [(Path(dirpath) / n).relative_to(root).as_posix() for n in names]
    return sorted(out)


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text()


def test_readme_patterns_parse(readme: str) -> None:
    """The parser sees the sections it must: a file in a heading's folders, a placeholder, a
    whole folder and the stage list."""
    pats = file_patterns(readme)
    for f in (
        "facts/facts.parquet",
        "stream/B/tokens.bin",
        "features/A/grads/step_0000040/pool/shard_0003/grads.bin",
        "features/B/curvature/step_0000120/curvature.npz",
        "scores/oracle/A/topk.parquet",
        "report/report.html",
        "logs/curvature_A_step_0000040.log",
        ".plantbench/config/0123abcd.json",
        "causal/meta.json",
    ):
        assert not undocumented([f], pats), f
    for f in ("facts/extra.parquet", "pool/A/pool.csv", "scores/oracle/A/x/own.parquet"):
        assert undocumented([f], pats) == [f]
    assert len(stage_patterns(readme)) >= 13
    assert optional_stages(readme) == {
        _regex("features/<model>/ekfac_tracin/<checkpoint>"),
        _regex("features/<model>/trackstar"),  # only with trackstar
        _regex("models/prefix"),  # only with train.prefix_steps
        _regex("models/random/<draw>"),  # only with random_twins.m
        _regex("random"),
    }


def test_an_optional_stage_may_be_absent_but_not_without_its_meta() -> None:
    stages = [re.compile("facts"), re.compile(r"extra/[^/]+")]
    optional = {r"extra/[^/]+"}
    assert stage_problems(["facts/meta.json"], stages, optional) == []
    assert stage_problems(["facts/meta.json"], stages) == [
        r"no folder of the run matches the stage folder extra/[^/]+"
    ]
    assert stage_problems(["facts/meta.json", "extra/x/scores.npy"], stages, optional) == [
        "stage folder extra/x/ has no meta.json"
    ]
    assert stage_problems(["extra/x/meta.json"], stages, {"facts"}) == []


@pytest.mark.slow
def test_every_file_of_the_smoke_run_is_documented(smoke_run: Path, readme: str) -> None:
    files = run_files(smoke_run)
    assert len(files) > 50
    missing = undocumented(files, file_patterns(readme))
    assert not missing, f"not documented in results/README.md: {missing}"
    # the check is live: an added file, or a stage folder's meta.json gone, is reported
    assert undocumented([*files, "pool/A/extra.bin"], file_patterns(readme)) == ["pool/A/extra.bin"]


@pytest.mark.slow
def test_every_stage_folder_has_its_meta_json(smoke_run: Path, readme: str) -> None:
    files = run_files(smoke_run)
    stages, optional = stage_patterns(readme), optional_stages(readme)
    assert not stage_problems(files, stages, optional)
    curv = next(f for f in files if f.endswith("/curvature.npz"))
    without = [f for f in files if f != str(Path(curv).parent / "meta.json")]
    assert stage_problems(without, stages, optional) == [
        f"stage folder {Path(curv).parent}/ has no meta.json"
    ]
    assert stage_problems([*files, "newstage/table.parquet"], stages, optional) == [
        "newstage/table.parquet is outside every stage folder (a stage without a meta.json?)"
    ]
