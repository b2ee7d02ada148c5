"""What a search chooses: the parallel layout (Layout: its dimension table and Megatron's
rules, with the levers' fields) and the legend of its label.
"""

from __future__ import annotations

__all__: list[str] = []
