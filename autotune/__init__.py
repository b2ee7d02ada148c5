"""autotune: find the fastest Megatron parallel layout for a model on a given set of GPUs."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
