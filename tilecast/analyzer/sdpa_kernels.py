"""Which SDPA kernel PyTorch runs on a GPU, and the grouped-query K / V its flash kernel reads.

Hugging Face's SDPA path passes grouped-query K and V to SDPA as they are (``enable_gqa``)
when it passes no mask (``use_gqa_in_sdpa`` in transformers' sdpa_attention.py: an unpadded
batch, padding.py) and repeats them per query head otherwise (``repeat_kv``: an Unsqueeze, an
Expand and a Reshape, which is what an export holds, since tracing keeps the mask). Only
PyTorch's flash kernel takes grouped-query heads: on sm80 and later in fp16 / bf16 it reads
K and V once per KV head; elsewhere (T4, V100, fp32, AMD) the call falls back to SDPA's math
path, op by op (pytorch/pytorch#181528, huggingface/transformers#45776, measured on a T4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .analysis import NodeResult
from .epilogues import SoleReaders
from .types import TensorInfo

# GPUs PyTorch has no fused SDPA kernel for: ROCm's flash and memory-efficient attention come
# from AOTriton, built for gfx90a (CDNA2) and gfx942 (CDNA3) and later, not gfx908 (MI100,
# CDNA1: pytorch/pytorch#141958), so the call runs its math path, op by op.
NO_FUSED_SDPA = frozenset({("amd", "cdna1")})
# PyTorch's flash attention: sm80 and later, 16-bit operands (aten sdp_utils.cpp,
# check_flash_attention_hardware_support, check_tensor_dtype)
FLASH_ARCHS = frozenset({"ampere", "ada", "hopper", "blackwell"})
FLASH_DTYPES = frozenset({"float16", "bfloat16"})


@dataclass(frozen=True)
class SdpaKernels:
    """What PyTorch's SDPA kernels take on one GPU. ``fused``: any fused kernel (flash or
    memory-efficient). ``gqa_dtypes``: the dtypes its flash kernel reads grouped-query K and
    V in as they are. ``autocast``: the dtype autocast runs attention in (None: the graph's)."""

    fused: bool = True
    gqa_dtypes: frozenset[str] = frozenset()
    autocast: str | None = None

    def reads_gqa(self, dtype: str) -> bool:
        return (self.autocast or dtype) in self.gqa_dtypes


ANY_GPU = SdpaKernels()  # fused kernels, no grouped-query reads: the default


def pytorch_sdpa(vendor: str, arch: str, autocast: str | None = None) -> SdpaKernels:
    """PyTorch's SDPA kernels on this GPU, attention run in ``autocast`` (None: as exported)."""
    flash = vendor == "nvidia" and arch in FLASH_ARCHS
    return SdpaKernels((vendor, arch) not in NO_FUSED_SDPA,
                       FLASH_DTYPES if flash else frozenset(), autocast)


def grouped_kv(k: TensorInfo, v: TensorInfo, out: Sequence[NodeResult], readers: SoleReaders,
               produced_at: Mapping[str, int]
               ) -> tuple[TensorInfo, TensorInfo, tuple[int, ...]] | None:
    """K and V before ``repeat_kv``, and the nodes repeating them; None unless both are."""
    found = [_repeated(t, out, readers, produced_at) for t in (k, v)]
    if found[0] is None or found[1] is None:
        return None
    return found[0][0], found[1][0], (*found[0][1], *found[1][1])


def _repeated(t: TensorInfo, out: Sequence[NodeResult], readers: SoleReaders,
              produced_at: Mapping[str, int]) -> tuple[TensorInfo, tuple[int, ...]] | None:
    """K or V before ``repeat_kv`` (B, Hkv, S, D) and its Unsqueeze, Expand and Reshape, each
    result read by the next alone; None when ``t`` is no such repeat."""
    steps, x = [], t
    for op in ("Reshape", "Expand", "Unsqueeze"):
        p = produced_at.get(x.name)
        r = out[p] if p is not None else None
        if r is None or r.node.op_type != op or r.node.domain or readers.sole(x.name) is None \
                or not r.node.inputs or r.node.inputs[0] is None:
            return None
        steps.append(p)
        x = r.node.inputs[0]
    grouped = out[steps[1]].node.outputs[0].shape  # (B, Hkv, n_rep, S, D)
    ok = x.shape is not None and t.shape is not None and grouped is not None \
        and len(x.shape) == len(t.shape) == 4 and len(grouped) == 5 \
        and tuple(t.shape) == (x.shape[0], x.shape[1] * grouped[2], *x.shape[2:]) \
        and grouped[2] > 1
    return (x, tuple(steps)) if ok else None
