"""Time the weight-gradient GEMMs of one transformer layer two ways on the GPU: Megatron without
gradient-accumulation fusion (a bf16 wgrad, then main_grad.add_) against one accumulating GEMM
with an fp32 output (torch.addmm(..., out_dtype=torch.float32, out=main_grad), what apex's
fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32 does).

    python3 tools/device_wgrad_bench.py HIDDEN FFN TOKENS     e.g. 1600 6400 16384 (gpt2-xl mbs 16)
"""

from __future__ import annotations

import sys

import torch


def _unfused(main: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> None:
    main.add_(g.t() @ x)


def _fused(main: torch.Tensor, g: torch.Tensor, x: torch.Tensor) -> None:
    torch.addmm(main, g.t(), x, out_dtype=torch.float32, out=main)


def _time_ms(fn, *args: torch.Tensor, reps: int = 30) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    hidden, ffn, tokens = (int(a) for a in sys.argv[1:4])
    shapes = {"qkv": (3 * hidden, hidden), "proj": (hidden, hidden), "fc1": (ffn, hidden),
              "fc2": (hidden, ffn)}
    print(torch.__version__, torch.cuda.get_device_name())
    print(f"{'linear':<6} {'out x in':>12} {'bf16 wgrad + add_ ms':>21} {'addmm fp32 out ms':>18}"
          f" {'max abs diff':>13}")
    total = [0.0, 0.0]
    for name, (n_out, n_in) in shapes.items():
        x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
        main_a = torch.zeros(n_out, n_in, device="cuda")
        main_b = torch.zeros(n_out, n_in, device="cuda")
        a, b = _time_ms(_unfused, main_a, g, x), _time_ms(_fused, main_b, g, x)
        total[0] += a
        total[1] += b
        main_a.zero_()
        main_b.zero_()
        _unfused(main_a, g, x)
        _fused(main_b, g, x)
        diff = (main_a - main_b).abs().max().item()
        print(f"{name:<6} {n_out:>5} x {n_in:<5} {a:21.3f} {b:18.3f} {diff:13.3g}")
    print(f"{'layer':<6} {'':>12} {total[0]:21.3f} {total[1]:18.3f}")


if __name__ == "__main__":
    main()
