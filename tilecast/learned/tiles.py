"""Tiles (thread blocks) of the kernels tilecast models, and how they are chosen.

Matmul: cuBLAS picks an output tile (``tm x tn``) per shape with heuristics that differ by GPU
generation. The tile table (``artifacts/tile_table.json``) holds, per sgemm kernel family (the
prefix of the kernel names: maxwell, volta, ampere), a small decision tree learned from the tiles
the measurements record, on scale-free features (log2 dims, tiles per SM). A GPU whose
generation has no measurements uses the nearest older generation's family (``ARCH_FAMILY``).

Row and elementwise kernels: PyTorch's native CUDA kernels fix their block shape from the
problem (not the GPU), so a closed-form rule replaces the table (``row_tiles.py``).

Serving needs only numpy: the trees are evaluated vectorized from their JSON arrays.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PredictorError

TILE_TABLE_PATH = Path(__file__).parent / "artifacts" / "tile_table.json"
# 2: split-K trees ("<family>/<layout>/split"); 3: each tree records the range of tree inputs
# it was fit on (``TileTree.x_lo`` / ``x_hi``). A schema-2 table still loads, without ranges.
TILE_TABLE_SCHEMA = 3
_READABLE_SCHEMAS = (2, 3)
REGENERATE = (
    "tilecast train --data ../shared/datasets/neusight-asplos25 -o tilecast/learned/artifacts")

# GPU generation -> the cuBLAS fp32 SIMT kernel family it runs. Ada and Hopper have no fp32
# measurements here; they take the newest older family (Ampere), which CUDA 12's cuBLAS also
# ships for them. Pascal's sgemm kernels carry the "maxwell" prefix.
ARCH_FAMILY = {"maxwell": "maxwell", "pascal": "maxwell", "volta": "volta", "turing": "volta",
               "ampere": "ampere", "ada": "ampere", "hopper": "ampere", "blackwell": "ampere",
               # AMD: rocBLAS / hipBLASLt Tensile kernels (``Cijk_..._MT64x64x16_...``)
               "cdna1": "cdna", "cdna2": "cdna", "cdna3": "cdna"}
# The kernel families of each vendor, oldest first (``TileTable.tree_for``'s fallback).
GENERATIONS = (("maxwell", "volta", "ampere"), ("cdna",))
_TILE_RE = re.compile(r"(?:tilesize|MT|gemm_|scudnn_(?:winograd_)?)(\d+)x(\d+)")
_FAMILY_RE = re.compile(r"(maxwell|volta|turing|ampere|ada|hopper)_")
TREE_FEATURES = ("log2_b", "log2_m", "log2_n", "log2_k", "log2_sms", "log2_tiles128_per_sm")


def parse_tile(kernel_name: str) -> tuple[int, int] | None:
    """(tm, tn) of a GEMM-like kernel name, e.g. ``ampere_sgemm_128x64_nn`` -> (128, 64)."""
    match = _TILE_RE.search(kernel_name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def kernel_family(kernel_name: str) -> str | None:
    """The sgemm family prefix of a kernel name (``volta_sgemm_64x64_nn`` -> ``volta``)."""
    match = _FAMILY_RE.search(kernel_name)
    return match.group(1) if match else None


def tree_features(b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray,
                  sm_count: np.ndarray) -> np.ndarray:
    """Scale-free inputs of the tile trees, shape (n, len(TREE_FEATURES))."""
    b, m, n, k, sms = (np.maximum(np.asarray(a, dtype=np.float64), 1.0)
                       for a in (b, m, n, k, sm_count))
    tiles128 = b * np.ceil(m / 128) * np.ceil(n / 128)
    return np.stack([np.log2(b), np.log2(m), np.log2(n), np.log2(k), np.log2(sms),
                     np.log2(tiles128 / sms)], axis=1)


@dataclass(frozen=True)
class TileTree:
    """A fitted decision tree as arrays; leaves hold an index into ``tiles``."""

    feature: np.ndarray  # int, -1 at leaves
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf_tile: np.ndarray  # int index into tiles (valid at leaves)
    tiles: tuple[str, ...]
    # Smallest and largest value of each tree input over the rows it was fit on (None in a
    # schema-2 table): outside them a leaf's pick is a guess, not something that ran.
    x_lo: np.ndarray | None = None
    x_hi: np.ndarray | None = None

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Tile strings for each row of ``x``."""
        return np.asarray(self.tiles, dtype=object)[self.leaves(x)]

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """Index into ``tiles`` for each row of ``x`` (vectorized walk, one step per depth
        level)."""
        node = np.zeros(len(x), dtype=np.int64)
        for _ in range(64):
            feat = self.feature[node]
            inner = feat >= 0
            if not inner.any():
                break
            idx = np.nonzero(inner)[0]
            go_left = x[idx, feat[idx]] <= self.threshold[node[idx]]
            node[idx] = np.where(go_left, self.left[node[idx]], self.right[node[idx]])
        return self.leaf_tile[node]

    def to_json(self) -> dict:
        return {"feature": self.feature.tolist(), "threshold": self.threshold.tolist(),
                "left": self.left.tolist(), "right": self.right.tolist(),
                "leaf_tile": self.leaf_tile.tolist(), "tiles": list(self.tiles),
                **({} if self.x_lo is None or self.x_hi is None else
                   {"x_lo": self.x_lo.tolist(), "x_hi": self.x_hi.tolist()})}

    @staticmethod
    def from_json(d: dict) -> TileTree:
        return TileTree(np.asarray(d["feature"], dtype=np.int64),
                        np.asarray(d["threshold"], dtype=np.float64),
                        np.asarray(d["left"], dtype=np.int64),
                        np.asarray(d["right"], dtype=np.int64),
                        np.asarray(d["leaf_tile"], dtype=np.int64), tuple(d["tiles"]),
                        *(np.asarray(d[key], dtype=np.float64).reshape(len(TREE_FEATURES))
                          if key in d else None for key in ("x_lo", "x_hi")))


