"""Run Megatron-LM's pretrain_gpt.py, unchanged, against a pip-installed megatron-core.

    MEGATRON_LM=/path/to/Megatron-LM torchrun ... tools/run_pretrain_gpt.py --mock-data ...
    autotune ... --backend megatron-lm --megatron-lm tools/run_pretrain_gpt.py   (same env var)

For Megatron-LM's training code (pretrain_gpt.py, megatron/training, ...) on top of the
megatron-core wheel, or on a machine without a CUDA toolkit. The checkout goes first on
sys.path, so a full checkout's own megatron/core is the one imported; without one, the wheel's.
pretrain_gpt.py's start-up (megatron/training/initialize.py,
_compile_dependencies) takes two build steps from a source checkout; this replaces them and
then runs pretrain_gpt.py as __main__:

1. megatron.core.datasets.utils.compile_helpers runs `make` in the installed
   megatron/core/datasets; the wheel ships the helpers prebuilt and no Makefile, so make fails
   and Megatron exits. Skipped when the prebuilt helpers_cpp imports.
2. megatron.legacy.fused_kernels.load only runs `$CUDA_HOME/bin/nvcc -V` at core_v0.16.1 (it
   builds nothing); without a CUDA toolkit it raises. Replaced by a no-op.

Used for results/benchmarks/2026-11-21-h100-megatron-lm.md. MEGATRON_LM defaults to this
file's folder, so a copy placed beside pretrain_gpt.py needs no variable.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any


def _checkout() -> str:
    path = os.environ.get("MEGATRON_LM") or os.path.dirname(os.path.abspath(__file__))
    if not os.path.isfile(os.path.join(path, "pretrain_gpt.py")):
        sys.exit(f"run_pretrain_gpt: no pretrain_gpt.py in {path} (set MEGATRON_LM to a "
                 "Megatron-LM checkout)")
    return path


def _patch_build_steps() -> None:
    import megatron.core.datasets.utils as dataset_utils
    from megatron.legacy import fused_kernels

    make_helpers = dataset_utils.compile_helpers

    def compile_helpers() -> None:
        try:
            from megatron.core.datasets import helpers_cpp  # noqa: F401  prebuilt in the wheel
        except ImportError:
            make_helpers()
            return
        print("> run_pretrain_gpt: dataset helpers are prebuilt; make skipped", flush=True)

    def load(args: Any) -> None:
        print("> run_pretrain_gpt: fused_kernels.load (nvcc -V only) skipped", flush=True)

    dataset_utils.compile_helpers = compile_helpers
    fused_kernels.load = load


def main() -> None:
    checkout = _checkout()
    sys.path.insert(0, checkout)
    _patch_build_steps()
    script = os.path.join(checkout, "pretrain_gpt.py")
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
