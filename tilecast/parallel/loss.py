"""The loss a Megatron-LM step computes from the LM head's logits: its vocabulary-parallel
cross entropy (megatron/core/tensor_parallel/cross_entropy.py).

The exported graphs end at the logits; a training step goes on. Megatron-LM casts the
logits to fp32 and, on each tensor-parallel rank's slice of the vocabulary: the row max
(all-reduced, MAX), the logits minus it in place, the target logit (all-reduced, SUM),
exp in place, the row sum (all-reduced, SUM), and the exp divided by it in place (the
softmax it keeps for the backward). The backward subtracts one at each target and scales
the softmax by the loss gradient in place, then casts back. Per pass over the [tokens,
vocab / tp] slice: max 1, subtract 2, exp 2, sum 1, divide 2 reads and writes forward,
scale 2 backward; the per-token vectors (targets, losses) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analyzer.types import DTYPE_SIZE, Kernel, OpCost, RowDims

FP32 = 4  # bytes: Megatron-LM computes the cross entropy in float32


@dataclass(frozen=True)
class LossKernels:
    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    saved_bytes: float  # the fp32 softmax kept for the backward
    all_reduces: tuple[tuple[str, float], ...]  # (op, bytes) per microbatch, forward


def _pass(name: str, tokens: int, vocab: int, phase: str, reads: int = 1,
          writes: int = 1) -> Kernel:
    n = tokens * vocab
    return Kernel(f"loss.{name}", (), name, OpCost("elementwise", n, (reads + writes) * FP32
                                                   * n, "float32", elements=n), phase)


def _row(name: str, tokens: int, vocab: int) -> Kernel:
    n = tokens * vocab
    return Kernel(f"loss.{name}", (), name, OpCost("reduction", n, FP32 * (n + tokens),
                                                   "float32", rows=RowDims(tokens, vocab),
                                                   elements=tokens), "forward")


def cross_entropy(tokens: int, vocab: int, logits_dtype: str, tp: int) -> LossKernels:
    """The loss kernels of one rank: ``tokens`` rows of ``vocab`` / ``tp`` logits."""
    v = -(-vocab // tp)
    forward = [_row("ReduceMax", tokens, v), _pass("Sub", tokens, v, "forward"),
               _pass("Exp", tokens, v, "forward"), _row("ReduceSum", tokens, v),
               _pass("Div", tokens, v, "forward")]
    backward = [_pass("Mul", tokens, v, "backward")]
    size = DTYPE_SIZE.get(logits_dtype, FP32)
    if size < FP32:  # logits.float() and its gradient's cast back
        n = tokens * v
        forward.insert(0, Kernel("loss.cast", (), "Cast", OpCost(
            "elementwise", n, (size + FP32) * n, "float32", elements=n), "forward"))
        backward.append(Kernel("loss.cast_grad", (), "Cast", OpCost(
            "elementwise", n, (size + FP32) * n, logits_dtype, elements=n), "backward"))
    reduces = tuple(("all-reduce", float(FP32 * tokens)) for _ in range(3)) if tp > 1 else ()
    return LossKernels(tuple(forward), tuple(backward), float(FP32 * tokens * v), reduces)
