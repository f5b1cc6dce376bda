"""Distributed training forecasts: data, tensor, pipeline, context and expert parallelism
with collectives."""

from __future__ import annotations

from .api import analyze_parallel
from .cluster import Cluster, Link, cluster_for_device, list_clusters, load_cluster
from .collectives import CollectiveCost, Span, collective_cost, group_span
from .forecast import CollectiveForecast, Memory, ParallelForecast, RankForecast
from .layout import Layout, parse_layout
from .run import TrainingRun, parse_tokens, plan_run
from .search import search

__all__ = [
    "analyze_parallel", "Cluster", "Link", "load_cluster", "list_clusters",
    "cluster_for_device", "collective_cost", "group_span", "Span", "CollectiveCost",
    "Layout", "parse_layout", "ParallelForecast", "RankForecast", "CollectiveForecast",
    "Memory", "search", "TrainingRun", "plan_run", "parse_tokens",
]