SPLIT = "split"  # suffix of the split-K trees' keys
# Doublings of a matmul's batch dimension whose tree picks are candidates (``candidates``): 2^30
# rows or batches lie beyond every threshold the trees learned, so the ladder reaches the pick
# that holds for all larger problems.
BATCH_LADDER = 30
# Tree inputs that grow with the batch dimension; past their largest threshold the picks hold.
GROWING_FEATURES = ("log2_b", "log2_m", "log2_tiles128_per_sm")


@dataclass(frozen=True)
class TileTable:
    """Per (kernel family, layout) trees; layout "nn" = batched matmul, "tn" = linear.

    ``"<family>/<layout>"`` picks the output tile, ``"<family>/<layout>/split"`` the split-K
    count (grid z slices of the reduction), both learned from what the measured GPUs ran.
    """

    trees: dict[str, TileTree]
    observed: dict[str, dict[str, int]]  # "<device>/<op>" -> tile -> count (for reports)

    def tree_for(self, arch: str, layout: str, what: str = "") -> TileTree:
        suffix = f"/{what}" if what else ""
        family = ARCH_FAMILY.get(arch, GENERATIONS[0][-1])
        chain = next((g for g in GENERATIONS if family in g), GENERATIONS[0])
        # A family with no measurements: the newest measured one of its vendor not newer
        # than it, else its vendor's oldest measured, else any (a table of another vendor).
        older = chain[:chain.index(family) + 1] if family in chain else chain
        for fam in (*reversed(older), *chain, *sorted(k.split("/")[0] for k in self.trees)):
            key = f"{fam}/{layout}{suffix}"
            if key in self.trees:
                return self.trees[key]
        raise PredictorError(f"the tile table has no {layout}{suffix} tree")

    def select(self, arch: str, layout: np.ndarray, x: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray]:
        """(tile strings, split-K counts) for one device's kernels; ``layout`` per row."""
        tile, split, tiles, splits = self._select_ids(arch, layout == "nn", layout == "tn", x)
        return tiles[tile], splits[split]

    def _select_ids(self, arch: str, nn: np.ndarray, tn: np.ndarray, x: np.ndarray,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``select`` as indices, the layouts as masks: (tile index, split index, tile
        strings, split counts)."""
        tile, split = np.zeros(len(x), dtype=np.int64), np.zeros(len(x), dtype=np.int64)
        tiles: list[str] = []
        splits: list[str] = []
        for lay, mask in (("nn", nn), ("tn", tn)):
            if mask.any():
                tree, split_tree = self.tree_for(arch, lay), self.tree_for(arch, lay, SPLIT)
                tile[mask] = tree.leaves(x[mask]) + len(tiles)
                split[mask] = split_tree.leaves(x[mask]) + len(splits)
                tiles += tree.tiles
                splits += split_tree.tiles
        return (tile, split, np.asarray(tiles, dtype=object),
                np.asarray(splits or ["1"], dtype=np.float64))

    def below_evidence(self, arch: str, layout: np.ndarray, b: np.ndarray,
                       m: np.ndarray) -> np.ndarray:
        """Rows whose batch dimension (a batched product's batch, a linear layer's rows) lies
        below every shape the arch family's tile tree was fit on. There the tree's pick is
        its leftmost leaf's, learned from larger problems: a guess. The AMD linears measured
        start at 512 rows, so a 64-row fp32 GEMM on an MI100 was costed on a 128 x 160 tile
        without a split, 7 tiles for 120 CUs walking a reduction of 16,384."""
        out = np.zeros(len(layout), dtype=bool)
        for lay, feature, dim in (("nn", "log2_b", b), ("tn", "log2_m", m)):
            mask = layout == lay
            lo = self.tree_for(arch, lay).x_lo if mask.any() else None
            if lo is not None:
                log_dim = np.log2(np.maximum(np.asarray(dim, dtype=np.float64)[mask], 1.0))
                out[mask] = log_dim < lo[TREE_FEATURES.index(feature)]
        return out

    def candidates(self, arch: str, layout: np.ndarray, b: np.ndarray, m: np.ndarray,
                   n: np.ndarray, k: np.ndarray, sms: np.ndarray,
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, tile, split) of the configurations the trees pick for each row's shape with
        its batch dimension (the rows of a linear layer, the batch of a batched product)
        doubled 0, 1, ..., ``BATCH_LADDER`` times and its reduction halved 0, 1, ... times,
        each ladder until past every threshold the arch's trees learned on it; each
        configuration once per row, the row's own pick first.

        Any configuration runs any shape, so the forecast takes the fastest of them
        (``OnnxPredictor``). Those for a larger batch keep it from falling when the batch
        grows, as it could where the trees switch tiles: the larger batch's candidates are
        among the smaller one's. Those for a shorter reduction keep a tile switch on K from
        outweighing the reduction itself: the Ampere trees switch Linears of 32,768+ input
        features to 128 x 32 without split-K, which the L4 costs 2.3x the 128 x 64 it has at
        31,744 (docs/predictor.md, "The reduction ladder")."""
        batched = layout == "nn"
        trees = [self.tree_for(arch, lay, what) for lay in set(layout.tolist())
                 for what in ("", SPLIT)]
        top = _threshold(trees, GROWING_FEATURES, max)
        up = _batch_rungs(batched, b, m, n, k, sms, top)
        # A lone product in the batched layout (a Gemm whose B is stored k x n) grows along
        # its rows when the model's batch grows: it ladders along both, so the candidates of
        # twice the rows (or of a batch of two) are among its own.
        up_m = np.where(batched & (b == 1),
                        _batch_rungs(np.zeros_like(batched), b, m, n, k, sms, top), 0)
        down = _reduction_rungs(k, _threshold(trees, ("log2_k",), min))
        row, j, jm, i = _rungs(up, up_m, down)
        x = _rung_features(batched[row], b[row], m[row] * 2.0**jm, n[row], k[row], sms[row],
                           j, i)
        tile, split, tiles, splits = self._select_ids(arch, batched[row],
                                                      (layout == "tn")[row], x)
        split_v = splits[split]
        guessed = self.below_evidence(arch, layout, b, m)[row]
        if guessed.any():  # each guessed rung also with the split that fills one wave
            rung_b, rung_m = x[guessed, 0], x[guessed, 1]
            fill = filling_split(2.0**rung_b, 2.0**rung_m, n[row[guessed]], k[row[guessed]],
                                 sms[row[guessed]], tiles[tile[guessed]])
            row = np.concatenate([row, row[guessed]])
            tile = np.concatenate([tile, tile[guessed]])
            split_v = np.concatenate([split_v, fill])
        # each configuration once per row, where first met (np.unique sorts its keys)
        values, code = np.unique(split_v, return_inverse=True)
        key = (row * len(tiles) + tile) * len(values) + code.reshape(-1)
        first = np.sort(np.unique(key, return_index=True)[1])
        return row[first], tiles[tile[first]], split_v[first]

    def growing_picks(self, arch: str, layout: str, b: np.ndarray, m: np.ndarray,
                      n: np.ndarray, k: np.ndarray, sms: np.ndarray,
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(row, tile) of the tree's picks for each row's shape with its output columns ``n``
        doubled 0, 1, ... times, until past every threshold the tree learned on ``log2_n``
        and ``log2_tiles128_per_sm`` (the picks hold from there up); each tile once per row.

        For a product whose ``n`` grows with the batch (the nonfused Winograd's transformed
        tiles): a doubled batch's picks are among the smaller one's, so the fastest of them
        never falls when the batch grows, as ``candidates`` keeps it for the batch ladder."""
        tree = self.tree_for(arch, layout)
        top = _threshold([tree], ("log2_n", "log2_tiles128_per_sm"), max)
        rows, picks = [], []
        open_ = np.ones(len(b), dtype=bool)
        for j in range(BATCH_LADDER + 1):
            x = tree_features(b, m, n * 2.0**j, k, sms)
            idx = np.nonzero(open_)[0]
            rows.append(idx)
            picks.append(tree.leaves(x[idx]))
            open_ &= ~((x[:, TREE_FEATURES.index("log2_n")] > top)
                       & (x[:, TREE_FEATURES.index("log2_tiles128_per_sm")] > top))
            if not open_.any():
                break
        row, pick = np.concatenate(rows), np.concatenate(picks)
        first = np.sort(np.unique(row * len(tree.tiles) + pick, return_index=True)[1])
        return row[first], np.asarray(tree.tiles, dtype=object)[pick[first]]

    def to_json(self) -> dict:
        return {"schema": TILE_TABLE_SCHEMA, "regenerate": REGENERATE,
                "tree_features": list(TREE_FEATURES), "arch_family": ARCH_FAMILY,
                "trees": {k: t.to_json() for k, t in sorted(self.trees.items())},
                "observed": self.observed}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")


# The shortest reduction slice a split-K launch in the shared data runs (56-64 on every NVIDIA
# GPU; medians 1,000-1,800): ``filling_split`` never cuts a reduction finer.
MIN_SLICE = 64


def filling_split(b: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, sms: np.ndarray,
                  tile: np.ndarray) -> np.ndarray:
    """The fewest reduction slices that give every SM a block (``b ceil(n / tm) ceil(m / tn)``
    tiles times the split), in slices of at least ``MIN_SLICE``. Where cuBLAS splits a
    reduction in the shared data, the launch holds at least one block per SM on 90 % of the
    rows (tiles x split / SMs: 10th percentile 1.0 on the A100 PCIe 40GB, 1.3-3.0 on the
    older four)."""
    tiles = _blocks(b, m, n, split_tiles(tile))
    most = np.maximum(np.floor(np.asarray(k, dtype=np.float64) / MIN_SLICE), 1.0)
    return np.clip(np.ceil(sms / tiles), 1.0, most)


def _rungs(up: np.ndarray, up_m: np.ndarray, down: np.ndarray,
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row, batch doublings, row doublings, reduction halvings) of every rung of every row,
    rung by rung (the batch ladders first, then the reduction ladder), rows ascending within
    a rung: so each row meets its own pick first."""
    counts = (up + 1) * (up_m + 1) * (down + 1)
    row = np.repeat(np.arange(len(up)), counts)
    local = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    n_i, n_m = (down + 1)[row], (up_m + 1)[row]
    i, jm, j = local % n_i, (local // n_i) % n_m, local // (n_i * n_m)
    order = np.lexsort((row, i, jm, j, i > 0))
    return row[order], j[order], jm[order], i[order]


def _rung_features(batched: np.ndarray, b: np.ndarray, m: np.ndarray, n: np.ndarray,
                   k: np.ndarray, sms: np.ndarray, doublings: int | np.ndarray,
                   halvings: int | np.ndarray) -> np.ndarray:
    """Tree inputs of the shapes with the batch dimension (a batched product's batch, a
    linear layer's rows) doubled and the reduction halved so many times."""
    up, down = 2.0**doublings, 2.0**halvings
    return tree_features(np.where(batched, b * up, b), np.where(batched, m, m * up), n,
                         k / down, sms)


def _threshold(trees: list[TileTree], features: tuple[str, ...], pick) -> float:
    """The largest (``pick=max``) or smallest (``min``) threshold these trees learned on
    these tree inputs; -inf / +inf when none did."""
    index = [TREE_FEATURES.index(f) for f in features]
    found = [t.threshold[np.isin(t.feature, index)] for t in trees]
    return pick((pick(f) for f in found if len(f)), default=-np.inf if pick is max else np.inf)


def _batch_rungs(batched: np.ndarray, b: np.ndarray, m: np.ndarray, n: np.ndarray,
                 k: np.ndarray, sms: np.ndarray, top: float) -> np.ndarray:
    """Per row, the doublings of its batch dimension before it lies past ``top`` on every
    tree input that grows with it (the picks hold from there up), at most ``BATCH_LADDER``."""
    rungs = np.full(len(b), BATCH_LADDER)
    open_ = np.ones(len(b), dtype=bool)
    for j in range(1, BATCH_LADDER + 1):
        x = _rung_features(batched, b, m, n, k, sms, j, 0)
        batch_dim = np.where(batched, x[:, TREE_FEATURES.index("log2_b")],
                             x[:, TREE_FEATURES.index("log2_m")])
        past = open_ & (batch_dim > top) & (x[:, TREE_FEATURES.index("log2_tiles128_per_sm")] > top)
        rungs[past] = j - 1
        open_ &= ~past
        if not open_.any():
            break
    return rungs


def _reduction_rungs(k: np.ndarray, bottom: float) -> np.ndarray:
    """Per row, the halvings of its reduction before it lies below ``bottom``, every
    threshold the trees learned on it (the picks hold from there down), or reaches 1."""
    if not np.isfinite(bottom):
        return np.zeros(len(k), dtype=np.int64)
    log_k = np.log2(np.maximum(np.asarray(k, dtype=np.float64), 1.0))
    return np.clip(np.ceil(log_k - bottom), 0, np.floor(log_k)).astype(np.int64)


def load_tile_table(path: Path | None = None) -> TileTable:
    path = path or TILE_TABLE_PATH
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PredictorError(f"cannot read the tile table {path}: {exc}") from exc
    return parse_tile_table(d, str(path))


def parse_tile_table(d: dict, origin: str) -> TileTable:
    """Validate and build a tile table from its JSON form."""
    if (d.get("schema") not in _READABLE_SCHEMAS
            or tuple(d.get("tree_features", ())) != TREE_FEATURES):
        readable = ", ".join(map(str, _READABLE_SCHEMAS))
        raise PredictorError(f"tile table {origin} has schema {d.get('schema')!r}, "
                             f"expected one of {readable}; regenerate it: {REGENERATE}")
    try:
        return TileTable({k: TileTree.from_json(v) for k, v in d["trees"].items()},
                         d.get("observed", {}))
    except (KeyError, TypeError, ValueError) as exc:
        raise PredictorError(f"tile table {origin} is malformed: {exc}") from exc


# CTA tiles of cuBLAS's tensor-core GEMMs, largest first. The shared data has no tensor-core
# kernel, so the SIMT trees cannot choose them; the names of cuBLAS's own kernels give the
# family (e.g. volta_h884gemm_256x128_ldg8_nn, turing_fp16_s1688gemm_fp16_256x128_ldg8_f2f_nn,
# ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_32x3_nn, and their 128x128 / 128x64 /
# 64x64 variants for smaller problems).
TENSOR_CORE_TILES = ((256, 128), (128, 128), (128, 64), (64, 64))


def _blocks(b: np.ndarray, m: np.ndarray, n: np.ndarray,
            tile: tuple[int, int] | tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    return b * np.ceil(n / tile[0]) * np.ceil(m / tile[1])


def _label(tile: tuple[int, int]) -> str:
    return f"{tile[0]}x{tile[1]}"


def tensor_core_tiles(b: np.ndarray, m: np.ndarray, n: np.ndarray,
                      sm_count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tile strings, split-K counts) for tensor-core GEMMs: the largest tile that still
    gives every SM a block (one full wave), else the smallest; no split-K here (a
    compute-bound GEMM of the smallest tile gets ``filling_split`` from the predictor, which
    knows the GPU's ridge point). Bigger tiles
    reuse each loaded operand byte over more multiply-adds, which tensor cores need: their
    peak is 8-16x the SIMT peak, their DRAM bandwidth the same.

    Between the two large tiles the one whose whole waves hold less work is taken (ties: the
    larger): both keep the tensor cores fed (on an A100 a 128x128 fp16 tile asks 2 x 128 x 128
    / (256 x 2 bytes) = 64 FLOP per operand byte, 32 bytes per SM clock at its 2048 FLOP per
    SM clock, under the 5120 / 108 = 47 its L2 delivers: NVIDIA A100 whitepaper), so the
    second wave decides. A 4096 x 1024 output on 108 SMs: 128 blocks of 256x128 (2 waves,
    1.19 of them used) or 256 of 128x128 (3 waves, 2.37 used), 25 % less time."""
    b, m, n, sms = (np.maximum(np.asarray(a, dtype=np.float64), 1.0) for a in (b, m, n, sm_count))
    tiles = np.full(len(b), _label(TENSOR_CORE_TILES[-1]), dtype=object)
    chosen = np.zeros(len(b), dtype=bool)
    for tile in TENSOR_CORE_TILES[:-1]:
        fits = ~chosen & (_blocks(b, m, n, tile) >= sms)
        tiles[fits] = _label(tile)
        chosen |= fits
    large, half = TENSOR_CORE_TILES[:2]
    work = {t: np.ceil(_blocks(b, m, n, t) / sms) * t[0] * t[1] for t in (large, half)}
    tiles[(tiles == _label(large)) & (work[half] < work[large])] = _label(half)
    return tiles, np.ones(len(b))


# Queries per CTA of fused attention forward kernels on matrix units (FlashAttention-2's
# block of rows for head dims up to 128 in its forward kernel; Dao, "FlashAttention-2", 2023,
# section 3.3: each thread block takes one block of queries of one head).
FUSED_ATTENTION_QUERIES = 128


def fused_attention_tiles(dv: np.ndarray) -> np.ndarray:
    """Tile strings of fused attention kernels on their equivalent GEMM (``routing``: n = the
    queries, m = the value head size): 128 queries by the whole head per CTA."""
    dv = np.maximum(np.asarray(dv, dtype=np.float64), 1.0)
    return np.array([f"{FUSED_ATTENTION_QUERIES}x{int(d)}" for d in dv], dtype=object)


# Threads per block of cuBLAS's SIMT sgemm kernels by output tile (Block x recorded with
# every kernel in the shared sweep: maxwell/volta/ampere_sgemm_*); others: 256.
SGEMM_THREADS = {(128, 128): 256, (128, 64): 128, (64, 64): 64, (128, 32): 256,
                 (32, 128): 256, (64, 32): 256, (32, 32): 128}


def sgemm_threads(tm: np.ndarray, tn: np.ndarray) -> np.ndarray:
    out = np.full(len(np.atleast_1d(tm)), 256.0)
    for (a, b), t in SGEMM_THREADS.items():
        out[(tm == a) & (tn == b)] = t
    return out


def tile_labels(tiles: np.ndarray, splits: np.ndarray) -> np.ndarray:
    """Report labels: "128x64", or "128x64/3" for a split-K launch of 3 reduction slices."""
    return np.array([t if s <= 1 else f"{t}/{int(s)}" for t, s in zip(tiles, splits,
                                                                        strict=True)],
                    dtype=object)


def parse_labels(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Report labels (``tile_labels``) -> (tile strings, split-K counts)."""
    parts = [str(t).split("/") for t in labels]
    return (np.array([p[0] for p in parts], dtype=object),
            np.array([float(p[1]) if len(p) > 1 else 1.0 for p in parts]))


def split_tiles(tiles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tile strings "TMxTN" -> (tm, tn) float arrays (each distinct string parsed once)."""
    if not len(tiles):
        return np.zeros(0), np.zeros(0)
    uniq, inverse = np.unique(np.asarray(tiles, dtype=str), return_inverse=True)
    pairs = np.array([t.split("x") for t in uniq.tolist()], dtype=np.float64).reshape(-1, 2)
    pairs = pairs[inverse.reshape(-1)]
    return pairs[:, 0], pairs[:, 1]


def _fit_tree(x: np.ndarray, labels: np.ndarray, seed: int) -> TileTree:
    """A depth-10 tree from ``x`` to ``labels`` (scikit-learn), with the range of ``x``."""
    from sklearn.tree import DecisionTreeClassifier

    names = tuple(sorted(set(labels.tolist())))
    y = np.array([names.index(t) for t in labels])
    clf = DecisionTreeClassifier(max_depth=10, min_samples_leaf=10, random_state=seed)
    clf.fit(x, y)
    t = clf.tree_
    leaf = t.value[:, 0, :].argmax(axis=1)
    return TileTree(np.where(t.children_left >= 0, t.feature, -1).astype(np.int64),
                    t.threshold.astype(np.float64), t.children_left.astype(np.int64),
                    t.children_right.astype(np.int64), clf.classes_[leaf].astype(np.int64),
                    names, x.min(axis=0), x.max(axis=0))


def fit_tile_table(kind: np.ndarray, layout: np.ndarray, x: np.ndarray, tiles: np.ndarray,
                   splits: np.ndarray, observed: dict[str, dict[str, int]],
                   seed: int = 0) -> TileTable:
    """Tile and split-K trees per (kernel family, layout) from what ran (needs scikit-learn)."""
    trees = {}
    for key in sorted({f"{a}/{b}" for a, b in zip(kind, layout, strict=True)}):
        fam, lay = key.split("/")
        mask = (kind == fam) & (layout == lay)
        trees[key] = _fit_tree(x[mask], tiles[mask], seed)
        split_labels = np.array([str(int(s)) for s in splits[mask]], dtype=object)
        trees[f"{key}/{SPLIT}"] = _fit_tree(x[mask], split_labels, seed)
    return TileTable(trees, observed)
