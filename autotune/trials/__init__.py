"""One trial: what passes between the search and the worker (TrialSpec, TrialMetrics,
the protocol), its launch under torchrun or srun (runner; the warm pool and the standby,
whose ranks are a rank_group; process trees, ports) and what its output says (metrics).
"""

from __future__ import annotations

__all__: list[str] = []
