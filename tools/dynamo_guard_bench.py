"""Host time of a torch.compile'd function's call against how many compiled versions it holds.

    python tools/dynamo_guard_bench.py [--device cpu|cuda] [--calls 4000]

Why (issue 25, and issue 30's warm/cold check): the worker compiles each shape statically
(autotune.worker.run._compile_each_shape_statically, recompile limit 64), and a warm pool keeps
every earlier trial's compiled versions of megatron-core's fused functions. If dynamo checks the
guards of every cached version on each call, a warm rank pays more host time per call than a
cold one, the more trials it has served: more host CPU per step warm, on host-bound layouts.
This measures it on the same function megatron-core fuses (bias + GeLU shape), with dynamo's
"eager" backend so that only dynamo's own per-call work differs between the rows: the best of
5 batches of calls, for the oldest and the newest shape, at 1, 8, 16, 32 and 63 versions.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch._dynamo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=4000)
    args = ap.parse_args()
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.recompile_limit = 64

    @torch.compile(backend="eager")
    def fused(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + y)

    shapes = {n: (torch.randn(n, 8, device=args.device), torch.randn(8, device=args.device))
              for n in range(1, 66)}

    def per_call_us(fn: object, n: int) -> float:
        x, y = shapes[n]
        fn(x, y)  # type: ignore[operator]
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(args.calls // 5):
                fn(x, y)  # type: ignore[operator]
            if args.device == "cuda":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / (args.calls // 5) * 1e6)
        return best

    def eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x + y)

    print(f"torch {torch.__version__}, device {args.device}")
    print(f"not compiled: {per_call_us(eager, 1):.1f} us/call")
    print("| compiled versions | oldest shape us/call | newest shape us/call |\n|---|---|---|")
    have = 1
    per_call_us(fused, 1)
    for k in (1, 8, 16, 32, 63):
        while have < k:
            have += 1
            fused(*shapes[have])
        print(f"| {k} | {per_call_us(fused, 1):.1f} | {per_call_us(fused, have):.1f} |")


if __name__ == "__main__":
    main()
