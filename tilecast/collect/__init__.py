"""Measure kernels (`tilecast collect`) and whole models (`tilecast collect-labels`) on the
user's own device, in the shared data's formats.

Public API: ``run_collection`` (``runner.py``), the shape plan (``shapes.py``: ``default_grid``,
``read_shapes_file``, ``parse_ops``), ``collect_label`` (``labels.py``). Layers: ``shapes`` and
``timing`` import nothing of this package; ``ops`` (torch) uses both; ``runner`` uses all
three; ``labels`` uses ``timing`` and the exporters; ``cli`` parses arguments. torch is
imported only when measuring (the ``[collect]`` extra).
"""

from __future__ import annotations

from .shapes import default_grid, parse_ops, read_shapes_file

__all__ = ["collect_label", "default_grid", "parse_ops", "read_shapes_file", "run_collection"]


def run_collection(*args, **kwargs):
    """See ``runner.run_collection`` (imported lazily: it is only needed to measure)."""
    from .runner import run_collection as run

    return run(*args, **kwargs)


def collect_label(*args, **kwargs):
    """See ``labels.collect_label`` (imported lazily: it is only needed to measure)."""
    from .labels import collect_label as run

    return run(*args, **kwargs)
