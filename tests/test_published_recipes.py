"""NVIDIA's published DGX-H100 layouts (tools/published_recipes.py, each row cited there) pass
autotune's rules: NVIDIA runs them, so a rule that refuses one is wrong (Llama 3.1 405B's 126
layers at pp 8 vpp 8 need the embedding and the loss counted in the split)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.errors import ConfigError
from autotune.layouts.layout import Layout, check
from autotune.levers.flags import Given
from autotune.megatron.megatron_args import FLAG_TABLE, megatron_lm_args
from autotune.specs.presets import load_model
from tests.conftest import cluster
from tools.published_recipes import ROOT, ROWS, Row


def _layout(row: Row) -> Layout:
    fp8 = {} if row.fp8_recipe is None else {"fp8": "hybrid", "fp8_recipe": row.fp8_recipe}
    recompute = {} if row.recompute is None else dict(
        zip(("recompute", "recompute_method", "recompute_num_layers"), row.recompute,
            strict=True))
    return Layout(tp=row.tp, pp=row.pp, cp=row.cp, vpp=row.vpp, ep=row.ep,
                  dp=row.gpus // (row.tp * row.pp * row.cp), mbs=row.mbs, gbs=row.gbs,
                  sequence_parallel=row.tp > 1, embedding_loss_split=row.embedding_loss_split,
                  impl="te", distributed_optimizer=True, overlap_grad_reduce=True,
                  overlap_param_gather=True, **fp8, **recompute)  # type: ignore[arg-type]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_autotune_accepts_the_published_layout(row: Row) -> None:
    name = str(ROOT / row.model) if row.model.startswith("tests/") else row.model
    try:
        model = dataclasses.replace(load_model(name), seq_length=row.seq,
                                    global_batch_size=row.gbs)
    except ConfigError as exc:  # a model autotune does not represent (Qwen3's head_dim)
        pytest.skip(str(exc))
    layout = _layout(row)
    assert check(layout, model, cluster(row.gpus, gpus_per_node=8)) == [], layout.describe()


def test_the_405b_split_needs_the_embedding_and_loss_counted() -> None:
    row = next(row for row in ROWS if row.embedding_loss_split)
    model = load_model(str(ROOT / row.model))
    even = dataclasses.replace(_layout(row), embedding_loss_split=False)
    assert [v.rule for v in check(even, model, cluster(row.gpus, gpus_per_node=8))] \
        == ["pp_layers", "vpp_layers"]


def test_the_split_is_exported_and_read_back() -> None:
    """Megatron-LM receives both flags, and a command with both reads back as the split; one
    of the two alone is a split autotune does not model, refused in one line."""
    row = next(row for row in ROWS if row.embedding_loss_split)
    model = load_model(str(ROOT / row.model))
    args = megatron_lm_args(model, _layout(row), mock_data=True)
    assert {"--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split"} <= set(args)
    both = dict.fromkeys(("--account-for-embedding-in-pipeline-split",
                          "--account-for-loss-in-pipeline-split"))
    read = next(r.read for r in FLAG_TABLE if r.name == "embedding_loss_split")
    assert read is not None
    assert read(Given(both, "t.sh")) == {"embedding_loss_split": True}
    one = {"--account-for-loss-in-pipeline-split": None}
    with pytest.raises(ConfigError, match="without the other"):
        read(Given(one, "t.sh"))
    assert read(Given({}, "t.sh")) == {"embedding_loss_split": False}
