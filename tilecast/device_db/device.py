"""The :class:`Device` value: one GPU as the predictors see it. Loading lives in ``loader.py``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# dtypes whose matmuls run on matrix units (tensor cores / matrix cores) when the GPU has them.
MATRIX_DTYPES = {"tf32": "tf32", "float16": "fp16", "bfloat16": "bf16", "float8e4m3fn": "fp8",
                 "float8e5m2": "fp8", "int8": "int8", "uint8": "int8"}


# GPU generations the occupancy and tile tables know (learned/features.py, learned/tiles.py).
# "generic": an explicit "not one of these" whose defaults are documented in docs/devices.md
# (2048 threads, 32 blocks and 128 KiB L1 per SM; the newest measured cuBLAS tile family).
ARCHS = ("maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell",
         "cdna1", "cdna2", "cdna3", "generic")
GENERIC_ARCH = "generic"
# DRAM technologies (``Device.memory_type``): stacked HBM beside the die, or GDDR on the board.
MEMORY_TYPES = ("HBM2", "HBM2e", "HBM3", "HBM3e", "GDDR5", "GDDR5X", "GDDR6", "GDDR6X", "GDDR7")


@dataclass(frozen=True)
class Interconnect:
    nvlink_gbps: float | None = None  # NVLink (NVIDIA) total bidirectional GB/s
    xgmi_gbps: float | None = None  # Infinity Fabric / xGMI (AMD) GB/s
    pcie_gen: int | None = None


@dataclass(frozen=True)
class Device:
    """One GPU. Peaks are dense (no structured sparsity), at boost clock, in TFLOP/s (int8: TOP/s).

    ``peak_tflops_fp32_matrix`` is set only where fp32 GEMMs run on matrix units without a
    precision change (AMD CDNA matrix cores); NVIDIA fp32 GEMMs use the vector peak.
    """

    name: str
    vendor: str  # "nvidia" | "amd"
    arch: str  # one of ARCHS
    sm_count: int  # SMs (NVIDIA) or compute units (AMD)
    cores_per_sm: int
    boost_clock_mhz: float
    memory_gb: float
    mem_bandwidth_gbps: float
    l2_cache_mb: float
    peak_tflops_fp32: float  # vector
    launch_overhead_us: float
    peak_tflops_fp16_vector: float | None = None
    peak_tflops_fp32_matrix: float | None = None
    peak_tflops_tf32_matrix: float | None = None
    peak_tflops_fp16_matrix: float | None = None
    peak_tflops_bf16_matrix: float | None = None
    peak_tflops_fp8_matrix: float | None = None
    peak_tops_int8_matrix: float | None = None
    # Physical limits on sustained throughput (issues 10 and 17); optional so older files load.
    base_clock_mhz: float | None = None  # datasheet base (guaranteed) clock
    board_power_w: float | None = None  # TDP / total board power of this SKU
    # Share of the SM's warp-instruction issue slots that FP32 FMAs take at peak_tflops_fp32:
    # FP32 lanes / (warp width x warp instructions dispatched per clock). 1.0 = no spare slot.
    fp32_issue_share: float | None = None
    # Fraction of the dense fp16/bf16 matrix peak that large vendor-BLAS GEMMs sustain.
    matrix_sustained_fraction: float | None = None
    # Fraction of peak_tflops_fp32 that large SIMT SGEMMs (vendor BLAS) sustain: a ceiling on
    # any fp32 SIMT GEMM forecast (learned/simt.py), never a target.
    fp32_sustained_fraction: float | None = None
    # Unloaded DRAM load-to-use latency (a pointer chase past the L2), ns: what a thread waits
    # for a load that nothing else hides. Bounds kernels that keep one load per thread in
    # flight (learned/latency_walk.py); None where no published measurement covers the chip.
    dram_latency_ns: float | None = None
    # Unloaded L2 hit latency (the same pointer chase over buffers that fit the L2), ns: a
    # GEMM tile's k-step waits at least this long for its operands (learned/tensor_core.py).
    l2_latency_ns: float | None = None
    # DRAM technology from the datasheet (one of MEMORY_TYPES); not a predictor feature yet
    # (docs/devices.md).
    memory_type: str | None = None
    interconnect: Interconnect = field(default_factory=Interconnect)
    supported_dtypes: tuple[str, ...] = ("float32",)
    aliases: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    source_file: str = ""  # where it was loaded from (for reports)

    def peak_tflops(self, dtype: str, unit: str) -> float:
        """Attainable peak for a dtype on a unit ("matrix" or "vector").

        fp32 matmuls use the vector peak on NVIDIA (PyTorch's default disables TF32) and the
        fp32 matrix peak where the GPU has one (AMD CDNA). 16-bit and 8-bit matmuls use the
        matrix peak of that dtype, falling back to fp16's and then to the packed 16-bit vector
        peak (a GEMM on CUDA cores issues half2 FMAs).

        Vector-unit work (elementwise ops, reductions, softmax, norms) runs at the fp32 peak in
        every dtype: PyTorch's kernels load fp16 / bf16 values and compute in fp32
        (``at::opmath_type`` and ``acc_type`` map Half and BFloat16 to float; ATen/OpMathType.h:
        "For FP16 or BFloat16 inputs, ops should perform internal math in FP32"), so the packed
        16-bit rate is not theirs.
        """
        if unit == "matrix":
            if dtype in ("float32", "float64"):
                return self.peak_tflops_fp32_matrix or self.peak_tflops_fp32
            key = MATRIX_DTYPES.get(dtype)
            peak = {
                "tf32": self.peak_tflops_tf32_matrix, "fp16": self.peak_tflops_fp16_matrix,
                # No fallback to fp16: GPUs without bf16 units (V100, T4) run bf16 slowly.
                "bf16": self.peak_tflops_bf16_matrix,
                "fp8": self.peak_tflops_fp8_matrix or self.peak_tflops_fp16_matrix,
                "int8": self.peak_tops_int8_matrix,
            }.get(key or "")
            if peak:
                return peak
            if dtype in ("float16", "bfloat16") and self.peak_tflops_fp16_vector:
                return self.peak_tflops_fp16_vector
        return self.peak_tflops_fp32

    @property
    def hbm(self) -> bool | None:
        """Stacked HBM memory (True), board GDDR (False), or not stated (None)."""
        return None if self.memory_type is None else self.memory_type.startswith("HBM")

    @property
    def mem_bandwidth_bytes_per_s(self) -> float:
        return self.mem_bandwidth_gbps * 1e9

    @property
    def tflops_per_sm_fp32(self) -> float:
        return self.peak_tflops_fp32 / self.sm_count
