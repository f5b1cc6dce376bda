"""What ``tilecast analyze --parallel`` runs (kept here so cli.py stays thin)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..errors import TilecastError
from .api import analyze_parallel
from .cluster import cluster_for_device, load_cluster
from .forecast import ParallelForecast
from .layout import CP_COMM, Layout, parse_layout
from .report import render_parallel, render_ranking
from .run import parse_tokens, plan_run
from .search import search


def run_parallel(model: str, *, device: str | None, dims: Mapping[str, int], mode: str,
                 predictor: str, optimizer: str, fmt: str, parallel: str, microbatches: int,
                 cluster: str | None, gpus: int | None, global_batch: int | None,
                 layers: int | None, zero: int, sequence_parallel: bool,
                 recompute: str | None, virtual_stages: int = 1, runtime: str = "eager",
                 fusion: bool = False, overlap_grad_reduce: bool = True,
                 cp_comm: str | None = None, train_tokens: str | None = None,
                 math: str = "graph", memory_format: str = "nchw") -> str:
    """``recompute`` None: none for one layout; ``auto`` takes the least that fits.
    ``cp_comm`` None: the ring for one layout; ``auto`` tries the ring and the all-to-all.
    ``train_tokens`` (e.g. 300B): add the whole run at each layout's step (``run.py``)."""
    if mode != "training":
        raise TilecastError("--parallel forecasts a training step: add --mode training")
    if cluster is None:
        if device is None:
            raise TilecastError("--parallel needs --cluster (a preset or a JSON) or --device")
        from ..device_db import load_device

        cl = cluster_for_device(load_device(device))
    else:
        cl = load_cluster(cluster)
    options = dict(zero=zero, sequence_parallel=sequence_parallel,
                   overlap_grad_reduce=overlap_grad_reduce)
    tokens = parse_tokens(train_tokens) if train_tokens is not None else None

    def with_run(f: ParallelForecast) -> ParallelForecast:
        return f if tokens is None else replace(f, run=plan_run(f, tokens))

    def run(layout: Layout):
        return analyze_parallel(model, layout, cluster=cl, device=device, dims=dims,
                                predictor=predictor, optimizer=optimizer, layers=layers,
                                runtime=runtime, fusion=fusion, math=math,
                                memory_format=memory_format)

    if parallel.strip().lower() == "auto":
        if gpus is None:
            raise TilecastError("--parallel auto needs --gpus N")
        probe = run(Layout())
        batch = global_batch or gpus * probe.microbatch
        comms = (cp_comm,) if cp_comm else CP_COMM
        found = search(run, gpus, batch, probe.microbatch, recompute=recompute,
                       experts=probe.experts, sequence=probe.sequence, cp_comms=comms,
                       **options)
        return render_ranking([with_run(f) for f in found], fmt)
    layout = parse_layout(parallel, microbatches=microbatches, virtual_stages=virtual_stages,
                          recompute=recompute or "none", cp_comm=cp_comm or "ring", **options)
    return render_parallel(with_run(run(layout)), fmt)
