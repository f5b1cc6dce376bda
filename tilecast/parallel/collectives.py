"""Alpha-beta costs of the NCCL/RCCL collectives on a cluster's links.

Per collective: ``base + steps * alpha + factor * bytes / bandwidth`` where ``alpha`` is the
link's per-hop latency, ``bandwidth`` the bus bandwidth NCCL sustains on it (its GB/s per GPU
per direction times the link's measured ``busbw_fraction``) and ``factor`` the bus
bandwidth factor of the algorithm (Thakur, Rabenseifner, Gropp, "Optimization of Collective
Communication Operations in MPICH", IJHPCA 2005; NCCL's own performance notes,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):

- ring all-reduce: 2(n-1) steps, factor 2(n-1)/n; tree all-reduce (NCCL's double binary tree,
  a reduce then a broadcast, pipelined): 2*ceil(log2 n) steps, factor 2. tilecast picks the
  cheaper of the two for the message size, as NCCL's tuner does with its own cost model.
- ring reduce-scatter and all-gather: n-1 steps, factor (n-1)/n of the full buffer.
- all-to-all: n-1 steps, factor (n-1)/n; send/recv: one step, factor 1. Across nodes, the
  share of the buffer bound for other nodes ((n-g)/n with g ranks per node) crosses the
  network while the rest moves over NVLink.

A group spanning several nodes runs hierarchically (NCCL's tree and ring both cross the
network once per node): reduce-scatter inside the node, the collective across nodes on 1/g of
the data over the per-GPU network links, all-gather inside the node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cluster import Cluster, Link

OPS = ("all-reduce", "reduce-scatter", "all-gather", "send-recv", "all-to-all")
# NCCL's fixed per-collective latency (src/graph/tuning.cc baseLat, Ring/Simple: 8.4 us).
BASE_LATENCY_US = 8.4


@dataclass(frozen=True)
class Span:
    """How a group of ``ranks`` GPUs sits on the cluster: ``per_node`` of them in each node."""

    ranks: int
    per_node: int

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / self.per_node)


@dataclass(frozen=True)
class CollectiveCost:
    latency_ms: float
    algorithm: str  # ring | tree | hierarchical | p2p | none
    link: str  # e.g. "intra-node nvswitch NVLink 3" or "inter-node infiniband ..."


def group_span(ranks: int, stride: int, gpus_per_node: int) -> Span:
    """Ranks ``stride`` apart (Megatron's order: tensor-parallel ranks adjacent, then data,
    then pipeline) fill ``gpus_per_node // stride`` slots of a node, at least one."""
    per_node = max(1, min(ranks, gpus_per_node // max(stride, 1)))
    return Span(ranks, per_node)


def _flat(op: str, nbytes: float, n: int, link: Link) -> tuple[float, str]:
    """Seconds of one collective over ``n`` ranks on one kind of link (no base latency)."""
    a, bw = link.latency_us * 1e-6, link.busbw_gbps * 1e9
    if op == "all-reduce":
        ring = 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / bw
        tree = 2 * math.ceil(math.log2(n)) * a + 2 * nbytes / bw
        return (ring, "ring") if ring <= tree else (tree, "tree")
    if op in ("reduce-scatter", "all-gather", "all-to-all"):
        return (n - 1) * a + (n - 1) / n * nbytes / bw, "ring"
    if op == "send-recv":
        return a + nbytes / bw, "p2p"
    raise ValueError(f"unknown collective {op!r}: one of {', '.join(OPS)}")


def _name(link: Link, where: str) -> str:
    return f"{where} {link.fabric} {link.generation}"


def collective_cost(op: str, nbytes: float, span: Span, cluster: Cluster) -> CollectiveCost:
    """Latency of ``op`` on a buffer of ``nbytes`` per rank (all-gather: the gathered output;
    reduce-scatter: the input) over a group placed as ``span``."""
    n = span.ranks
    if n <= 1 or nbytes <= 0:
        return CollectiveCost(0.0, "none", "local")
    base = BASE_LATENCY_US * 1e-6
    if op == "send-recv":
        link = cluster.intra if span.nodes == 1 else cluster.inter
        secs, algo = _flat(op, nbytes, 2, link)
        where = "intra-node" if span.nodes == 1 else "inter-node"
        return CollectiveCost((base + secs) * 1e3, algo, _name(link, where))
    if span.nodes == 1:
        secs, algo = _flat(op, nbytes, n, cluster.intra)
        return CollectiveCost((base + secs) * 1e3, algo, _name(cluster.intra, "intra-node"))
    if span.per_node == 1:
        secs, algo = _flat(op, nbytes, n, cluster.inter)
        return CollectiveCost((base + secs) * 1e3, algo, _name(cluster.inter, "inter-node"))
    return _hierarchical(op, nbytes, span, cluster)


def _hierarchical(op: str, nbytes: float, span: Span, cluster: Cluster) -> CollectiveCost:
    g, nodes = span.per_node, span.nodes
    base = BASE_LATENCY_US * 1e-6
    if op == "all-to-all":
        # Every rank sends 1/n of its buffer to each other rank at once: (g - 1)/n of it over
        # NVLink to its node's ranks, (n - g)/n over its own network link; the slower of the
        # two paces it, after (n - 1) network hops of latency.
        n = span.ranks
        intra = (g - 1) / n * nbytes / (cluster.intra.busbw_gbps * 1e9)
        inter = (n - g) / n * nbytes / (cluster.inter.busbw_gbps * 1e9)
        secs = (n - 1) * cluster.inter.latency_us * 1e-6 + max(intra, inter)
    else:
        intra_rs, _ = _flat("reduce-scatter", nbytes, g, cluster.intra)
        inter, _ = _flat(op, nbytes / g, nodes, cluster.inter)
        # all-reduce: intra reduce-scatter + inter all-reduce + intra all-gather;
        # reduce-scatter / all-gather: one intra pass and the inter pass.
        secs = inter + (2 * intra_rs if op == "all-reduce" else intra_rs)
    link = (f"hierarchical: {_name(cluster.intra, 'intra-node')} x{g} + "
            f"{_name(cluster.inter, 'inter-node')} x{nodes}")
    return CollectiveCost((base + secs) * 1e3, "hierarchical", link)
