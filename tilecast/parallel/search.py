"""``--parallel auto``: every (dp, tp, pp, cp, ep, microbatches) for a GPU count and global batch,
ranked by step time, keeping the layouts that fit in memory. Unless the recomputation is
given, each layout takes the least of none, selective and full that fits, as an engineer
short of memory would."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import product

from ..errors import TilecastError
from .forecast import ParallelForecast
from .layout import RECOMPUTE, Layout


def candidate_layouts(gpus: int, global_batch: int, microbatch: int, experts: int = 0,
                      sequence: int = 0, cp_comms: tuple[str, ...] = ("ring",), **options
                      ) -> list[Layout]:
    """Layouts with dp * tp * pp * cp == gpus whose microbatch count M = global / (dp * mb)
    is a whole number (the graph's batch is the microbatch); context parallelism where cp
    splits the ``sequence`` into 2 x cp chunks, with each of ``cp_comms``; for a model with
    ``experts`` per MoE layer, every expert-parallel degree dividing both dp and the
    experts."""
    out = []
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    for tp, pp, cp in product(divisors, repeat=3):
        if gpus % (tp * pp * cp) or (cp > 1 and (not sequence or sequence % (2 * cp))):
            continue
        dp = gpus // (tp * pp * cp)
        if global_batch % (dp * microbatch):
            continue
        out.extend(Layout(dp=dp, tp=tp, pp=pp, cp=cp, cp_comm=comm, ep=ep,
                          microbatches=global_batch // (dp * microbatch), **options)
                   for comm in (cp_comms if cp > 1 else ("ring",))
                   for ep in range(1, dp + 1)
                   if dp % ep == 0 and (ep == 1 or (experts and experts % ep == 0)))
    return out


def _least_recompute(run: Callable[[Layout], ParallelForecast], layout: Layout
                     ) -> ParallelForecast:
    """The layout with the least recomputation that fits (none if none fits)."""
    first = run(layout)
    for mode in RECOMPUTE[1:]:
        if first.fits:
            break
        f = run(replace(layout, recompute=mode))
        if f.fits:
            return f
    return first


def search(run: Callable[[Layout], ParallelForecast], gpus: int, global_batch: int,
           microbatch: int, *, recompute: str | None = None, experts: int = 0,
           sequence: int = 0, cp_comms: tuple[str, ...] = ("ring",), **options,
           ) -> list[ParallelForecast]:
    """Forecast every candidate ``run`` accepts (layouts the model cannot take, e.g. tp not
    dividing the heads, are skipped); fitting layouts first, each group by step time.
    ``recompute=None`` (or left out): each layout with the least recomputation that fits."""
    if recompute is not None:
        options["recompute"] = recompute
    found = []
    for layout in candidate_layouts(gpus, global_batch, microbatch, experts, sequence,
                                    cp_comms, **options):
        try:
            found.append(_least_recompute(run, layout) if recompute is None else run(layout))
        except TilecastError:
            continue
    if not found:
        raise TilecastError(f"no layout of {gpus} GPUs fits a global batch of {global_batch} "
                            f"with microbatch {microbatch}")
    return sorted(found, key=lambda f: (not f.fits, f.step_ms))
