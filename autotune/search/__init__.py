"""The search: an Optuna study over valid layouts (autotune.search.loop assembles its parts)."""

from __future__ import annotations

from autotune.search.loop import Search, SearchConfig, SearchResult, TrialRecord, run_search

__all__ = ["Search", "SearchConfig", "SearchResult", "TrialRecord", "run_search"]
