"""Background text for the token stream, collected from local sources only.

``collect(cfg)`` turns ``cfg["corpus"]["sources"]`` into a table of documents; ``run`` writes
it as ``corpus.parquet`` plus ``meta.json``. Columns:

``doc_id``  ``"C0000000"``, ``"C0000001"``, ... in collection order
``source``  where the text came from (``stdlib:json/decoder.py#0``, ``data/bg.txt#3``,
            ``data/rows.jsonl:17``, ``data/rows.parquet:4``, ``data/ds:train:9``; a ``#k``
            suffix numbers the pieces of a file or of a row that was split)
``kind``    ``code`` (Python source) or ``prose`` (everything else)
``text``    the normalised document text
``split``   ``train`` (read by the models) or ``heldout`` (used only to pad planted windows)

Source kinds
------------
``stdlib``   the running interpreter's standard library (``sysconfig.get_paths()["stdlib"]``):
             ``.py`` files in sorted path order, skipping test suites, IDLE, demos, bundled
             wheels, ``site-packages``, generated codec tables and ``_sysconfigdata``. Each file
             gives *code* documents (the file cut at top-level ``def``/``class`` boundaries,
             consecutive pieces packed up to ``max_doc_chars``) and *prose* documents (its
             module, class and function docstrings, each under a ``module.qualname(args)``
             heading, packed up to ``max_doc_chars``). ``pydoc_data/topics.py`` is read as
             prose: it holds the language reference's help topics.
``text``     a file, or a folder searched recursively for ``*.txt``. A file is cut into
             paragraphs at every run of two or more newlines; consecutive paragraphs are
             grouped (joined by a blank line) into documents of at most ``max_doc_chars``.
``jsonl``    a file, or a folder of ``*.jsonl``: one JSON object per line, the text under
             ``field`` (default ``text``); one document per line. Blank lines are skipped.
``parquet``  a file, or a folder of ``*.parquet``: column ``field`` (default ``text``), one
             document per row; null rows are skipped.
``datasets`` a folder written by ``datasets.Dataset.save_to_disk`` (or ``DatasetDict``: its
             splits in name order); column ``field`` (default ``text``), one document per row.

Filtering (in this order, per document): binary-looking text is dropped (NUL byte, or more
than 10% control / replacement characters; in a ``text`` file it is an error instead);
newlines are normalised to ``\\n``, trailing whitespace is stripped from every line and blank
lines from both ends; a document longer than ``max_doc_chars`` is cut on line boundaries (a
single over-long line is cut at a space); pieces shorter than ``min_doc_chars`` are dropped;
exact duplicates (xxh3-128 of the normalised text) are dropped, keeping the first.
Collection stops at the first document that would take the total past ``max_bytes`` UTF-8
bytes (``0`` = no limit); sources are read in config order, files in sorted order, so the
result is deterministic. ``max_bytes`` is shared in config order: a later source gets what the
earlier ones left. Every source is accounted for in the meta's ``info.sources`` (documents and
bytes); one that contributes nothing, or less than its optional ``min_share`` of the corpus
bytes, is a warning (stderr, ``info.warnings`` and the report), or an error when the source
says ``required: true``.

Split: a document is ``heldout`` when ``derive_seed(seed, "corpus-split", text_hash)`` falls
below ``heldout_fraction`` of the seed range. The rule looks at the document alone, so adding
or removing other documents never moves a document between splits.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
import sysconfig
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from plantbench import io, userpaths
from plantbench.config import config_hash
from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.hashing import hash_bytes
from plantbench.io import META, write_meta
from plantbench.rng import derive_seed

log = logging.getLogger(__name__)

CORPUS_FILE = "corpus.parquet"
COLUMNS = ["doc_id", "source", "kind", "text", "split"]
KINDS = ("code", "prose")
SPLITS = ("train", "heldout")
DEFAULT_FIELD = "text"
ROW_GROUP_BYTES = 128 * 2**20  # characters of text per parquet row group of corpus.parquet

# More than this share of control / replacement characters marks text as binary.
MAX_CONTROL_RATIO = 0.10
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ufffd]")
_PARAGRAPH_BREAK = re.compile(r"\n{2,}")
_SEED_RANGE = 1 << 63

# Standard-library folders that are test suites, GUI tools, demos, build data or third-party.
_STDLIB_SKIP_DIRS = frozenset(
    {
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "turtledemo",
        "site-packages",
        "dist-packages",
        "__pycache__",
        "_bundled",
        "lib-dynload",
    }
)
_STDLIB_TOPICS = "pydoc_data/topics.py"
_CODEC_MARKER = "Python Character Mapping Codec"  # header of generated charmap tables


# --------------------------------------------------------------------------------------------
# text helpers


def normalize(text: str) -> str:
    """Newlines to ``\\n``, trailing whitespace off every line, blank lines off both ends."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(lines).strip("\n")


