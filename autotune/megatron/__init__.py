"""Translation to and from Megatron: the supported releases, Megatron-LM's flags both ways,
the megatron-core configuration a layout produces and its run identity, and a user's
launch script read (`--from-megatron`) and patched (export).
"""

from __future__ import annotations

__all__: list[str] = []
