"""Megatron-LM's `--pipeline-model-parallel-layout`: read as megatron-core reads it, mapped to
autotune's pipeline split where that split can say it, and written back for another layout.

The string lists the model's layers stage by stage (megatron-core 0.16.1
megatron/core/transformer/pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout.
parse_str_to_list): `E` the embedding, `t` a transformer (decoder) layer, `m` a Multi-Token
Prediction layer, `L` the loss; `|` ends a stage; `x*n` repeats one symbol, `(...)*n` a run of
them; commas are cosmetic and dropped first. Stage k of the pp x vpp stages is virtual stage
k // pp of pipeline rank k % pp (PipelineParallelLayerLayout.__init__, "Convert 1D layout to 2D").
Megatron-LM takes vpp from it (arguments.py validate_args: the stage count over
--pipeline-model-parallel-size) and refuses it beside --num-virtual-stages-per-pipeline-rank or
--num-layers-per-virtual-pipeline-stage; TransformerConfig.__post_init__ refuses it beside
--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split.

autotune's parser reads this grammar, after the commas are dropped:

    layout := piece*
    piece  := '(' item+ ')' '*' COUNT  |  item
    item   := SYMBOL ('*' COUNT)?
    SYMBOL := 'E' | 't' | 'm' | 'L' | '|'
    COUNT  := [0-9]+

then splits the expanded text at `|`. megatron-core expands with two regular-expression passes
(`(...)*n` first, then `x*n`); on every string of this grammar the two give the same stages
(tests/test_pipeline_layout.py checks it against megatron-core's own parser). What lies outside
it (nested parentheses, a count after a count, `(...)` without one) megatron-core either refuses
or reads in a way its passes happen to give (`(t)*2*3` is four layers there, not six): autotune
refuses it in one line rather than guess.

A layout autotune models (`split_fields`) is one its Layout's split gives: the embedding on the
first stage, the loss and the MTP layers on the last (megatron-core's default placement), and
the transformer layers of each model chunk those of an even split, of the first and last stages'
own counts (--decoder-first/last-pipeline-num-layers) or of the embedding/loss split
(autotune.levers.pipeline_split.chunk_sizes). Any other is refused in one line naming the stage.
`format_layout` writes the string for a Layout, which `split_fields` reads back as that split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.levers.pipeline_split import chunk_sizes
from autotune.specs.model import ModelSpec

__all__ = ["CONFLICTS", "LAYOUT_FLAG", "PipelineLayout", "expand", "format_layout",
           "read_layout", "split_fields", "string_split"]

LAYOUT_FLAG = "--pipeline-model-parallel-layout"

CONFLICTS: tuple[str, ...] = (
    # Megatron-LM validate_args: "No more than one of the following arguments can be set".
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    # TransformerConfig.__post_init__: "pipeline_model_parallel_layout cannot be set with
    # other pipeline layout arguments".
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
"""The flags Megatron-LM refuses beside LAYOUT_FLAG: a command with both is refused, and an
export that keeps the string writes none of them (the string says what they would)."""

_SYMBOLS = frozenset("EtmL|")
_DIGITS = frozenset("0123456789")
"""ASCII digits only: megatron-core's `\\d` also takes other scripts' digits, which no layout
needs."""
_MAX_LAYERS = 100_000
"""More symbols than any model's layout holds: a count beyond it is refused, not expanded."""


