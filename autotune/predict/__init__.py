"""The analytical models: a layout's memory and step time (cited formulas), their
calibration to measured trials, the memory gate and how far to trust a prediction.
"""

from __future__ import annotations

__all__: list[str] = []
