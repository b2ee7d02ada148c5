"""What a search is given: the model (ModelSpec, the presets, Hugging Face configs,
parameter and FLOP counts) and the hardware (the GPU table, cluster files).
"""

from __future__ import annotations

__all__: list[str] = []