class _Parser:
    """The grammar of the module docstring, over the text with its commas dropped."""

    def __init__(self, text: str, fail: Callable[[str], ConfigError]) -> None:
        self.text, self.at, self.fail = text, 0, fail

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def count(self) -> int:
        if self.peek() != "*":
            return 1
        self.at += 1
        start = self.at
        while self.peek() and self.peek() in _DIGITS:
            self.at += 1
        if start == self.at:
            raise self.fail(f"'*' at character {start} is not followed by a count")
        if self.at - start > 6:
            raise self.fail("a count too large for a layout")
        return int(self.text[start:self.at])

    def check(self, size: int) -> None:
        # Before a repetition is built: `(t*99999|)*99999` must not fill the memory first.
        if size > _MAX_LAYERS:
            raise self.fail("more layers than any model has")

    def item(self) -> str:
        symbol = self.peek()
        if symbol not in _SYMBOLS or not symbol:
            what = f"character {self.at + 1} ({symbol!r})" if symbol else "the end"
            raise self.fail(f"expected E, t, m, L, '|' or '(' at {what} (megatron-core's "
                            "layer symbols)")
        self.at += 1
        times = self.count()
        self.check(times)
        return symbol * times

    def piece(self) -> str:
        if self.peek() != "(":
            return self.item()
        self.at += 1
        body: list[str] = []
        while not body or self.peek() not in ("", ")"):
            if self.peek() == "(":
                raise self.fail(f"parentheses inside parentheses at character {self.at + 1}")
            body.append(self.item())
            self.check(sum(map(len, body)))
        if self.peek() != ")":
            raise self.fail("a '(' without its ')'")
        self.at += 1
        if self.peek() != "*":
            raise self.fail(f"'(...)' without a count at character {self.at}: write (...)*N")
        run = "".join(body)
        times = self.count()
        self.check(len(run) * times)
        return run * times

    def layout(self) -> str:
        out: list[str] = []
        size = 0
        while self.peek():
            piece = self.piece()
            if self.peek() == "*":
                raise self.fail(f"a count after a count at character {self.at + 1}: write one")
            size += len(piece)
            self.check(size)
            out.append(piece)
        return "".join(out)


def expand(text: str, source: str) -> tuple[str, ...]:
    """The stages of a layout string, each the string of its layers' symbols in order
    (`Et*2|(t|)*2L` -> ("Ett", "t", "tL")): PipelineParallelLayerLayout.parse_str_to_list's
    list of lists, one character per layer."""
    def fail(why: str) -> ConfigError:
        return ConfigError(f"{source}: {LAYOUT_FLAG} {text!r}: {why}")

    flat = _Parser(text.replace(",", ""), fail).layout()
    return tuple(flat.split("|"))


@dataclass(frozen=True, slots=True)
class PipelineLayout:
    """A layout string read and checked as megatron-core checks it (`read_layout`)."""

    text: str
    """As the command gives it."""
    pp: int
    stages: tuple[str, ...]
    """Every stage's layers (module docstring), in the string's order: stage k is virtual
    stage k // pp of pipeline rank k % pp."""

    @property
    def vpp(self) -> int:
        return len(self.stages) // self.pp

    def chunk(self, rank: int, virtual: int) -> str:
        """The layers of pipeline rank `rank`'s virtual stage `virtual`."""
        return self.stages[virtual * self.pp + rank]

    def decoder_chunks(self) -> tuple[tuple[int, ...], ...]:
        """Transformer layers per pipeline rank and virtual stage, as chunk_sizes gives them."""
        return tuple(tuple(self.chunk(r, v).count("t") for v in range(self.vpp))
                     for r in range(self.pp))

    def where(self, symbol: str) -> list[tuple[int, int]]:
        """(rank, virtual stage) of each chunk holding `symbol`, in layer order."""
        return [(r, v) for v in range(self.vpp) for r in range(self.pp)
                if symbol in self.chunk(r, v)]


def _stage(rank: int, virtual: int) -> str:
    return f"pipeline stage {rank}" + (f", virtual stage {virtual}" if virtual else "")


