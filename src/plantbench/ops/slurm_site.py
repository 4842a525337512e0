"""The site values of the Slurm profile (``profiles/slurm/config.yaml``, its ``SITE SPECIFICS``
block): read as Python literals and checked before Snakemake uses them.

Snakemake evaluates the profile (YTE) while it parses its command line; a value written as a
bare word (``GPU_PARTITION = gpu``) would stop it there with its whole usage text and a
NameError. The profile hands the block to :func:`site_values` as text instead, so a wrong value
is one line that says how to write it, and exit 1."""

from __future__ import annotations

import ast
import sys
from typing import Any

# name -> (what it must be, an example value as it is written)
SITE: dict[str, tuple[str, str]] = {
    "CPU_PARTITION": ("str", '"compute"'),
    "GPU_PARTITION": ("str", '"gpu"'),
    "ACCOUNT": ("str or None", '"plantbench"'),
    "GPU_MODEL": ("str or None", '"a100"'),
    "GPU_CONSTRAINT": ("str or None", '"a100|h100"'),
    "CPUS_PER_GPU": ("int", "8"),
}
_WANTED = {
    "str": "a quoted string",
    "str or None": "a quoted string or None",
    "int": "a whole number >= 1",
}


class SiteError(ValueError):
    """A site value that is not what the profile needs (the message says how to write it)."""


def _fits(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return isinstance(value, str) or (kind == "str or None" and value is None)


def _spelling(kind: str, raw: str, example: str) -> str:
    """How to write a value given as ``raw`` (quoted if it is a string, bare if a number)."""
    text = raw.strip().strip("\"'")
    if kind == "int":
        return text if text.isdigit() and int(text) >= 1 else example
    return f'"{text}"' if text and text != "None" else example


_NOT_LITERAL = object()


def _value(name: str, node: ast.expr, raw: str) -> Any:
    kind, example = SITE[name]
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):  # a bare word or an expression
        value = _NOT_LITERAL
    if not _fits(kind, value):
        raise SiteError(
            f"SITE value {name} = {raw} is not {_WANTED[kind]}; write "
            f"{name} = {_spelling(kind, raw, example)}"
        )
    return value


def _statement(stmt: ast.stmt, block: str) -> tuple[str, ast.expr, str]:
    """``NAME = value``: the name, the value's node and its text as written."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Name) and target.id in SITE:
            return target.id, stmt.value, ast.get_source_segment(block, stmt.value) or ""
    text = (ast.get_source_segment(block, stmt) or "").strip()
    raise SiteError(f"SITE line `{text}` does not set one of {', '.join(SITE)}; write NAME = value")


def _parse(block: str) -> ast.Module:
    try:
        return ast.parse(block)
    except SyntaxError as exc:
        line = " ".join((exc.text or "").split())
        raise SiteError(
            f'SITE line `{line}` is not NAME = value (Python); write e.g. GPU_PARTITION = "gpu"'
        ) from None


def parse_site(block: str) -> dict[str, Any]:
    """The values of the SITE block ``block`` (``NAME = value`` lines, ``#`` comments), each
    checked; a wrong, unknown, repeated or missing one raises :class:`SiteError`."""
    values: dict[str, Any] = {}
    for stmt in _parse(block).body:
        name, node, raw = _statement(stmt, block)
        if name in values:
            raise SiteError(f"SITE value {name} is set twice; keep only one of them")
        values[name] = _value(name, node, raw)
    missing = [n for n in SITE if n not in values]
    if missing:
        kind, example = SITE[missing[0]]
        raise SiteError(f"SITE value {missing[0]} is missing; add {missing[0]} = {example}")
    return values


def site_values(label: str, block: str) -> dict[str, Any]:
    """:func:`parse_site` for the profile ``label`` names; a wrong value is one line on stderr
    (``plantbench: <label>: ...``) and exit 1, before Snakemake prints its usage text."""
    try:
        return parse_site(block)
    except SiteError as exc:
        print(f"plantbench: {label}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
