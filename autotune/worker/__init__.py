"""The trial worker: one process per GPU under torchrun, `python -m autotune.worker`.

This is the only package that imports torch, megatron-core or transformer-engine; it does so
inside its modules, never here, so that importing `autotune.worker` costs nothing.
"""
