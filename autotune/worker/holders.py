"""Who holds the memory a released trial left behind: the chains of Python references from a
module-level object down to the largest tensors still alive.

A warm pool rank that still holds memory after releasing a trial cannot serve on (the next
trial's peak would count it) and the orchestrator starts the pool cold: every later trial then
pays the start-up again. Seen on 4 x H200 (session 19): after every llama3-8b trial with the
distributed optimizer's overlapped param gather at dp 4, each rank kept 67 GiB (the whole model,
gradients and optimizer state), so each of a search's trials started cold, 23-40 s instead of 5
(autotune.worker.serve.clear_method_caches says why, and mends it). The pool's log shows the
chains this module finds, so a leak names its holder instead of being guessed at.

The search walks a reverse reference map built once from gc (gc.get_referrers per node would
scan the whole heap each time), breadth first, so the chain shown is a shortest one.
"""

from __future__ import annotations

import gc
import sys
import types
from collections import deque
from dataclasses import dataclass
from typing import Any

__all__ = ["Holder", "describe_holders", "find_holders"]

_MAX_DEPTH = 14
"""Hops from a tensor to its root before the walk gives up (a model's parameter sits about six
below the DDP wrapper, which sits a few below whatever keeps it)."""

_MAX_NODES = 200_000
"""Objects visited per tensor: bounds the walk's time on a heap of millions of objects."""


@dataclass(frozen=True)
class Holder:
    """A storage still alive: its size, the tensors viewing it, and a chain root -> tensor."""

    nbytes: int
    tensors: int
    chain: tuple[str, ...]
    """From the root (a module, a class, or the first object nothing in Python refers to) down to
    the tensor; empty when not even the tensor has a Python referrer."""


def find_holders(device_type: str = "cuda", top: int = 4, min_bytes: int = 1) -> list[Holder]:
    """The `top` largest storages on `device_type` that Python objects still reach, largest first,
    each with one shortest chain of references that keeps it alive."""
    import torch

    gc.collect()
    heap = gc.get_objects()
    storages: dict[int, tuple[int, list[Any]]] = {}
    for obj in heap:
        if issubclass(type(obj), torch.Tensor) and obj.device.type == device_type:
            if isinstance(obj, _fake_tensor_types()):
                continue  # torch.compile's caches: no memory behind it
            try:
                storage = obj.untyped_storage()
                key = storage.data_ptr()
            except RuntimeError:  # a tensor without storage (a wrapper subclass)
                continue
            _, views = storages.setdefault(key, (storage.nbytes(), []))
            views.append(obj)
    largest = sorted(storages.values(), key=lambda item: -item[0])
    largest = [item for item in largest if item[0] >= min_bytes][:top]
    if not largest:
        return []
    referrers = _reverse_map(heap)
    ignore = {id(heap), id(storages), id(largest), id(referrers)}
    ignore.update(id(views) for _, views in storages.values())
    ignore.update(id(f) for f in _stack())
    by_id = {id(obj): obj for obj in heap}
    return [Holder(nbytes=size, tensors=len(views),
                   chain=_first_chain(views, referrers, by_id, ignore))
            for size, views in largest]


def _fake_tensor_types() -> tuple[type, ...]:
    """torch.compile's FakeTensor class, where this torch has one: reading its data pointer
    warns (session 20's pool logs) and will raise in later releases."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:
        return ()
    return (FakeTensor,)


def describe_holders(holders: list[Holder]) -> list[str]:
    """One line per holder, for the pool's log."""
    lines = []
    for h in holders:
        chain = " -> ".join(h.chain) if h.chain else "no Python object (held inside C++)"
        lines.append(f"{h.nbytes / 2**30:.2f} GiB in {h.tensors} tensor(s), held by: {chain}")
    return lines


def _reverse_map(heap: list[Any]) -> dict[int, list[int]]:
    """id(object) -> ids of the gc-tracked objects that refer to it."""
    out: dict[int, list[int]] = {}
    for obj in heap:
        for ref in gc.get_referents(obj):
            out.setdefault(id(ref), []).append(id(obj))
    return out


def _stack() -> list[types.FrameType]:
    """This call's own frames: they refer to everything the walk touches."""
    frames = []
    frame: types.FrameType | None = sys._getframe()
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


def _is_root(obj: Any) -> bool:
    return isinstance(obj, (types.ModuleType, type))


def _first_chain(views: list[Any], referrers: dict[int, list[int]], by_id: dict[int, Any],
                 ignore: set[int]) -> tuple[str, ...]:
    """The chain of the first view of a storage that Python holds: a view's base tensor is
    held through the view's C++ side, which gc does not see."""
    for tensor in views:
        if chain := _chain(tensor, referrers, by_id, ignore):
            return chain
    return ()


def _chain(tensor: Any, referrers: dict[int, list[int]], by_id: dict[int, Any],
           ignore: set[int]) -> tuple[str, ...]:
    """A shortest chain root -> ... -> tensor, each hop named by how it refers to the next."""
    start = id(tensor)
    parent: dict[int, int | None] = {start: None}
    queue: deque[tuple[int, int]] = deque([(start, 0)])
    end = start
    while queue and len(parent) < _MAX_NODES:
        node, depth = queue.popleft()
        end = node
        obj = by_id.get(node)
        if obj is not None and _is_root(obj):
            break
        ups = [r for r in referrers.get(node, ()) if r not in ignore and r in by_id]
        if not ups or depth >= _MAX_DEPTH:
            if node != start:
                break  # nothing in Python holds this one: the root is C++ or untracked
            return ()
        for up in ups:
            if up not in parent:
                parent[up] = node
                queue.append((up, depth + 1))
    path: list[Any] = []
    cursor: int | None = end
    while cursor is not None:
        obj = by_id.get(cursor, tensor)
        if path and isinstance(path[-1], types.ModuleType) and obj is vars(path[-1]):
            cursor = parent[cursor]  # a module's globals: named with the module (module m.X)
            continue
        path.append(obj)
        cursor = parent[cursor]
    return tuple(_hop(obj, path[i + 1] if i + 1 < len(path) else None)
                 for i, obj in enumerate(path))


def _hop(obj: Any, child: Any) -> str:
    """How `obj` is named, and how it holds `child`."""
    if isinstance(obj, types.ModuleType):
        owner = next((k for k, v in vars(obj).items() if v is child), None)
        return f"module {obj.__name__}" + (f".{owner}" if owner else "")
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, dict):
        key = next((k for k, v in obj.items() if v is child), None)
        return f"dict[{key!r}]" if key is not None else "dict"
    if isinstance(obj, (list, tuple)):
        index = next((i for i, v in enumerate(obj) if v is child), None)
        return f"{type(obj).__name__}[{index}]"
    if isinstance(obj, types.FrameType):
        code = obj.f_code
        return f"frame {code.co_name} ({code.co_filename}:{obj.f_lineno})"
    if isinstance(obj, types.FunctionType):
        return f"function {obj.__module__}.{obj.__qualname__}"
    if isinstance(obj, types.CellType):
        return "closure cell"
    if isinstance(obj, types.MethodType):
        return f"bound method {obj.__qualname__}"
    kind = type(obj)
    return f"{kind.__module__}.{kind.__qualname__}"
