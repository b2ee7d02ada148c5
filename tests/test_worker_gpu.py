"""Tiny real trials through torchrun on the local GPUs: one OK trial per impl, and an OOM
that must end with its failure file and exit code 3 within seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.layouts.layout import Layout
from autotune.specs.model import ModelSpec
from autotune.trials.trial import TrialMetrics, TrialSpec, TrialStatus

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _needs_cuda_and_megatron() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _tiny(seq: int = 256, **fields: object) -> ModelSpec:
    base: dict[str, object] = dict(name="tiny", num_layers=2, hidden_size=256,
                                   num_attention_heads=4, vocab_size=1000, seq_length=seq,
                                   global_batch_size=8)
    base.update(fields)
    return ModelSpec(**base)  # type: ignore[arg-type]


def _run(tmp_path: Path, spec: TrialSpec, port: int) -> tuple[subprocess.CompletedProcess[str],
                                                               float]:
    spec.write(tmp_path / "trial.json")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
         "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "autotune.worker",
         "--spec", str(tmp_path / "trial.json"), "--out-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300)
    return proc, time.monotonic() - start


@pytest.mark.parametrize(("impl", "port"), [("sdpa", 29741), ("local", 29742)])
def test_tiny_trial_ok(tmp_path: Path, impl: str, port: int) -> None:
    spec = TrialSpec(model=_tiny(), layout=Layout(mbs=2, gbs=8, impl=impl),
                     train_steps=3, warmup_steps=1)
    proc, _ = _run(tmp_path, spec, port)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = TrialMetrics.from_dict(json.loads((tmp_path / "result.json").read_text()))
    assert metrics.status == TrialStatus.OK
    assert metrics.loss_finite is True
    assert metrics.tokens_per_s and metrics.tokens_per_s > 0
    assert metrics.mfu is not None and 0 < metrics.mfu < 1
    assert metrics.peak_allocated_bytes and metrics.peak_allocated_bytes > 0
    assert len(metrics.ranks) == 1


def test_tiny_moe_trial_ok(tmp_path: Path) -> None:
    model = _tiny(num_query_groups=2, gated_linear_unit=True, activation="swiglu",
                  normalization="RMSNorm", add_bias_linear=False, tied_embeddings=False,
                  position_embedding="rope", num_experts=4, moe_topk=2)
    spec = TrialSpec(model=model, layout=Layout(mbs=2, gbs=8, impl="sdpa"),
                     train_steps=2, warmup_steps=1)
    proc, _ = _run(tmp_path, spec, 29743)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_oom_ends_fast_with_failure_file(tmp_path: Path) -> None:
    # impl local keeps [b, heads, s, s] scores: 64 x 4 x 16384^2 bf16 is 128 GiB per layer.
    model = _tiny(seq=16384, max_position_embeddings=16384, global_batch_size=64)
    spec = TrialSpec(model=model, layout=Layout(mbs=64, gbs=64, impl="local"),
                     train_steps=1, warmup_steps=1)
    proc, elapsed = _run(tmp_path, spec, 29744)
    assert proc.returncode != 0
    failure = json.loads((tmp_path / "failure-rank0.json").read_text())
    assert failure["status"] == "OOM"
    assert "AUTOTUNE_STATUS rank=0 status=OOM" in proc.stderr
    assert "exitcode  : 3" in proc.stderr
    assert elapsed < 120


def test_te_without_transformer_engine_is_a_crash(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("transformer_engine") is not None:
        pytest.skip("transformer-engine is installed")
    spec = TrialSpec(model=_tiny(), layout=Layout(mbs=2, gbs=8, impl="te"))
    proc, _ = _run(tmp_path, spec, 29745)
    failure = json.loads((tmp_path / "failure-rank0.json").read_text())
    assert failure["status"] == "CRASH"
    assert "impl=te needs transformer-engine" in failure["error"]
    assert "exitcode  : 4" in proc.stderr
