"""The seed tutorial's context-parallel table (../shared/seeds/000_*.txt, Megatron-LM on 8 x H100
80GB SXM): which runs fit and which ran out of memory, as the memory model must predict them.

Its runs (vuiseng9/megatron-tutorials, scripts/3--_*_gbsX_lenX_cpX.sh): pretrain_gpt.py with
--micro-batch-size = --global-batch-size, tp 1, pp 1, cp GPUs (so dp 1), bf16, Transformer
Engine with flash attention, --max-position-embeddings = --seq-length. The table's memory
column is in GB (10^9 B, monitor-gpu's units): read so, the model is within the band below.
"""

from __future__ import annotations

import pytest

from autotune.layouts.layout import Layout
from autotune.predict.memory import estimate_memory
from autotune.specs.hardware import ClusterSpec, gpu_spec
from autotune.specs.presets import load_model

# (row, seq, batch, cp, measured GB per GPU or None for OOM)
SEED_CP_TABLE = [
    ("r1", 4096, 4, 1, None),
    ("r2", 4096, 4, 2, 56),
    ("r3", 4096, 4, 4, 46),
    ("r4", 4096, 4, 8, 40),
    ("r5", 8192, 4, 8, 48),
    ("r6", 16384, 4, 8, 63),
    ("r7", 8192, 8, 8, 60),
    ("r8", 8192, 8, 4, None),
]


def _estimate(seq: int, batch: int, cp: int):  # type: ignore[no-untyped-def]
    model = load_model("gpt2-xl").with_overrides(seq_length=seq, global_batch_size=batch)
    layout = Layout(tp=1, pp=1, dp=1, cp=cp, mbs=batch, gbs=batch, impl="te")
    cluster = ClusterSpec(num_gpus=cp, gpus_per_node=8, gpu=gpu_spec("h100-80gb"))
    return estimate_memory(model, layout, cluster)


@pytest.mark.parametrize(("row", "seq", "batch", "cp", "measured_gb"), SEED_CP_TABLE,
                         ids=[r[0] for r in SEED_CP_TABLE])
def test_the_seed_cp_table_fits_where_it_ran(row: str, seq: int, batch: int, cp: int,
                                             measured_gb: int | None) -> None:
    memory = _estimate(seq, batch, cp)
    assert memory.fits == (measured_gb is not None), memory.explain()


@pytest.mark.parametrize(("row", "seq", "batch", "cp", "measured_gb"),
                         [r for r in SEED_CP_TABLE if r[4] is not None],
                         ids=[r[0] for r in SEED_CP_TABLE if r[4] is not None])
def test_the_seed_cp_table_memory_within_the_band(row: str, seq: int, batch: int, cp: int,
                                                  measured_gb: int) -> None:
    # Today: -4.6% (r2) to +6.3% (r6) under; the error grows with the sequence (r6, 16k).
    predicted = _estimate(seq, batch, cp).peak_bytes
    assert abs(predicted / (measured_gb * 1e9) - 1) <= 0.07
