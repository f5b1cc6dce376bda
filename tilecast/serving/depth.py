"""Layers repeated from a graph exported with fewer: how often each segment's kernels run.

``parallel.structure`` cuts the graph at each layer's first projection, so segment i < L - 1
holds a whole layer (its attention and MLP, its residual add and the next layer's input
norm), while the last segment lacks the residual add and norm that follow it (they sit in the
epilogue beside the final norm and the LM head), and the first layer's input norm sits in the
prologue. Forecasting ``target`` layers from ``graph`` of them therefore runs the whole
segments (target - 1) / (graph - 1) times each and the last one once: exact for identical
layers. A one-layer graph can only repeat its one (partial) segment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Depth:
    graph: int  # transformer layers in the graph
    target: int  # transformer layers forecast

    def times(self, segment: int | str) -> float:
        """How often a kernel (or parameter) of ``segment`` runs (exists) in the forecast."""
        if not isinstance(segment, int) or self.target == self.graph:
            return 1.0
        if self.graph == 1:
            return float(self.target)
        return (self.target - 1) / (self.graph - 1) if segment < self.graph - 1 else 1.0
