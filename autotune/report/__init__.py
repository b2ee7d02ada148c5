"""Reports of finished studies: rows, Pareto fronts, plots and report.md.

Submodules are imported where used: pandas, matplotlib and plotly (the `report` extra) load
only when a report is written, so `autotune --help` and the search stay light.
"""

from __future__ import annotations

__all__: list[str] = []
