"""The one check of a path a user gives (a config file, a plug-in, a corpus source, the encoder
folder, a ``--bundle`` folder, ...): one message per cause, naming the config key or option and
the path. Every reader calls :func:`check` (or :func:`problem` where a missing path is allowed)
before it reads, so a folder where a file belongs says so in every reader."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Literal

from plantbench.errors import ConfigError

Kind = Literal["file", "folder", "file or folder"]
FILE: Kind = "file"
FOLDER: Kind = "folder"
ANY: Kind = "file or folder"

# the causes, one message each
MISSING = "does not exist"
IS_FOLDER = "is a folder where a file belongs"
IS_FILE = "is a file where a folder belongs"
UNREADABLE = "cannot be read (permission denied)"


def _readable(path: Path, folder: bool) -> bool:
    """Whether this user may read ``path`` (and list it, for a folder)."""
    return os.access(path, os.R_OK | (os.X_OK if folder else 0))


def _located(path: str | Path, base: Path | None) -> Path:
    """``path`` with ``~`` expanded, a relative one under ``base`` (default: where it is read)."""
    p = Path(path).expanduser()
    return base / p if base is not None and not p.is_absolute() else p


def problem(path: str | Path, kind: Kind, *, base: Path | None = None) -> str | None:
    """Why ``path`` (relative: to ``base``, default the working directory) cannot be read as a
    ``kind`` (one of the causes above), or None."""
    p = _located(path, base)
    try:
        mode = p.stat().st_mode
    except PermissionError:  # a folder on the way cannot be entered
        return UNREADABLE
    except (FileNotFoundError, NotADirectoryError):
        return MISSING
    folder = stat.S_ISDIR(mode)
    if folder and kind == FILE:
        return IS_FOLDER
    if not folder and kind == FOLDER:
        return IS_FILE
    return None if _readable(p, folder) else UNREADABLE


def _where(path: Path, base: Path | None) -> str:
    if path.expanduser().is_absolute():
        return ""
    return f" (relative paths start at the working directory '{base or Path.cwd()}')"


def _fix(cause: str, path: Path, noun: str, missing: str | None) -> str:
    if cause == MISSING and missing:
        return missing
    if cause == UNREADABLE:
        return f"make it readable (chmod u+r{'x' if path.is_dir() else ''} '{path}')"
    return f"give the path of {noun}"


def message(
    path: str | Path,
    cause: str,
    what: str,
    noun: str,
    *,
    missing: str | None = None,
    base: Path | None = None,
) -> str:
    """One line: ``what`` (the config key or option, e.g. ``config key 'features.encoder' =``
    or ``--bundle``), the path as given, the cause (where a relative path was looked for), and
    the fix: give the path of ``noun`` (e.g. ``a YAML config file``), make it readable, or
    ``missing`` where the path does not exist."""
    where = _where(Path(path), base) if cause == MISSING else ""
    return f"{what} '{path}' {cause}{where}; {_fix(cause, _located(path, base), noun, missing)}"


def check(
    path: str | Path,
    kind: Kind,
    what: str,
    noun: str,
    *,
    missing: str | None = None,
    base: Path | None = None,
) -> Path:
    """``path`` (``~`` expanded; relative: under ``base``) if it can be read as a ``kind``;
    otherwise a ConfigError of one line (:func:`message`)."""
    cause = problem(path, kind, base=base)
    if cause is not None:
        raise ConfigError(message(path, cause, what, noun, missing=missing, base=base))
    return _located(path, base)


def config_key(key: str) -> str:
    """How a config key is named in a message: ``config key 'corpus.sources.0.path' =``."""
    return f"config key '{key}' ="
