"""What a layout's label says: the legend of `Layout.describe()` (`tp2 pp1 dp4 mbs8 sp do sdpa`).

Generated from the dimension table (autotune.layouts.layout.DIMENSIONS): each labelled dimension's
own label function is asked for its text at example values, and its meaning is its help (or, where
the label is the value itself, its enum's docstring). A new dimension or a changed abbreviation
shows in `autotune --help` and under the search's table without a list kept by hand.
"""

from __future__ import annotations

import enum
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from autotune.dimensions import Dimension
from autotune.layouts.layout import DIMENSIONS, Layout

__all__ = ["LegendEntry", "legend_entries", "legend_lines", "legend_text"]


@dataclass(frozen=True, slots=True)
class LegendEntry:
    shown: str
    """What the label shows, `tpN` or `local|te|sdpa`."""
    meaning: str
    pattern: re.Pattern[str]
    """Matches the words of a label this entry explains."""


def _example(dim: Dimension) -> Any:
    """A value of `dim` other than its default."""
    kind: Any = dim.kind
    if kind is bool:
        return not dim.default
    if kind is int:
        return dim.default + 1
    return next(m for m in kind if m != dim.default)


def _with(base: Layout, values: dict[str, Any]) -> Layout:
    return replace(base, **values)


def _clause(text: str) -> str:
    """The first clause of a help text: up to its first `. `, `: ` or `; `. A help that opens
    with its condition ("With fp8: keep the GEMM weights in FP8 ...") gives the clause after it,
    the condition after that: the condition alone says nothing of what the label means."""
    flat = " ".join(text.split())
    cut = min((i for i in (flat.find(s) for s in (". ", ": ", "; ")) if i >= 0),
              default=len(flat))
    if flat.startswith("With ") and flat[cut:cut + 2] == ": " and cut + 2 < len(flat):
        rest = _clause(flat[cut + 2:])
        return f"{rest[:1].upper()}{rest[1:]}, {flat[:cut].lower()}"
    return flat[:cut].rstrip(".")


def _entry(dim: Dimension, base: Layout) -> LegendEntry | None:
    assert dim.label is not None
    kind: Any = dim.kind
    values: list[Any] = list(kind) if issubclass(kind, enum.Enum) else [_example(dim)]
    shown = {v: dim.label(_with(base, {dim.name: v}), v) for v in values}
    texts = [t for t in shown.values() if t]
    if not texts:
        return None
    patterns = [re.escape(t) for t in texts]
    if kind is int:
        patterns = [re.sub(r"\d+", r"\\d+", p) for p in patterns]
        texts = [re.sub(r"\d+", "N", t) for t in texts]
    meaning = _clause(dim.help)
    if issubclass(kind, enum.Enum) and all(t == str(v) for v, t in shown.items()):
        # The label is the value itself: the enum's docstring says what the values are.
        meaning = " ".join((kind.__doc__ or dim.help).split("\n\n")[0].split()).rstrip(".")
    folded = [d for d in DIMENSIONS.values() if d.folded_into == dim.name]
    if folded:
        changed: dict[str, Any] = {d.name: _example(d) for d in folded}
        # Every value whose label shows folded dimensions (rc=full(block/2), rc=selective(mlp)).
        for value in values:
            example = dim.label(_with(base, {dim.name: value, **changed}), value)
            if not example or example in texts:
                continue
            texts.append(example)
            pattern = re.escape(example)
            shown_in = [name for name, v in changed.items() if str(v) in example]
            for name in shown_in:
                pattern = pattern.replace(re.escape(str(changed[name])), r"[^/()]+", 1)
            patterns.append(pattern)
            meaning += (f"; {example}: {'/'.join(shown_in)} when not "
                        f"{'/'.join(str(DIMENSIONS[n].default) for n in shown_in)}")
    return LegendEntry("|".join(dict.fromkeys(texts)), meaning,
                       re.compile("|".join(f"(?:{p})" for p in patterns)))


def legend_entries(labels: Iterable[str] | None = None) -> list[LegendEntry]:
    """One entry per labelled dimension, in label order; with `labels` (describe() texts), only
    the entries their words need."""
    base = Layout()
    entries = [e for e in (_entry(dim, base) for dim in DIMENSIONS.values()
                           if dim.label is not None) if e is not None]
    if labels is None:
        return entries
    words = {w for label in labels for w in label.split()}
    return [e for e in entries if any(e.pattern.fullmatch(w) for w in words)]


def legend_lines(labels: Iterable[str] | None = None, width: int = 8,
                 columns: int = 88) -> list[str]:
    """The legend as aligned lines of at most `columns` characters, `  tpN       Tensor
    parallel size ...`; a label wider than `width` puts its meaning on the next line."""
    indent = " " * (width + 4)
    lines = []
    for e in legend_entries(labels):
        first = f"  {e.shown:<{width}}  " if len(e.shown) <= width else indent
        if len(e.shown) > width:
            lines.append(f"  {e.shown}")
        lines += textwrap.wrap(e.meaning, columns, initial_indent=first,
                               subsequent_indent=indent, break_on_hyphens=False)
    return lines


def legend_text(labels: Iterable[str] | None = None) -> str:
    """The legend as one paragraph, for a table's caption."""
    entries = legend_entries(labels)
    return ("Labels: " + "; ".join(f"{e.shown} = {e.meaning}" for e in entries) + "."
            if entries else "")
