"""Measure kernels on the user's own device in the shared data's CSV schema (`tilecast collect`).

Public API: ``run_collection`` (``runner.py``), the shape plan (``shapes.py``: ``default_grid``,
``read_shapes_file``, ``parse_ops``). Layers: ``shapes`` and ``timing`` import nothing of
this package; ``ops`` (torch) uses both; ``runner`` uses all three; ``cli`` parses arguments.
torch is imported only when measuring (the ``[collect]`` extra).
"""

from __future__ import annotations

from .shapes import default_grid, parse_ops, read_shapes_file

__all__ = ["default_grid", "parse_ops", "read_shapes_file", "run_collection"]


def run_collection(*args, **kwargs):
    """See ``runner.run_collection`` (imported lazily: it is only needed to measure)."""
    from .runner import run_collection as run

    return run(*args, **kwargs)
