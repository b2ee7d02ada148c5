"""--precision and a --from-megatron search's precision (autotune.commands.precision): the
command's own precision is kept unless --precision lets FP8 in; FP8 predicted faster is one
line, never a proposal."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.commands.precision import Precision, fp8_hint, kept_precision, parse_precision
from autotune.errors import ConfigError
from autotune.layouts.layout import Layout
from autotune.levers.fp8 import Fp8, Fp8Recipe
from autotune.report.scripts import megatron_lm_script
from autotune.specs.hardware import ClusterSpec
from autotune.specs.presets import load_model

XL = load_model("gpt2-xl")
LLAMA_3B = replace(load_model("tests/data/hf/llama-3.2-3b.json"), seq_length=4096)
BF16 = Layout(mbs=16, gbs=64, impl="te")
FP8_TW = replace(BF16, fp8=Fp8.HYBRID, fp8_recipe=Fp8Recipe.TENSORWISE)
L3B2 = Layout(mbs=2, gbs=8, impl="te", distributed_optimizer=True,
              precision_aware_optimizer=True)
"""GPU-bound: FP8 measured 12-21% faster (tests/test_fp8.py)."""


@pytest.mark.parametrize(("layout", "precision", "pins"), [
    (BF16, None, {"fp8": (Fp8.OFF,), "fp8_recipe": (Fp8Recipe.DELAYED,)}),
    (FP8_TW, None, {"fp8": (Fp8.HYBRID,), "fp8_recipe": (Fp8Recipe.TENSORWISE,)}),
    (BF16, Precision.BF16, {"fp8": (Fp8.OFF,)}),
    (BF16, Precision.ANY, {}),
    (FP8_TW, Precision.ANY, {}),
])
def test_kept_precision(layout: Layout, precision: Precision | None,
                        pins: dict[str, tuple[object, ...]]) -> None:
    assert kept_precision(layout, precision) == pins


def test_bf16_on_an_fp8_command_is_one_line() -> None:
    with pytest.raises(ConfigError, match="trains in FP8"):
        kept_precision(FP8_TW, Precision.BF16)


@pytest.mark.parametrize(("value", "pins", "out"), [
    (None, {}, None), ("bf16", {}, Precision.BF16), ("any", {}, Precision.ANY),
    ("any", {"fp8": ("hybrid",)}, Precision.ANY),
    ("fp8", {}, "give bf16 or any"), ("bf16", {"fp8": ("hybrid",)}, "cannot go with a pin"),
])
def test_parse_precision(value: str | None, pins: dict[str, tuple[object, ...]],
                         out: Precision | str | None) -> None:
    if isinstance(out, str) and not isinstance(out, Precision):
        with pytest.raises(ConfigError, match=out):
            parse_precision(value, pins)
    else:
        assert parse_precision(value, pins) == out


@pytest.mark.parametrize(("layout", "gpu", "hinted"), [
    (L3B2, "h100-80gb", True),       # FP8 tensor cores, a GPU-bound layout
    (L3B2, "a100-80gb", False),      # no FP8 tensor cores
    (replace(L3B2, fp8=Fp8.HYBRID), "h100-80gb", False),  # FP8 already
])
def test_fp8_hint(layout: Layout, gpu: str, hinted: bool) -> None:
    hint = fp8_hint(LLAMA_3B, ClusterSpec.make(1, gpu=gpu), layout)
    assert (hint is not None) == hinted
    if hint is not None:
        assert "is predicted" in hint and "faster here" in hint and "--precision any" in hint


def _fp8_line(out: str) -> str:
    line = next(x for x in out.splitlines() if x.strip().startswith("fp8 "))
    return line.split(None, 1)[1].strip()


def _recipe_line(out: str) -> str:
    line = next(x for x in out.splitlines() if x.strip().startswith("fp8_recipe "))
    return line.split(None, 1)[1].strip()


@pytest.mark.parametrize(("layout", "args", "fp8", "recipe"), [
    # The command's precision is kept: bf16 stays bf16, an FP8 recipe stays that recipe.
    (BF16, [], "off", "delayed"),
    (FP8_TW, [], "hybrid", "tensorwise"),
    (BF16, ["--precision", "bf16"], "off", None),
    # --precision any lets the space's FP8 candidates in.
    (BF16, ["--precision", "any"], "hybrid, off", None),
])
def test_from_megatron_keeps_the_commands_precision(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: Layout, args: list[str],
        fp8: str, recipe: str | None) -> None:
    script = tmp_path / "run.sh"
    script.write_text(megatron_lm_script(XL, layout, title=["mine"], nodes=1))
    assert main(["--from-megatron", str(script), "--backend", "simulate", "--gpu", "h100-80gb",
                 "--dry-run", *args]) == 0
    out = capsys.readouterr().out
    assert fp8 in _fp8_line(out) and set(_fp8_line(out).split(", ")) == set(fp8.split(", "))
    if recipe is not None:
        assert _recipe_line(out) == recipe