def read_layout(text: str, *, pp: int, num_layers: int, mtp_num_layers: int,
                source: str) -> PipelineLayout:
    """`text` for a command at `pp` pipeline ranks with `num_layers` transformer layers and
    `mtp_num_layers` MTP layers, refused in one line (ConfigError) where Megatron-LM refuses
    it: its stage count not a multiple of pp (validate_args), or a rule of
    PipelineParallelLayerLayout.validate_layer_layout."""
    def fail(why: str) -> ConfigError:
        return ConfigError(f"{source}: {LAYOUT_FLAG} {text!r}: {why}")

    stages = expand(text, source)
    if len(stages) % pp:
        raise fail(f"{len(stages)} stages do not split over --pipeline-model-parallel-size "
                   f"{pp} (Megatron-LM needs a multiple of it: pp x virtual stages)")
    layout = PipelineLayout(text, pp, stages)
    flat = "".join(layout.chunk(r, v) for v in range(layout.vpp) for r in range(pp))
    # validate_layer_layout, in its order.
    if not flat.startswith("E"):
        raise fail("the first layer must be the embedding E (megatron-core)")
    if not flat.endswith("L"):
        raise fail("the last layer must be the loss L (megatron-core)")
    for symbol, name in (("E", "the embedding E"), ("L", "the loss L")):
        if flat.count(symbol) != 1:
            raise fail(f"{name} must be given once, not {flat.count(symbol)} times "
                       "(megatron-core)")
    if flat.count("t") != num_layers:
        raise fail(f"{flat.count('t')} transformer layers t, but --num-layers {num_layers} "
                   "(megatron-core needs them equal)")
    if flat.count("m") != mtp_num_layers:
        raise fail(f"{flat.count('m')} MTP layers m, but --mtp-num-layers {mtp_num_layers} "
                   "(megatron-core needs them equal)")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise fail("a transformer layer t after an MTP layer m (megatron-core places the MTP "
                   "layers after every transformer layer)")
    for rank, virtual in layout.where("m"):
        if virtual != layout.vpp - 1:
            raise fail(f"MTP layers on {_stage(rank, virtual)}: megatron-core keeps them in a "
                       "rank's last virtual stage")
        if layout.chunk(rank, virtual).count("m") != mtp_num_layers:
            raise fail("the MTP layers split over several stages: megatron-core needs them "
                       "in one")
    return layout


def _candidates(layout: PipelineLayout) -> list[dict[str, Any]]:
    """The splits of autotune's Layout that could give `layout`'s transformer layers: the even
    one, the first and last stages' own counts from its stage totals (the middle stages'
    share left unnamed, as split_choices writes them; at pp 2 the lighter end named), then the
    embedding/loss split (taken at vpp 1 only where the counts cannot say it: an end stage
    without a layer)."""
    pp = layout.pp
    totals = [sum(row) for row in layout.decoder_chunks()]
    even = {"first_stage_layers": 0, "last_stage_layers": 0, "embedding_loss_split": False}
    out = [even]
    if pp >= 3:
        share = totals[1]
        out.append({**even, "first_stage_layers": 0 if totals[0] == share else totals[0],
                    "last_stage_layers": 0 if totals[-1] == share else totals[-1]})
    elif pp == 2 and totals[0] != totals[1]:
        light = "first_stage_layers" if totals[0] < totals[1] else "last_stage_layers"
        out.append({**even, light: min(totals)})
    if pp >= 2:
        out.append({**even, "embedding_loss_split": True})
    return out


def _why_not(layout: PipelineLayout) -> str:
    """Which stage keeps `layout` from being one of autotune's splits, and why."""
    chunks = layout.decoder_chunks()
    pp, vpp = layout.pp, layout.vpp
    for rank, row in enumerate(chunks):
        if len(set(row)) > 1:
            return (f"pipeline stage {rank} holds {', '.join(map(str, row))} transformer layers "
                    f"in its {vpp} virtual stages: autotune splits a stage's layers evenly over "
                    "its virtual stages (as --decoder-first/last-pipeline-num-layers do; with "
                    "--account-for-embedding/loss-in-pipeline-split, one fewer in the virtual "
                    "stage holding the embedding or the loss)")
    totals = [sum(row) for row in chunks]
    for rank in range(2, pp - 1):
        if totals[rank] != totals[1]:
            return (f"pipeline stage {rank} holds {totals[rank]} transformer layers, stage 1 "
                    f"{totals[1]}: autotune's split gives every middle stage one count (the "
                    "first and last stages their own)")
    for rank in (0, pp - 1):
        if totals[rank] == 0:
            return (f"pipeline stage {rank} holds no transformer layer: autotune's split gives "
                    "an end stage at least one (--decoder-first/last-pipeline-num-layers must "
                    "be positive)")
    return (f"transformer layers {', '.join(map(str, totals))} per stage are no split "
            "autotune models")


