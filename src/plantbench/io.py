"""Atomic writes and self-describing artifacts.

Every stage writes into its own folder and finishes by writing ``meta.json``: the stage name,
the xxh3 of every file it made, the hash of the config sections it depends on, the hashes of the
artifacts it was made from, and the code version. An artifact's hash is the hash of its files'
hashes, so it is byte-for-byte reproducible and independent of when or where it was made.
Readers call :func:`read_meta`, which checks the files and the lineage.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from plantbench import __version__, floats, lineage
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes, hash_file

META = "meta.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(final: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it into place only on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; results are shared
        os.replace(tmp_path, final)
        fsync_dir(final.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``final`` whole."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
        if final.exists():
            old = final.with_name(f".{final.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_csv(path: str | Path, df: pd.DataFrame) -> None:
    """A table as csv: no index, 6 significant digits, ``\\n`` line ends (byte-stable)."""
    write_text(path, df.to_csv(index=False, float_format="%.6g", lineterminator="\n"))


def dumps_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | Path, obj: Any) -> None:
    write_text(path, dumps_json(obj))


def write_parquet(path: str | Path, df: pd.DataFrame) -> None:
    """Deterministic parquet: no pandas index, no creation timestamps, fixed compression."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata(None)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=False, store_schema=False)


def read_parquet(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"missing file '{path}'; run the step that makes it (snakemake {path})")
    try:
        return pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises many types for a corrupt file
        raise ArtifactError(
            f"cannot read '{path}' ({type(exc).__name__}); delete it and rerun its step"
        ) from None


def artifact_hash(files: Mapping[str, str]) -> str:
    return hash_bytes("".join(f"{k}\0{v}\n" for k, v in sorted(files.items())).encode())


@functools.cache
def package_code_hash() -> str:
    """xxh3 over the package's own source (every ``*.py`` and schema file, by relative name):
    which code made an artifact, beyond ``__version__``."""
    root = Path(__file__).resolve().parent
    parts = [
        f"{p.relative_to(root).as_posix()}\0{hash_file(p)}\n"
        for p in sorted(root.rglob("*"))
        if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    ]
    return hash_bytes("".join(parts).encode())


def write_meta(
    folder: str | Path,
    stage: str,
    files: list[str],
    *,
    config_hash: str,
    inputs: Mapping[str, str] | None = None,
    info: Mapping[str, Any] | None = None,
    code: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Hash ``files`` (relative to ``folder``) and write ``folder/meta.json`` last, atomically.
    ``code`` adds the hashes of code outside the package (a plug-in file) to the package's."""
    folder = Path(folder)
    hashes = {f: hash_file(folder / f) for f in sorted(files)}
    meta = {
        "stage": stage,
        "hash": artifact_hash(hashes),
        "files": hashes,
        "config_hash": config_hash,
        "inputs": dict(sorted((inputs or {}).items())),
        "code_version": __version__,
        "code": {"plantbench": package_code_hash(), **dict(code or {})},
        "info": dict(info or {}),
        "platform": floats.record(),
    }
    if lineage.current() is not None:  # the config values it was made under (a workflow step)
        meta[lineage.KEY] = lineage.current()
    write_json(folder / META, meta)
    return meta


def read_meta(folder: str | Path, stage: str, *, verify: bool = True) -> dict[str, Any]:
    """Read an artifact's meta.json and (by default) check every file against its hash."""
    folder = Path(folder)
    path = folder / META
    if not path.is_file():
        raise ArtifactError(
            f"'{folder}' is not a finished '{stage}' artifact (no {META}); run the '{stage}' step first"
        )
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(
            f"'{path}' is corrupt; delete '{folder}' and rerun the '{stage}' step"
        ) from None
    if meta.get("stage") != stage:
        raise ArtifactError(
            f"'{path}' describes a '{meta.get('stage')}' artifact, expected '{stage}'"
        )
    lineage.check_read(meta, folder)
    if verify:
        for name, expected in meta["files"].items():
            f = folder / name
            if not f.is_file():
                raise ArtifactError(
                    f"'{f}' is missing from the '{stage}' artifact; rerun the '{stage}' step"
                )
            if hash_file(f) != expected:
                raise ArtifactError(
                    f"'{f}' does not match its recorded hash (corrupt or edited); "
                    f"delete '{folder}' and rerun the '{stage}' step"
                )
    return meta


def peek_meta(folder: str | Path) -> dict[str, Any] | None:
    """The meta.json in ``folder`` when there is a readable one (no file checks), else None."""
    try:
        meta = json.loads((Path(folder) / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def check_input(
    meta: Mapping[str, Any], name: str, upstream: Mapping[str, Any], where: str
) -> None:
    """Refuse an artifact that was made from a different upstream than the one on disk."""
    recorded = meta["inputs"].get(name)
    if recorded != upstream["hash"]:
        raise ArtifactError(
            f"'{where}' was made from a different '{name}' ({recorded}) than the one on disk "
            f"({upstream['hash']}); rerun the steps after '{name}' (snakemake --forcerun {name})"
        )
