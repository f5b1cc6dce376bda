"""``tilecast evaluate``: forecasts against measured end-to-end latencies, beside the paper's."""

from __future__ import annotations

from .by_family import ByFamilyResult, FamilyRow, RunFamilies, evaluate_by_family
from .labels import Label, Skipped, discover_labels
from .passes import PassRun, evaluate_passes
from .published import load_published
from .runner import EvalResult, Run, Summary, evaluate

__all__ = ["Label", "Skipped", "discover_labels", "load_published", "evaluate", "EvalResult",
           "Run", "Summary", "evaluate_by_family", "ByFamilyResult", "FamilyRow", "RunFamilies",
           "PassRun", "evaluate_passes"]
