"""Zero biases: a convolution whose bias initializer is all zeros is read without it.

torch.onnx writes ``nn.Conv2d(..., bias=False)`` (every conv of a ResNet or a MobileNet
ahead of its batch norm) as an ONNX ``Conv`` with a third input: a bias initializer of
zeros (torch 2.13's dynamo exporter, all 53 convs of ``tilecast export resnet-50``). PyTorch ran
no bias there. Read as a bias it costs nothing on a GPU by itself, but under autocast every
such bias is a weight cast to half, a kernel with its own host dispatch: 53 of the 109 casts
of ResNet-50's eager ``--math amp-fp16`` pass. So the bias is dropped when the graph is built
(the node reads as PyTorch's ``bias=None``). Only convolutions: a trained or randomly
initialized conv bias is never exactly zero, while a linear layer's may be (Hugging Face
initializes them to zeros), and PyTorch does run those.

The values come from the initializer when it keeps its data, or from the tag the weightless
reader leaves on a dropped vector of zeros (``weightless.ZEROS_TAG``).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import numpy_helper

from .weightless import FLOAT_DTYPES, ZEROS_TAG, has_data

# (domain, op_type) -> the input slot of the bias; each is the node's last input.
BIAS_SLOTS = {("", "Conv"): 2, ("", "ConvTranspose"): 2}


def is_zero_vector(t: onnx.TensorProto) -> bool:
    """A float vector whose values are all zero (kept here, or tagged so by the reader)."""
    if t.doc_string == ZEROS_TAG:
        return True
    if len(t.dims) != 1 or t.data_type not in FLOAT_DTYPES or not has_data(t):
        return False
    try:
        values = numpy_helper.to_array(t)
    except (ValueError, TypeError):  # its data do not fill its dims: no evidence of zeros
        return False
    return values.size == t.dims[0] and not values.any()


def zero_vectors(model: onnx.ModelProto) -> frozenset[str]:
    """Names of the model's initializers that are zero vectors (not one a graph input of
    the same name may override at run time)."""
    inputs = {vi.name for vi in model.graph.input}
    return frozenset(t.name for t in model.graph.initializer
                     if t.name not in inputs and is_zero_vector(t))


def inputs_without_zero_bias(node: onnx.NodeProto, domain: str,
                             zeros: frozenset[str]) -> Sequence[str]:
    """The node's input names, less a trailing bias that is a zero vector."""
    slot = BIAS_SLOTS.get((domain, node.op_type))
    names = node.input
    if slot is None or len(names) != slot + 1 or names[slot] not in zeros:
        return names
    return names[:slot]
