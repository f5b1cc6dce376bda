"""The parallel layout: data, tensor, pipeline, context and expert degrees and the options that
go with them."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TilecastError

# PyTorch DistributedDataParallel's default gradient bucket (bucket_cap_mb=25),
# https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html
DDP_BUCKET_MB = 25.0
# Whether the data-parallel gradient reduction overlaps the backward. PyTorch DDP overlaps it
# bucket by bucket; Megatron-LM does not unless asked (its --overlap-grad-reduce is off by
# default: megatron/training/arguments.py; with it off, megatron.core's
# DistributedDataParallel takes the whole gradient buffer as one bucket, reduced after the
# last backward by finalize_model_grads; the older megatron.model.DistributedDataParallel
# ("local" DDP) likewise all-reduced its contiguous buffer after forward_backward).
ZERO_STAGES = (0, 1, 2, 3)  # 0: plain DDP; 3 is FSDP's FULL_SHARD
# Activation recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large
# Transformer Models", arXiv:2205.05198, 2022): "selective" recomputes the attention core
# (QK^T, softmax, dropout, attention over V) in the backward and keeps everything else;
# "full" keeps each layer's input and recomputes the whole layer.
RECOMPUTE = ("none", "selective", "full")
CP_COMM = ("ring", "a2a")


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1  # per step and data-parallel rank
    zero: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"  # RECOMPUTE; True / False are read as "full" / "none"
    bucket_mb: float = DDP_BUCKET_MB
    virtual_stages: int = 1  # interleaved 1F1B: model chunks per GPU (Megatron-LM)
    overlap_grad_reduce: bool = True  # False: one reduction after the backward (Megatron-LM)
    # Expert parallelism (mixture-of-experts layers, parallel/experts.py): the ranks of an
    # expert-parallel group are data-parallel ranks (Megatron-core carves them out of the
    # data-parallel group), so ep divides dp and does not add GPUs.
    ep: int = 1
    # Context parallelism (parallel/context.py): the sequence split over cp ranks, which sit
    # between the tensor- and data-parallel ranks in Megatron-core's order (tp, cp, dp, pp).
    cp: int = 1
    # How the cp ranks share attention: "ring" passes K and V chunks round a ring (Megatron-
    # core's p2p, overlapped with the attention); "a2a" exchanges heads for sequence with
    # all-to-alls before and after it (DeepSpeed-Ulysses; Megatron-core's a2a).
    cp_comm: str = "ring"

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "microbatches", "virtual_stages", "ep", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TilecastError(f"layout: {name} must be a positive integer, got {value!r}")
        if self.zero not in ZERO_STAGES:
            raise TilecastError(f"layout: zero must be one of 0, 1, 2, 3, got {self.zero!r}")
        if self.cp_comm not in CP_COMM:
            raise TilecastError(f"layout: cp_comm must be one of {', '.join(CP_COMM)}, "
                                f"got {self.cp_comm!r}")
        if self.dp % self.ep:
            raise TilecastError(f"layout: ep={self.ep} must divide dp={self.dp} (the "
                                f"expert-parallel ranks are data-parallel ranks)")
        if self.virtual_stages > 1 and (self.pp == 1 or self.microbatches % self.pp):
            raise TilecastError("layout: an interleaved pipeline (virtual_stages > 1) needs "
                                "pp > 1 and microbatches divisible by pp (as Megatron-LM does)")
        if isinstance(self.recompute, bool):  # the earlier boolean form: full or none
            object.__setattr__(self, "recompute", "full" if self.recompute else "none")
        if self.recompute not in RECOMPUTE:
            raise TilecastError(f"layout: recompute must be one of {', '.join(RECOMPUTE)}, "
                                f"got {self.recompute!r}")
        if self.bucket_mb <= 0:
            raise TilecastError(f"layout: bucket_mb must be positive, got {self.bucket_mb}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights (data- and context-parallel), over which gradients
        are reduced and ZeRO shards."""
        return self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """Ranks holding the same experts, over which expert gradients are reduced."""
        return self.replicas // self.ep

    def label(self) -> str:
        extra = "".join((f",zero={self.zero}" if self.zero else "",
                         ",sp" if self.sequence_parallel else "",
                         {"none": "", "full": ",recompute"}.get(
                             self.recompute, f",recompute={self.recompute}"),
                         f",vp={self.virtual_stages}" if self.virtual_stages > 1 else "",
                         ",no-overlap" if self.dp > 1 and not self.overlap_grad_reduce
                         else ""))
        cp = f",cp={self.cp}" + (",a2a" if self.cp_comm == "a2a" else "") if self.cp > 1 else ""
        more = cp + (f",ep={self.ep}" if self.ep > 1 else "")
        return f"dp={self.dp},tp={self.tp},pp={self.pp}{more},mb={self.microbatches}{extra}"


def parse_layout(text: str, **options) -> Layout:
    """``"dp=2,tp=4,pp=1"``, ``"dp=8,ep=4"`` or ``"dp=2,cp=4"`` (any order, missing degrees
    are 1) -> :class:`Layout`."""
    degrees: dict[str, int] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("dp", "tp", "pp", "cp", "ep") \
                or not value.strip().isdigit():
            raise TilecastError(f"--parallel {text!r}: expected dp=D,tp=T,pp=P[,cp=C][,ep=E] "
                                f"(positive integers), got {item!r}")
        degrees[key] = int(value)
    return Layout(**degrees, **options)
