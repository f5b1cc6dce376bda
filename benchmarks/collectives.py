"""tilecast's all-reduce against published nccl-tests runs on 8-GPU NVSwitch nodes.

    python benchmarks/collectives.py

Prints, per message size, the bus bandwidth (GB/s) of ``all_reduce_perf`` in published runs
and tilecast's (``collective_cost`` on the cluster preset, 8 ranks in one node:
busbw = 2 (n-1)/n x bytes / time, nccl-tests' own definition), and their ratio. Nothing
in tilecast is fitted to these numbers; they show where its alpha-beta model holds (the
peak, small messages) and where it does not (mid-size messages, which reach half of their
peak only near 16-32 MB in every run below).

Sources (out-of-place busbw unless marked; sizes in MiB):
- A100 SXM4 40GB: AFDWang/Hetu-Galvatron, tests/profiler/test_hardware_profile.py (a pasted
  all_reduce_perf run on a DGX A100-like node).
- A100 SXM4 80GB: Azure/AI-benchmarking-guide, Azure_Results/ND_A100_v4_results.md
  (NCCL 2.18.5, in-place).
- H100 80GB HBM3: Azure/AI-benchmarking-guide, ND_H100_v5_results.md (NCCL 2.18.5, NVLink
  SHARP all-reduce, in-place), compared with the ring model tilecast uses.
"""

from __future__ import annotations

from tilecast.parallel import collective_cost, load_cluster
from tilecast.parallel.collectives import Span

MIB = 2**20
RANKS = 8
PUBLISHED = {  # preset -> (run, {MiB: busbw GB/s})
    "dgx-a100-320gb": ("A100-SXM4-40GB, Hetu-Galvatron", {
        1: 23.29, 4: 55.97, 16: 99.99, 32: 141.27, 64: 178.69, 128: 186.91, 512: 202.00,
        1024: 230.84}),
    "dgx-a100": ("A100-SXM4-80GB, Azure ND A100 v4", {
        1: 36.22, 4: 71.43, 16: 109.22, 32: 132.77, 64: 166.63, 128: 174.18, 512: 221.58,
        1024: 228.10, 8192: 231.58}),
    "dgx-h100": ("H100 80GB HBM3, Azure ND H100 v5 (NVLS)", {
        1: 43.70, 4: 128.73, 16: 234.45, 32: 295.53, 64: 361.78, 128: 400.61, 512: 438.46,
        1024: 466.35, 8192: 478.87}),
}


def tilecast_busbw(preset: str, nbytes: float) -> tuple[float, str]:
    c = collective_cost("all-reduce", nbytes, Span(RANKS, RANKS), load_cluster(preset))
    return 2 * (RANKS - 1) / RANKS * nbytes / (c.latency_ms * 1e-3) / 1e9, c.algorithm


def main() -> None:
    for preset, (run, curve) in PUBLISHED.items():
        print(f"{preset} ({run}), {RANKS} ranks: bus bandwidth GB/s")
        print(f"  {'MiB':>6} {'published':>10} {'tilecast':>9} {'ratio':>6}  algorithm")
        for mib, measured in curve.items():
            ours, algo = tilecast_busbw(preset, mib * MIB)
            print(f"  {mib:>6} {measured:>10.1f} {ours:>9.1f} {ours / measured:>6.2f}  {algo}")
        print()


if __name__ == "__main__":
    main()
