"""The search: an Optuna study over valid layouts (the only package that imports optuna)."""

from __future__ import annotations

from autotune.search.loop import SearchConfig, SearchResult, TrialRecord, run_search

__all__ = ["SearchConfig", "SearchResult", "TrialRecord", "run_search"]