def split_fields(layout: PipelineLayout, model: ModelSpec, source: str) -> dict[str, Any]:
    """autotune's Layout fields for `layout` (vpp, first_stage_layers, last_stage_layers,
    embedding_loss_split): the split whose model chunks (chunk_sizes) hold exactly its
    transformer layers, with the embedding on the first stage and the loss and MTP layers on
    the last; refused in one line (ConfigError) naming the stage where no split does."""
    def fail(why: str) -> ConfigError:
        return ConfigError(f"{source}: {LAYOUT_FLAG} {layout.text!r}: {why}; autotune does not "
                           "model this layout (its memory and step time would be another's)")

    first, last = (0, 0), (layout.pp - 1, layout.vpp - 1)
    placed = (("E", "the embedding", first, "first"), ("L", "the loss", last, "last"),
              ("m", "the MTP layers", last, "last"))
    for symbol, name, want, end in placed:
        at = layout.where(symbol)
        if at and at[0] != want:
            raise fail(f"{name} on {_stage(*at[0])}: autotune places {name} on the {end} "
                       "stage, as megatron-core does without a layout")
    chunks = layout.decoder_chunks()
    for fields in _candidates(layout):
        split = Layout(dp=1, pp=layout.pp, vpp=layout.vpp, **fields)
        if chunk_sizes(split, model) == chunks:
            return {"vpp": layout.vpp, **fields}
    raise fail(_why_not(layout))


def _run(text: str) -> str:
    """A stage's symbols as the string writes them: `Et*4`, `tmL`, `t*2m*2L`."""
    out: list[str] = []
    k = 0
    while k < len(text):
        n = len(text[k:]) - len(text[k:].lstrip(text[k]))
        out.append(text[k] + (f"*{n}" if n > 1 else ""))
        k += n
    return "".join(out)


def format_layout(model: ModelSpec, s: Layout) -> str:
    """The layout string of `s` for `model`: each model chunk's transformer layers
    (chunk_sizes), the embedding first on the first, the MTP layers and the loss last on the
    last; a run of equal stages written `(stage|)*n`, megatron-core's documented form
    (`Et*4|(t*4|)*14tmL`)."""
    sizes = chunk_sizes(s, model)
    stages = []
    for v in range(s.vpp):
        for r in range(s.pp):
            text = "t" * sizes[r][v]
            if (r, v) == (0, 0):
                text = "E" + text
            if (r, v) == (s.pp - 1, s.vpp - 1):
                text += "m" * model.mtp_num_layers + "L"
            stages.append(_run(text))
    out: list[str] = []
    k = 0
    while k < len(stages):
        n = 1
        while k + n < len(stages) - 1 and stages[k + n] == stages[k]:
            n += 1
        last = k + n == len(stages)
        if n > 1:
            out.append(f"({stages[k]}|)*{n}")
        else:
            out.append(stages[k] + ("" if last else "|"))
        k += n
    return "".join(out)


def string_split(model: ModelSpec, s: Layout, source: str) -> Layout:
    """`s` with its split as its layout string reads back (format_layout, then split_fields):
    the same stages, though at vpp 1 the embedding/loss split reads as the end stages' own
    counts, which give the same layers (chunk_sizes)."""
    text = format_layout(model, s)
    layout = read_layout(text, pp=s.pp, num_layers=model.num_layers,
                         mtp_num_layers=model.mtp_num_layers, source=source)
    return replace(s, **split_fields(layout, model, source))
