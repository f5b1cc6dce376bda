"""Load measured kernels laid out like the NeuSight ASPLOS'25 release into typed numpy columns.

Layout (any number of roots may be given; each is read the same way)::

    <root>/kernels/<vendor>/train/<op>/<GPU>.csv   training kernels, one file per op and GPU
    <root>/kernels/<vendor>/eval/<name>.csv        held-out shapes, every GPU in one file

A root may also be the ``kernels`` folder itself. The static cost of each measured kernel (FLOPs,
bytes) follows tilecast's conventions (see ``analyzer/types.py``): one FMA = 2 FLOPs, bytes =
unique DRAM bytes read + written once per tensor at the dtype's size, so the features computed
here are the ones serving computes from an analyzer ``Kernel``.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..analyzer.types import DTYPE_SIZE
from ..errors import ConfigError
from .tiles import parse_tile

# Op of the CSV -> (family, tensor operands moved per output element, FLOPs per element).
# Operands: "u" ops have one scalar operand, so they read one tensor and write one (2); binary
# tensor ops read two and write one (3). FLOPs per element are the analyzer's (costs/*.py):
# Pow 3 (exp(y log x)), erf Gelu 5, the rest 1.
ELEMENTWISE_OPS: dict[str, tuple[int, float]] = {
    "add": (3, 1), "addu": (2, 1), "mul": (3, 1), "mulu": (2, 1), "div": (3, 1),
    "divu": (2, 1), "pow": (3, 3), "powu": (2, 3), "relu": (2, 1), "gelu": (2, 5),
    "tanh": (2, 1), "silu": (2, 4),  # x sigmoid(x): sigmoid 3 (costs/elementwise.py), mul 1
}
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide
LAYERNORM_FLOPS_PER_ELEMENT = 8  # mean 1, variance 3, normalize 2, affine 2
RMSNORM_FLOPS_PER_ELEMENT = 4  # sum of squares 2, multiply by 1/rms 1, gain 1
# ``mmtn`` (tilecast collect): a linear's weight gradient dY^T X, costed as the analyzer's dB.
# ``rms``: RMS norm, a layer-norm kernel without the mean and the shift.
FAMILY_OF_OP = {"bmm": "matmul", "linear": "matmul", "mmtn": "matmul", "softmax": "softmax",
                "ln": "layernorm", "rms": "layernorm",
                **{op: "elementwise" for op in ELEMENTWISE_OPS}}
# eval/<file>.csv -> the op family it holds (elem.csv mixes elementwise ops, named per row).
EVAL_FILES = ("bmm", "linear", "elem", "softmax", "ln")


@dataclass(frozen=True)
class KernelSamples:
    """Measured kernels as parallel numpy columns (one row per measured kernel).

    Dims that do not apply to a row's family are 0 (e.g. ``rows`` of a matmul).
    """

    op: np.ndarray  # str: CSV OPName (bmm, linear, add, softmax, ln, ...)
    family: np.ndarray  # str: matmul | elementwise | softmax | layernorm
    device: np.ndarray  # str: the CSV's Device column, e.g. "NVIDIA L4"
    split: np.ndarray  # str: train | eval
    latency_ms: np.ndarray  # float64
    b: np.ndarray  # int64 matmul batch
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    rows: np.ndarray  # int64 row kernels: rows x cols
    cols: np.ndarray
    elements: np.ndarray  # int64 output elements
    flops: np.ndarray  # float64
    bytes: np.ndarray  # float64
    dtype: np.ndarray  # str: ONNX dtype name ("float32"; a "Dtype" column overrides)
    itemsize: np.ndarray  # float64 bytes per element of the dtype (4: float32)
    kernel_name: np.ndarray  # str: the launched kernel (carries the cuBLAS tile)
    grid: np.ndarray  # int64 thread blocks launched (grid x*y*z)
    block_threads: np.ndarray  # int64 threads per block
    split_k: np.ndarray  # int64 reduction slices cuBLAS launched (1 elsewhere)

    def __len__(self) -> int:
        return len(self.latency_ms)

    def select(self, mask: np.ndarray) -> KernelSamples:
        return KernelSamples(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def concat(parts: Sequence[KernelSamples]) -> KernelSamples:
        return KernelSamples(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                                for f in fields(KernelSamples)})


def _int(row: dict[str, str], key: str) -> int:
    value = row.get(key)
    return int(float(value)) if value not in (None, "") else 0


def matmul_dims_of_row(r: dict[str, str]) -> tuple[int, int, int, int]:
    """tilecast's (b, m, n, k) of a bmm / linear row: THE one place the CSV convention is read.

    The NeuSight CSVs' ``B, M, N, K`` mean ``(B x M x N) @ (B x N x K)``: N is the reduction
    and the output is M x K (linear: ``Linear(N -> K)`` on M rows). tilecast's ``MatmulDims``
    is (m x k) @ (k x n), so m = M, n = K (output columns), k = N (reduction). The recorded
    launch grids are the evidence: ``Grid x = ceil(K / tile rows)`` and ``Grid y = ceil(M /
    tile cols)`` on >= 99 % of the rows whose kernel name carries a tile
    (tests/test_learned_dataset.py checks it against the data).
    """
    b, m, n_csv, k_csv = (max(_int(r, c), 1) for c in "BMNK")
    return b, m, k_csv, n_csv


# Tensile (rocBLAS / hipBLASLt) splits the reduction with GlobalSplitU: the kernel name says
# into how many slices (``..._GSU3_...``), launched along grid y, not z: y = ceil(M / MT1) x
# GSU on every AMD matmul row of the shared data (tests/test_learned_train.py).
TENSILE_GSU = re.compile(r"_GSU(\d+)")


def split_k_of_row(op: str, dims: tuple[int, int, int, int], r: dict[str, str]) -> int:
    """Slices of the reduction of a matmul row with tilecast's (b, m, n, k).

    Tensile names its GlobalSplitU (``_GSU3_``). cuBLAS launches split-K slices along grid
    z: a linear's grid z is its split count, a bmm's is its batch times the split. But a
    launch with exactly one block per tile of the name (b ceil(n / tm) ceil(m / tn) blocks)
    has no room for a split, whatever its z: the P4's ``sgemm_128x128x8_NT_vec`` lays its
    tiles over a 3-D grid (M = 1024, N = 2560: 160 tiles on 4 x 10 x 4), and so do 31
    ``sgemm_32x32x32_NN`` batched launches on the P100 and P4.
    """
    name = r.get("Kernel Name") or ""
    gsu = TENSILE_GSU.search(name)
    if gsu:
        return max(int(gsu.group(1)), 1)
    b, m, n, _ = dims
    tile = parse_tile(name)
    grid = math.prod(max(_int(r, f"Grid {axis}"), 1) for axis in "xyz")
    if tile and grid == b * -(-n // tile[0]) * -(-m // tile[1]):
        return 1
    z = max(_int(r, "Grid z"), 1)
    if op == "linear":
        return z
    return z // b if z % b == 0 and z >= b else 1


def _costs(op: str, r: dict[str, str]) -> tuple[int, ...]:
    """(b, m, n, k, rows, cols, elements) of one CSV row."""
    if FAMILY_OF_OP[op] == "matmul":
        b, m, n, k = matmul_dims_of_row(r)
        return b, m, n, k, 0, 0, b * m * n
    rows, cols = max(_int(r, "B"), 1), max(_int(r, "H"), 1)
    return 0, 0, 0, 0, rows, cols, rows * cols


def _flops_bytes(op: str, dims: tuple[int, ...], itemsize: float) -> tuple[float, float]:
    b, m, n, k, rows, cols, elements = dims
    if op in ("bmm", "mmtn"):
        return 2.0 * b * m * n * k, itemsize * b * (m * k + k * n + m * n)
    if op == "linear":  # y = x W^T + bias: x (m, k), W (n, k), bias (n), y (m, n)
        return 2.0 * m * n * k + m * n, itemsize * (m * k + n * k + m * n + n)
    if op == "softmax":
        return SOFTMAX_FLOPS_PER_ELEMENT * elements, itemsize * 2.0 * elements
    if op == "ln":  # x in, y out, gamma and beta
        return LAYERNORM_FLOPS_PER_ELEMENT * elements, itemsize * (2.0 * elements + 2 * cols)
    if op == "rms":  # x in, y out, the gain
        return RMSNORM_FLOPS_PER_ELEMENT * elements, itemsize * (2.0 * elements + cols)
    operands, flops = ELEMENTWISE_OPS[op]
    return flops * elements, itemsize * operands * elements


def read_csv(path: Path, split: str) -> KernelSamples | None:
    """One CSV file -> samples (rows of ops tilecast does not model are skipped)."""
    cols: dict[str, list] = {f.name: [] for f in fields(KernelSamples)}
    with path.open(newline="") as fh:
        for line, r in enumerate(csv.DictReader(fh), start=2):  # line 1: the header
            op = (r.get("OPName") or "").strip()
            if op not in FAMILY_OF_OP:
                continue
            _check_row(path, line, r)
            dims = _costs(op, r)
            # The NeuSight release is all fp32; `tilecast collect` writes a short "dtype" column.
            raw = (r.get("Dtype") or r.get("dtype") or "float32").strip()
            dtype = COLLECT_DTYPES.get(raw, raw)
            itemsize = DTYPE_SIZE.get(dtype, 4)
            flops, nbytes = _flops_bytes(op, dims, itemsize)
            grid = max(_int(r, "Grid x"), 1) * max(_int(r, "Grid y"), 1) * max(_int(r, "Grid z"), 1)
            threads = max(_int(r, "Block x"), 1) * max(_int(r, "Block y"), 1) * max(
                _int(r, "Block z"), 1)
            cols["split_k"].append(split_k_of_row(op, dims[:4], r) if dims[0] else 1)
            for key, value in zip(("b", "m", "n", "k", "rows", "cols", "elements"), dims,
                                  strict=True):
                cols[key].append(value)
            values = (op, FAMILY_OF_OP[op], r["Device"].strip(), split, float(r["Latency"]),
                      flops, nbytes, dtype, itemsize, r.get("Kernel Name", ""), grid, threads)
            for key, value in zip(("op", "family", "device", "split", "latency_ms", "flops",
                                   "bytes", "dtype", "itemsize", "kernel_name", "grid",
                                   "block_threads"),
                                  values, strict=True):
                cols[key].append(value)
    if not cols["op"]:
        return None
    return _to_arrays(cols)


_DIM_COLUMNS = ("B", "M", "N", "K", "H", "Grid x", "Grid y", "Grid z", "Block x", "Block y",
                "Block z")


def _check_row(path: Path, line: int, r: dict[str, str | None]) -> None:
    """A row tilecast models must have a positive finite latency, a device and non-negative
    finite dims: a bad value fails naming the file and line, it is never averaged in."""
    def bad(column: str, expected: str) -> ConfigError:
        return ConfigError(f"{path}:{line}: column '{column}' must be {expected}, got "
                           f"{r.get(column)!r}")

    if not (r.get("Device") or "").strip():
        raise bad("Device", "a GPU name")
    for column in ("Latency", *_DIM_COLUMNS):
        text = r.get(column)
        if column != "Latency" and text in (None, ""):
            continue
        try:
            value = float(text)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            value = math.nan
        ok = value > 0 if column == "Latency" else value >= 0
        if not (math.isfinite(value) and ok):
            raise bad(column, "a positive number of ms" if column == "Latency"
                      else "a non-negative number")


_STR_FIELDS = ("op", "family", "device", "split", "dtype", "kernel_name")
_FLOAT_FIELDS = ("latency_ms", "flops", "bytes", "itemsize")


def _to_arrays(cols: dict[str, list]) -> KernelSamples:
    out = {}
    for name, values in cols.items():
        dtype = object if name in _STR_FIELDS else (
            np.float64 if name in _FLOAT_FIELDS else np.int64)
        out[name] = np.asarray(values, dtype=dtype)
    return KernelSamples(**out)


# `tilecast collect --dtype` names -> ONNX dtype names (tf32 stores fp32 tensors).
COLLECT_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16",
                  "bf16": "bfloat16", "fp8": "float8e4m3fn"}


def collected_devices(roots: Iterable[Path | str]) -> dict[str, Path]:
    """Devices described by ``tilecast collect`` folders (``<root>/devices/*.json`` in the
    tilecast schema), by name: their rows train, and features read these descriptions."""
    import json

    out: dict[str, Path] = {}
    for root in roots:
        for path in sorted(Path(root).glob("devices/*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(data, dict) and "name" in data and "sources" in data:
                out[data["name"]] = path
    return out


def collected_vendors(roots: Iterable[Path | str]) -> list[str]:
    """Vendor folders of collected data other than nvidia (e.g. ``cpu`` test runs)."""
    found = set()
    for root in roots:
        base = Path(root) / "kernels"
        if collected_devices([root]) and base.is_dir():
            found.update(p.name for p in base.iterdir() if p.is_dir() and p.name != "nvidia")
    return sorted(found)


# A release may hold kernels with no train/eval split of their own: AMD's has its matmul rows
# only under kernels/amd/test/<op>/<GPU>.csv. A stable hash of each shape sets
# HOLDOUT_PERCENT of those shapes aside (scored as held-out shapes, never trained on) and
# trains on the rest.
UNSPLIT = "test"
HOLDOUT_PERCENT = 30


def held_out(s: KernelSamples) -> np.ndarray:
    """True for the rows whose shape falls in the held-out part (the same shape on every GPU)."""
    keys = zip(s.op, s.b, s.m, s.n, s.k, s.rows, s.cols, strict=True)
    return np.array([zlib.crc32(",".join(map(str, key)).encode()) % 100 < HOLDOUT_PERCENT
                     for key in keys], dtype=bool)


def kernel_files(root: Path, split: str, vendor: str = "nvidia") -> list[Path]:
    """CSV files of one split under a data root (sorted, so loading is deterministic),
    plus the vendor's unsplit files (``test/<op>/<GPU>.csv``), which both splits share."""
    base = root / "kernels" if (root / "kernels").is_dir() else root
    folder = base / vendor / split
    if split == "train":
        files = sorted(folder.glob("*/*.csv"))
    else:
        files = sorted(p for p in (folder / f"{n}.csv" for n in EVAL_FILES) if p.is_file())
    return files + sorted((base / vendor / UNSPLIT).glob("*/*.csv"))


def load_kernels(roots: Iterable[Path | str], split: str = "train",
                 vendor: str = "nvidia") -> KernelSamples:
    """Every modelled kernel of ``split`` ("train" or "eval") under the given roots."""
    parts: list[KernelSamples] = []
    searched = []
    for root in roots:
        root = Path(root)
        searched.append(str(root))
        for path in kernel_files(root, split, vendor):
            part = read_csv(path, split)
            if part is not None and path.parent.parent.name == UNSPLIT:
                part = part.select(held_out(part) == (split != "train"))
            if part is not None and len(part):
                parts.append(part)
    if not parts:
        raise ConfigError(f"no {vendor} {split} kernel CSVs under {', '.join(searched)} "
                          f"(expected kernels/{vendor}/{split}/...)")
    return KernelSamples.concat(parts)


def data_hash(roots: Iterable[Path | str], split: str = "train",
              vendors: Sequence[str] = ("nvidia",)) -> str:
    """sha256 over the relative names and bytes of the CSVs a training run reads."""
    h = hashlib.sha256()
    for vendor in vendors:
        for root in roots:
            root = Path(root)
            for path in kernel_files(root, split, vendor):
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()
