"""Torch pickles whose bytes depend on their values only (issue 45): :func:`canonical` rebuilds a
payload so, :func:`torch_bytes` saves it in memory. The resumable state, the fork and the
optimizer moments (:mod:`plantbench.model.train_state`) are written through it, so a resumed
run writes every file with the bytes of a straight run's."""

from __future__ import annotations

import collections
import io as _io
import struct
import sys
from typing import Any

import torch


def canonical(obj: Any) -> Any:
    """``obj`` rebuilt so that its torch pickle depends on its values only. Pickle writes an
    object it meets again as a reference to the first, so the bytes also said which equal parts
    were one Python object: a run resumed from a state holds the loaded loss log and optimizer
    keys beside fresh ones, equal strings that are other objects, and its ``fork.pt`` had other
    bytes than a straight run's (issue 45). Rebuilt: every string interned (one object per
    value), every tuple of plain values one object per value, every dict and list a new one,
    every tensor as it is when it is the whole of its storage (tied weights stay one storage)
    and a contiguous copy otherwise. A straight run's payload already has this form, so its
    bytes are those of earlier versions. The module names of a state dict's ``_metadata`` stay
    one object each, as ``state_dict()`` makes them (interned, the root's name ``model`` would
    be the payload's key ``model``, and a straight run's bytes would change)."""
    return _Canonical().rebuild(obj)


class _Canonical:
    def __init__(self) -> None:
        self.tuples: dict[Any, tuple[Any, ...]] = {}  # a tuple of plain values, by value

    def rebuild(self, obj: Any) -> Any:
        if type(obj) is str:
            return sys.intern(obj)
        if isinstance(obj, torch.Tensor):
            return _whole_tensor(obj)
        if type(obj) in (dict, collections.OrderedDict):
            return self._dict(obj)
        if type(obj) is list:
            return [self.rebuild(v) for v in obj]
        if type(obj) is tuple:
            items = tuple(self.rebuild(v) for v in obj)
            key = _value_key(items)
            return items if key is None else self.tuples.setdefault(key, items)
        return obj

    def _dict(self, obj: dict[Any, Any]) -> dict[Any, Any]:
        out = type(obj)((self.rebuild(k), self.rebuild(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # a module state dict's: name -> version
        if meta is not None:
            names = ((_own_str(k), self.rebuild(v)) for k, v in meta.items())
            out._metadata = type(meta)(names)  # type: ignore[attr-defined]
        return out


def _own_str(s: str) -> str:
    """An equal string that is no other string's object (what ``state_dict()`` makes)."""
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _value_key(obj: Any) -> Any:
    """A key equal for equal plain values of the same types only (``1``, ``1.0`` and ``True``
    differ, so do ``0.0`` and ``-0.0``); None for anything else (an array, a tensor)."""
    if type(obj) is tuple:
        keys = [_value_key(v) for v in obj]
        return None if any(k is None for k in keys) else (tuple, *keys)
    if type(obj) is float:
        return (float, struct.pack("<d", obj))
    if obj is None or type(obj) in (str, int, bool, bytes):
        return (type(obj), obj)
    return None


def _whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` when it is the whole of its storage, contiguous; else a contiguous copy (a view
    would be saved with its whole storage: bytes that are not its values)."""
    t = t.detach() if t.requires_grad else t
    size = t.numel() * t.element_size()
    whole = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == size
    return t if whole else t.clone(memory_format=torch.contiguous_format)


def torch_bytes(payload: Any) -> bytes:
    """``torch.save`` of the :func:`canonical` payload, in memory (the archive's name is then
    fixed): bytes that depend on the values only."""
    buf = _io.BytesIO()
    torch.save(canonical(payload), buf)
    return buf.getvalue()