def looks_binary(text: str) -> bool:
    """True for text with a NUL byte or more than 10% control / replacement characters."""
    if "\x00" in text:
        return True
    if not text:
        return False
    return len(_CONTROL.findall(text)) > MAX_CONTROL_RATIO * len(text)


def _cut_line(line: str, max_chars: int) -> list[str]:
    """Cut one over-long line into pieces of at most ``max_chars``, at a space when possible."""
    out = []
    while len(line) > max_chars:
        cut = line.rfind(" ", max_chars // 2, max_chars)
        cut = cut if cut > 0 else max_chars
        out.append(line[:cut])
        line = line[cut:].lstrip(" ")
    if line:
        out.append(line)
    return out


def split_long(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` on line boundaries into pieces of at most ``max_chars`` characters."""
    if len(text) <= max_chars:
        return [text]
    pieces: list[str] = []
    cur: list[str] = []
    size = 0
    for line in text.split("\n"):
        for part in _cut_line(line, max_chars) if len(line) > max_chars else [line]:
            add = len(part) + (1 if cur else 0)
            if cur and size + add > max_chars:
                pieces.append("\n".join(cur))
                cur, size, add = [], 0, len(part)
            cur.append(part)
            size += add
    if cur:
        pieces.append("\n".join(cur))
    return [p.strip("\n") for p in pieces if p.strip("\n")]


def pack(units: Iterable[str], max_chars: int, sep: str = "\n\n") -> list[str]:
    """Group consecutive units (each cut to ``max_chars`` first) into texts of ≤ ``max_chars``."""
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for unit in units:
        for part in split_long(unit, max_chars):
            add = len(part) + (len(sep) if cur else 0)
            if cur and size + add > max_chars:
                out.append(sep.join(cur))
                cur, size, add = [], 0, len(part)
            cur.append(part)
            size += add
    if cur:
        out.append(sep.join(cur))
    return out


# --------------------------------------------------------------------------------------------
# raw documents from each kind of source

# A raw document: (source label, kind, text). Texts are filtered and cut afterwards.
Raw = tuple[str, str, str]


def _err(index: int, src: dict[str, Any], msg: str) -> PlantbenchError:
    where = f"corpus.sources.{index} ({src['kind']}"
    where += f" '{src['path']}')" if src.get("path") else ")"
    return PlantbenchError(f"{where}: {msg}")


# what the path of each kind of source must be (userpaths.check): a file or a folder of them,
# or the folder that datasets' save_to_disk writes
SOURCE_PATHS: dict[str, tuple[userpaths.Kind, str]] = {
    "text": (userpaths.ANY, "a .txt file or a folder of them"),
    "jsonl": (userpaths.ANY, "a .jsonl file or a folder of them"),
    "parquet": (userpaths.ANY, "a .parquet file or a folder of them"),
    "datasets": (userpaths.FOLDER, "a folder written by datasets' save_to_disk"),
}


def _source_path(index: int, src: dict[str, Any]) -> Path:
    """The source's path, checked as every path a user gives is (one line per cause)."""
    kind, noun = SOURCE_PATHS.get(src["kind"], (userpaths.ANY, "a local file or folder"))
    key = userpaths.config_key(f"corpus.sources.{index}.path")
    return userpaths.check(src["path"], kind, key, noun)


def _files(index: int, src: dict[str, Any], suffix: str) -> list[tuple[Path, str]]:
    """The files of a file-or-folder source, sorted, with their labels (config path based)."""
    path = _source_path(index, src)
    if path.is_file():
        return [(path, src["path"])]
    found = sorted(p for p in path.rglob(f"*{suffix}") if p.is_file())
    if not found:
        raise _err(
            index,
            src,
            f"folder has no *{suffix} files; put {suffix} files in it or fix the path",
        )
    return [(p, (Path(src["path"]) / p.relative_to(path)).as_posix()) for p in found]


def _read_text_file(index: int, src: dict[str, Any], path: Path, label: str) -> str | None:
    """UTF-8 text of a file that must be text; None if it is empty. Errors name the file."""
    data = path.read_bytes()
    if not data.strip():
        return None
    if b"\x00" in data:
        raise _err(
            index, src, f"file '{label}' is binary (NUL bytes); remove it or convert it to text"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _err(
            index,
            src,
            f"file '{label}' is not UTF-8 (bad byte at offset {exc.start}); re-encode it as UTF-8",
        ) from None
    if looks_binary(text):
        raise _err(
            index,
            src,
            f"file '{label}' looks binary (control characters); remove it from the source",
        )
    return text.lstrip("\ufeff")


def _text_source(index: int, src: dict[str, Any], max_chars: int) -> Iterator[Raw]:
    files = _files(index, src, ".txt")
    nonempty = 0
    for path, label in files:
        text = _read_text_file(index, src, path, label)
        if text is None:
            if len(files) == 1:
                raise _err(index, src, f"file '{label}' is empty; give a file with text in it")
            continue
        nonempty += 1
        paragraphs = [p for p in _PARAGRAPH_BREAK.split(normalize(text)) if p.strip()]
        for k, doc in enumerate(pack(paragraphs, max_chars)):
            yield f"{label}#{k}", "prose", doc
    if not nonempty:
        raise _err(index, src, "every .txt file is empty; add text or fix the path")


def _jsonl_lines(
    index: int, src: dict[str, Any], path: Path, label: str
) -> Iterator[tuple[int, str]]:
    """Non-blank lines of a JSON-lines file, read a line at a time (a file may be larger than
    memory), with the checks of :func:`_read_text_file` applied per line."""
    offset = 0
    nonblank = False
    with open(path, "rb") as fh:
        for lineno, data in enumerate(fh, start=1):
            if lineno == 1 and data.startswith(b"\xef\xbb\xbf"):
                data, offset = data[3:], 3
            if b"\x00" in data:
                raise _err(
                    index,
                    src,
                    f"file '{label}' is binary (NUL bytes); remove it or convert it to text",
                )
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _err(
                    index,
                    src,
                    f"file '{label}' is not UTF-8 (bad byte at offset {offset + exc.start}); "
                    "re-encode it as UTF-8",
                ) from None
            offset += len(data)
            if not line.strip():
                continue
            if looks_binary(line):
                raise _err(
                    index,
                    src,
                    f"file '{label}' looks binary (control characters); remove it from the source",
                )
            nonblank = True
            yield lineno, line
    if not nonblank:
        raise _err(index, src, f"file '{label}' is empty; give one JSON object per line")


def _jsonl_source(index: int, src: dict[str, Any]) -> Iterator[Raw]:
    key = src.get("field", DEFAULT_FIELD)
    for path, label in _files(index, src, ".jsonl"):
        for lineno, line in _jsonl_lines(index, src, path, label):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _err(
                    index,
                    src,
                    f"'{label}' line {lineno} is not valid JSON ({exc.msg}); "
                    "fix or remove that line",
                ) from None
            if not isinstance(obj, dict) or not isinstance(obj.get(key), str):
                what = "has no string field" if isinstance(obj, dict) else "is not an object with"
                raise _err(
                    index,
                    src,
                    f"'{label}' line {lineno} {what} '{key}'; "
                    "set 'field' to the key that holds the text",
                )
            yield f"{label}:{lineno}", "prose", obj[key]


def _parquet_source(index: int, src: dict[str, Any]) -> Iterator[Raw]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = src.get("field", DEFAULT_FIELD)
    for path, label in _files(index, src, ".parquet"):
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # pyarrow raises several types for a bad file
            raise _err(
                index,
                src,
                f"cannot read '{label}' as parquet ({type(exc).__name__}); check the file",
            ) from None
        names = pf.schema_arrow.names
        if key not in names:
            raise _err(
                index,
                src,
                f"'{label}' has no column '{key}' (columns: {', '.join(names)}); "
                "set 'field' to the text column",
            )
        col_type = pf.schema_arrow.field(key).type
        if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
            raise _err(
                index,
                src,
                f"'{label}' column '{key}' holds {col_type}, not text; "
                "set 'field' to the text column",
            )
        if pf.metadata.num_rows == 0:
            raise _err(index, src, f"'{label}' has no rows; give a file with text rows")
        row = 0
        for batch in pf.iter_batches(columns=[key], batch_size=4096):
            for value in batch.column(0).to_pylist():
                if value is not None:
                    yield f"{label}:{row}", "prose", value
                row += 1


def _datasets_source(index: int, src: dict[str, Any]) -> Iterator[Raw]:
    key = src.get("field", DEFAULT_FIELD)
    path = _source_path(index, src)
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # datasets raises many types for a folder it cannot read
        raise _err(
            index,
            src,
            f"folder does not load with datasets.load_from_disk ({type(exc).__name__}); "
            "give a folder written by Dataset.save_to_disk",
        ) from None
    parts = (
        [(name, loaded[name]) for name in sorted(loaded)]
        if isinstance(loaded, datasets.DatasetDict)
        else [(None, loaded)]
    )
    if sum(len(ds) for _, ds in parts) == 0:
        raise _err(index, src, "dataset has no rows; give a dataset with text rows")
    for name, ds in parts:
        if key not in ds.column_names:
            raise _err(
                index,
                src,
                f"dataset has no column '{key}' (columns: {', '.join(ds.column_names)}); "
                "set 'field' to the text column",
            )
        prefix = f"{src['path']}:{name}" if name is not None else src["path"]
        row = 0
        for batch in ds.select_columns([key]).iter(batch_size=1024):
            for value in batch[key]:
                if isinstance(value, str):
                    yield f"{prefix}:{row}", "prose", value
                row += 1


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[Path]:
    """The standard library's ``.py`` files that become documents, in sorted path order."""
    out = []
    for p in sorted(root.rglob("*.py"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root)
        dirs = rel.parts[:-1]
        if any(d in _STDLIB_SKIP_DIRS or d.startswith("config-") for d in dirs):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue
        out.append(p)
    return out


def _def_start(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _code_units(text: str, tree: ast.Module | None) -> list[str]:
    """Cut a module at its top-level def/class statements (leading comments go with them)."""
    lines = text.split("\n")
    if tree is None:
        return ["\n".join(lines)]
    starts = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            start = _def_start(node) - 1  # 0-based
            while start > 0 and lines[start - 1].lstrip().startswith("#"):
                start -= 1
            starts.append(start)
    bounds = sorted({0, *starts, len(lines)})
    return ["\n".join(lines[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    try:
        return ast.unparse(node.args)
    except Exception:  # pragma: no cover - unparse handles every valid tree
        return "..."


def _docstring_units(tree: ast.Module, module: str) -> list[str]:
    """Module, class and function docstrings, each under a ``module.qualname(args)`` heading."""
    units = []
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        units.append(f"Module {module}\n\n{doc.strip()}")

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                doc = ast.get_docstring(child, clean=True)
                if doc:
                    units.append(f"class {module}.{name}\n\n{doc.strip()}")
                visit(child, name + ".")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + child.name
                doc = ast.get_docstring(child, clean=True)
                if doc:
                    units.append(f"{module}.{name}({_signature(child)})\n\n{doc.strip()}")
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return units


def _topics_units(tree: ast.Module) -> list[str]:
    """The help topics of ``pydoc_data/topics.py`` (a dict literal of reference text)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            try:
                topics = ast.literal_eval(node.value)
            except ValueError:
                return []
            return [str(topics[k]) for k in sorted(topics) if isinstance(topics[k], str)]
    return []


@dataclass
class _Skipped:
    files: int = 0
    names: list[str] = field(default_factory=list)


def _stdlib_source(
    index: int, src: dict[str, Any], max_chars: int, skipped: _Skipped
) -> Iterator[Raw]:
    root = stdlib_root()
    if not root.is_dir():
        raise _err(
            index,
            src,
            f"the standard library folder '{root}' is missing; use a full Python install",
        )
    files = stdlib_files(root)
    if not files:
        raise _err(index, src, f"no .py files under '{root}'; use a full Python install")
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.files += 1
            skipped.names.append(rel)
            continue
        if looks_binary(text) or _CODEC_MARKER in text[:2000]:
            skipped.files += 1
            skipped.names.append(rel)
            continue
        text = normalize(text.lstrip("\ufeff"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                tree: ast.Module | None = ast.parse(text)
            except (SyntaxError, ValueError):
                tree = None
        label = f"stdlib:{rel}"
        if rel == _STDLIB_TOPICS and tree is not None:
            for k, doc in enumerate(pack(_topics_units(tree), max_chars)):
                yield f"{label}#{k}", "prose", doc
            continue
        for k, doc in enumerate(pack(_code_units(text, tree), max_chars, sep="\n")):
            yield f"{label}#{k}", "code", doc
        if tree is not None:
            module = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            for k, doc in enumerate(pack(_docstring_units(tree, module), max_chars)):
                yield f"{label}#doc{k}", "prose", doc


# --------------------------------------------------------------------------------------------
# collection


@dataclass
class _SourceStats:
    index: int
    kind: str
    path: str | None
    docs: int = 0
    bytes: int = 0
    dropped_short: int = 0
    dropped_binary: int = 0
    dropped_duplicate: int = 0
    reached: bool = False
    complete: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "path": self.path,
            "docs": self.docs,
            "bytes": self.bytes,
            "dropped_short": self.dropped_short,
            "dropped_binary": self.dropped_binary,
            "dropped_duplicate": self.dropped_duplicate,
            "complete": self.complete,
            "reached": self.reached,
        }


def _raw_docs(index: int, src: dict[str, Any], max_chars: int, skipped: _Skipped) -> Iterator[Raw]:
    kind = src["kind"]
    if kind != "stdlib" and not src.get("path"):
        raise _err(index, src, "needs a 'path' to a local file or folder; add it to the config")
    if kind == "stdlib":
        return _stdlib_source(index, src, max_chars, skipped)
    if kind == "text":
        return _text_source(index, src, max_chars)
    if kind == "jsonl":
        return _jsonl_source(index, src)
    if kind == "parquet":
        return _parquet_source(index, src)
    if kind == "datasets":
        return _datasets_source(index, src)
    raise _err(index, src, "unknown source kind; use stdlib, text, jsonl, parquet or datasets")


def _check_paths(sources: list[dict[str, Any]]) -> None:
    """Fail on a missing or unreadable path before reading anything (later sources may never
    be reached)."""
    for i, src in enumerate(sources):
        if src["kind"] == "stdlib":
            continue
        if not src.get("path"):
            raise _err(i, src, "needs a 'path' to a local file or folder; add it to the config")
        _source_path(i, src)


def seeded_draw(seed: int, tag: str, key: str, fraction: float) -> bool:
    """True for a seeded ``fraction`` of keys: ``derive_seed(seed, tag, key)`` falls below that
    fraction of the seed range (a function of the key alone, not of any other key)."""
    return derive_seed(seed, tag, key) < fraction * _SEED_RANGE


def split_of(seed: int, text_hash: str, heldout_fraction: float) -> str:
    """``heldout`` or ``train``: a function of the document's own hash and the seed only."""
    return "heldout" if seeded_draw(seed, "corpus-split", text_hash, heldout_fraction) else "train"


class _Collection:
    """Running totals of one collection pass: per-source stats, per split/kind counts and
    bytes, the duplicate filter (one xxh3 per kept document; the texts themselves are not
    kept) and whether ``max_bytes`` stopped it."""

    def __init__(self, sources: list[dict[str, Any]]):
        self.sources = sources
        self.stats = [_SourceStats(i, s["kind"], s.get("path")) for i, s in enumerate(sources)]
        self.skipped = _Skipped()
        self.seen: set[str] = set()
        self.total = 0
        self.full = False
        self.counts = {name: 0 for name in (*SPLITS, *KINDS)}
        self.nbytes = {name: 0 for name in (*SPLITS, *KINDS)}

    def add(self, kind: str, split: str, n_bytes: int) -> None:
        self.total += n_bytes
        for name in (kind, split):
            self.counts[name] += 1
            self.nbytes[name] += n_bytes

    @property
    def n_docs(self) -> int:
        return sum(self.counts[k] for k in KINDS)

    def check(self, frac: float) -> None:
        """The corpus must have documents in both splits."""
        if not self.n_docs:
            raise PlantbenchError(
                "corpus: no documents were collected; check corpus.sources and corpus.max_bytes"
            )
        for split in SPLITS:
            if not self.counts[split]:
                raise PlantbenchError(
                    f"corpus: the '{split}' split is empty ({self.n_docs} documents, "
                    f"heldout_fraction={frac}); add more text to corpus.sources or change "
                    "corpus.heldout_fraction"
                )

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"n_docs": self.n_docs, "bytes": self.total}
        for name in (*SPLITS, *KINDS):
            info[f"n_{name}"] = self.counts[name]
            info[f"{name}_bytes"] = self.nbytes[name]
        info["max_bytes_reached"] = self.full
        info["sources"] = [s.as_dict() for s in self.stats]  # every source, reached or not
        if any(s["kind"] == "stdlib" for s in self.sources):
            info["python_version"] = ".".join(str(v) for v in sys.version_info[:3])
            info["stdlib_files_skipped"] = self.skipped.files
        return info


def _shortfall(st: _SourceStats, src: dict[str, Any], total: int, max_bytes: int) -> str | None:
    """Why source ``st`` contributed nothing or less than its ``min_share`` of the corpus bytes
    (None when it contributed what it should)."""
    share, wanted = (st.bytes / total if total else 0.0), float(src.get("min_share", 0.0))
    if st.docs and share >= wanted:
        return None
    where = f"corpus.sources.{st.index} ({st.kind}{f' {st.path!r}' if st.path else ''})"
    got = "no documents" if not st.docs else f"{100 * share:.1f}% of the corpus bytes"
    need = f", less than its min_share = {wanted}" if st.docs else ""
    why = (
        f": corpus.max_bytes = {max_bytes} was reached before it (sources share max_bytes in "
        "config order)"
        if max_bytes and not st.complete
        else ""
    )
    return (
        f"{where} contributes {got}{need}{why}; raise corpus.max_bytes, list the source earlier "
        "or remove it"
    )


def source_warnings(cfg: dict[str, Any], col: _Collection) -> list[str]:
    """One line per source that contributed nothing or less than its ``min_share``; raises
    for one marked ``required: true`` (see the module doc)."""
    c = cfg["corpus"]
    lines = []
    for st, src in zip(col.stats, col.sources, strict=True):
        line = _shortfall(st, src, col.total, int(c["max_bytes"]))
        if line is not None and src.get("required", False):
            raise PlantbenchError(
                f"corpus: {line} (it is required: corpus.sources.{st.index}.required is true)"
            )
        if line is not None:
            lines.append(line)
    return lines


# A corpus row without its doc_id: (source, kind, text, split).
Row = tuple[str, str, str, str]


def _documents(cfg: dict[str, Any], col: _Collection) -> Iterator[Row]:
    """Every kept document in collection order (see the module doc), one at a time."""
    c = cfg["corpus"]
    seed = int(cfg["seed"])
    min_chars, max_chars = int(c["min_doc_chars"]), int(c["max_doc_chars"])
    max_bytes = int(c["max_bytes"])
    frac = float(c["heldout_fraction"])
    for i, src in enumerate(col.sources):
        st = col.stats[i]
        st.reached = True
        for label, kind, raw in _raw_docs(i, src, max_chars, col.skipped):
            if looks_binary(raw):
                st.dropped_binary += 1
                continue
            text = normalize(raw.lstrip("\ufeff"))
            pieces = split_long(text, max_chars) if len(text) > max_chars else [text]
            for k, piece in enumerate(pieces):
                if len(piece) < min_chars:
                    st.dropped_short += 1
                    continue
                data = piece.encode("utf-8")
                h = hash_bytes(data)
                if h in col.seen:
                    st.dropped_duplicate += 1
                    continue
                if max_bytes and col.total + len(data) > max_bytes:
                    col.full = True
                    return
                col.seen.add(h)
                split = split_of(seed, h, frac)
                col.add(kind, split, len(data))
                st.docs += 1
                st.bytes += len(data)
                yield (f"{label}#{k}" if len(pieces) > 1 else label), kind, piece, split
        st.complete = True
        if st.docs == 0:
            raise _err(
                i,
                src,
                f"no documents survive filtering ({st.dropped_short} shorter than "
                f"min_doc_chars={min_chars}, {st.dropped_binary} binary, "
                f"{st.dropped_duplicate} duplicates); add text or lower corpus.min_doc_chars",
            )
        log.info("corpus source %d (%s): %d docs, %.2f MB", i, src["kind"], st.docs, st.bytes / 1e6)


def _doc_id(i: int) -> str:
    return f"C{i:07d}"


def _log_done(col: _Collection, t0: float) -> None:
    log.info(
        "corpus: %d docs, %.2f MB in %.1f s%s",
        col.n_docs,
        col.total / 1e6,
        time.perf_counter() - t0,
        " (stopped at corpus.max_bytes)" if col.full else "",
    )


def collect(cfg: dict[str, Any]) -> pd.DataFrame:
    """Read every source in ``cfg["corpus"]`` and return the document table (see module doc).
    Holds the whole corpus in memory: for tests and small corpora; ``run`` streams."""
    sources = list(cfg["corpus"]["sources"])
    _check_paths(sources)
    t0 = time.perf_counter()
    col = _Collection(sources)
    rows = list(_documents(cfg, col))
    col.check(float(cfg["corpus"]["heldout_fraction"]))
    _log_done(col, t0)
    df = pd.DataFrame(rows, columns=["source", "kind", "text", "split"])
    df.insert(0, "doc_id", [_doc_id(i) for i in range(len(df))])
    return df[COLUMNS].astype(str)


class _RowGroups:
    """Corpus rows into a parquet file, a row group per ``ROW_GROUP_BYTES`` characters of text,
    doc ids numbered in order. The bytes equal ``io.write_parquet`` of the same table when it
    fits one row group."""

    def __init__(self, path: Path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._pa = pa
        self.schema = pa.schema([(name, pa.string()) for name in COLUMNS])
        self.writer = pq.ParquetWriter(
            path, self.schema, compression="zstd", write_statistics=False, store_schema=False
        )
        self.buf: list[Row] = []
        self.size = 0
        self.written = 0

    def add(self, row: Row) -> None:
        self.buf.append(row)
        self.size += len(row[2])
        if self.size >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.buf:
            return
        pa = self._pa
        ids = [_doc_id(i) for i in range(self.written, self.written + len(self.buf))]
        arrays = [pa.array(ids, pa.string())]
        arrays += [pa.array(c, pa.string()) for c in zip(*self.buf, strict=True)]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        self.writer.write_table(table, row_group_size=len(self.buf))
        self.written += len(self.buf)
        self.buf, self.size = [], 0
        log.info("corpus: %d docs written", self.written)

    def __enter__(self) -> _RowGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


def run(cfg: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Collect the corpus into ``out_dir/corpus.parquet`` + ``meta.json``; return the meta.

    Documents are written as they are read, in parquet row groups of about
    ``ROW_GROUP_BYTES`` of text, so memory does not grow with the corpus (only the duplicate
    filter's hashes do: ~100 bytes a document). A failure leaves no new file behind."""
    out_dir = Path(out_dir)
    sources = list(cfg["corpus"]["sources"])
    _check_paths(sources)  # raises before anything is touched
    t0 = time.perf_counter()
    col = _Collection(sources)
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with io.atomic_path(out_dir / CORPUS_FILE) as tmp, _RowGroups(tmp) as writer:
            for row in _documents(cfg, col):
                writer.add(row)
            col.check(float(cfg["corpus"]["heldout_fraction"]))
            warned = source_warnings(cfg, col)
            writer.flush()
            (out_dir / META).unlink(missing_ok=True)  # a stale meta must never describe new files
    except BaseException:
        if created and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed first run leaves nothing behind
        raise
    _log_done(col, t0)
    info = col.info()
    for line in warned:
        print(f"plantbench: warning: {line}", file=sys.stderr, flush=True)
    if warned:
        info["warnings"] = warned
    return write_meta(
        out_dir,
        "corpus",
        [CORPUS_FILE],
        config_hash=config_hash(cfg, ["seed", "corpus"]),
        info=info,
    )


def iter_texts(
    corpus_dir: str | Path,
    split: str,
    batch_rows: int = 2048,
    *,
    sample: tuple[int, float] | None = None,
) -> Iterator[list[str]]:
    """The texts of one split of a corpus artifact, in corpus order, a batch at a time (the
    file is read row group by row group; memory stays at one batch). ``sample = (seed,
    fraction)`` keeps a document when ``seeded_draw(seed, "sample", doc_id, fraction)``: a seeded
    sample that does not depend on the other documents."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    path = Path(corpus_dir) / CORPUS_FILE
    if not path.is_file():
        raise ArtifactError(f"missing file '{path}'; run the 'corpus' step")
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(columns=["doc_id", "text", "split"], batch_size=batch_rows):
        keep = pc.equal(batch.column(2), split)
        if sample is not None:
            seed, fraction = sample
            ids = batch.column(0).to_pylist()
            keep = pc.and_(keep, pa.array([seeded_draw(seed, "sample", d, fraction) for d in ids]))
        texts = batch.column(1).filter(keep).to_pylist()
        if texts:
            yield texts


# --------------------------------------------------------------------------------------------
# a local jsonl corpus (the rehearsal's background text)


def write_jsonl(folder: str | Path, max_bytes: int, docs_per_file: int = 400) -> int:
    """The standard library's documents, in order, as a folder of ``part-NNNN.jsonl`` files
    (one ``{"text": ...}`` object per line) up to ``max_bytes`` of text: a ``jsonl`` source
    for a machine without any other text. Returns the number of documents written."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    docs: list[str] = []
    total = 0
    for _, _, text in _stdlib_source(0, {"kind": "stdlib"}, 20000, _Skipped()):
        if len(text) < 200:
            continue
        docs.append(json.dumps({"text": text}, ensure_ascii=False))
        total += len(text.encode("utf-8"))
        if total >= max_bytes:
            break
    for k in range(0, len(docs), docs_per_file):
        part = "\n".join(docs[k : k + docs_per_file]) + "\n"
        io.write_text(out / f"part-{k // docs_per_file:04d}.jsonl", part)
    return len(docs)
