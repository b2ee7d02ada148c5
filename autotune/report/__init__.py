"""What a study shows the user: the live table while it runs (progress), and once it is done
its rows, Pareto fronts, plots, report.md and launch scripts (scripts).

Submodules are imported where used: pandas, matplotlib and plotly (the `report` extra) load
only when a report is written, so `autotune --help` and the search stay light.
"""

from __future__ import annotations

__all__: list[str] = []
