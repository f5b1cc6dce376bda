"""PyTorch's non-vectorized elementwise loop (``elementwise_kernel<128, vt>``): which nodes run
on it (analyzer/costs, analyzer/native.py), how it launches, and the latency floor the learned
predictor holds it to (learned/latency_walk.py)."""

from __future__ import annotations

import onnx.parser
import pytest
from test_costs import cost_of

import tilecast
from tilecast.analyzer.native import Launch, launch, loop_unroll
from tilecast.analyzer.types import BroadcastReread, Kernel, NativeLoop, OpCost
from tilecast.device_db import list_devices, load_device
from tilecast.learned.latency_walk import walk_ms

learned = pytest.importorskip("tilecast.learned")
if not learned.available():
    pytest.skip("the learned predictor is not shipped in this install", allow_module_level=True)


@pytest.mark.parametrize("inputs, body, op, loop", [
    # BERT's padding mask over the scores: the mask's h and s dims are broadcast
    ("float[8,16,512,512] x, float[8,1,1,512] m", "y = Add(x, m)", "Add", 8 * 16 * 512 * 512),
    # a position embedding added to every image of the batch
    ("float16[4,1024,1280] x, float16[1,1024,1280] p", "y = Add(x, p)", "Add", 4 * 1024 * 1280),
    # GPT-2's causal mask selects between the scores and a constant
    ("bool[1,1,64,64] c, float[2,4,64,64] x, float[1] v", "y = Where(c, x, v)", "Where",
     2 * 4 * 64 * 64),
    # an outer product of two vectors: both operands broadcast
    ("float[8,1] a, float[1,16] b", "y = Mul(a, b)", "Mul", 128),
    # same shapes: the vector kernel
    ("float[8,16] a, float[8,16] b", "y = Add(a, b)", "Add", None),
    # a one-element operand (a Python scalar in the model): the vector kernel
    ("float[8,16] a, float[1] b", "y = Div(a, b)", "Div", None),
    ("float[8,16] a, float b", "y = Mul(a, b)", "Mul", None),
    # leading size-1 dims only: the operand is laid out as the output is
    ("float[16] a, float[1,16] b", "y = Add(a, b)", "Add", None),
    # quantization is not a TensorIterator kernel
    ("float[8,16] x, float[16] s, int8[16] z", "y = QuantizeLinear<axis = 1>(x, s, z)",
     "QuantizeLinear", None),
    # a permuted copy: TensorIterator copies a non-contiguous tensor
    ("float[2,8,4,16] x", "y = Transpose<perm = [0, 2, 1, 3]>(x)", "Transpose", 2 * 8 * 4 * 16),
])
def test_which_nodes_pytorch_runs_on_its_loop(inputs, body, op, loop) -> None:
    native = cost_of(inputs, body, op).native
    assert native == (None if loop is None else NativeLoop(loop))


def test_a_contrib_op_is_another_runtimes_kernel() -> None:
    node = cost_of('float[2,8,16] x, float[16] b', 'y = com.microsoft.BiasGelu(x, b)',
                   "BiasGelu")
    assert node.native is None


@pytest.mark.parametrize("elements, dtype, expected", [
    # GPT-2 large's mask add at batch 4 on our H100: 4 x 20 x 1024 x 1024 bf16 outputs, four a
    # thread: the trace's 163,840 blocks of 128
    (4 * 20 * 1024 * 1024, "bfloat16", Launch(163840, 128, 4)),
    # its permuted heads' copies, 4 x 1024 x 1280: the trace's 10,240 blocks
    (4 * 1024 * 1280, "bfloat16", Launch(10240, 128, 4)),
    # a 4-byte result: two a thread (CUDALoops.cuh's unroll_factor)
    (8 * 16 * 512 * 512, "float32", Launch(131072, 128, 2)),
    (1000, "bool", Launch(2, 128, 4)),
])
def test_the_loop_launches_as_pytorch_does(elements, dtype, expected) -> None:
    assert launch(NativeLoop(elements), dtype) == expected
    assert loop_unroll(dtype) == expected.steps


def _loop(elements: int, dtype: str, nbytes: int, reread: BroadcastReread | None = None
          ) -> Kernel:
    cost = OpCost("elementwise", elements, nbytes, dtype, elements=elements, reread=reread,
                  native=NativeLoop(elements))
    return Kernel("add", ("add",), "Add", cost)


@pytest.mark.parametrize("device, kernel, floor_us, measured_us", [
    # H100: 163,840 blocks, 132 SMs x 16 resident blocks of 128 = 2,112 at once: 78 rounds x
    # 4 waits x 375.1 ns = 117.0 us; the scores read and written in bf16 (335.5 MB) and the
    # [4, 1, 1024, 1024] mask (8.4 MB, read once per batch) at 3.35 TB/s: 102.7 us. The trace
    # (datasets/h100-sxm5-80gb/traces/trace-gpt2-large-eager-b4.csv): 241 us a layer.
    ("h100-sxm5-80gb", _loop(83886080, "bfloat16", 2 * 83886080 * 2 + 8388608), 219.7, 241.3),
    # A100 PCIe 40GB, BERT-large's mask add at batch 8, fp32: 131,072 blocks over 108 x 16:
    # 76 rounds x 2 waits x 407.5 ns = 61.9 us; 268.4 MB at 1,555 GB/s: 172.6 us. The label's
    # per-node CSV: 278.3 us.
    ("a100-pcie-40gb", _loop(33554432, "float32", 2 * 33554432 * 4 + 8 * 512 * 4), 234.6,
     278.3),
    # L4: 189 rounds x 2 x 253.8 ns = 95.9 us, 268.4 MB at 300 GB/s: 894.8 us; measured
    # 1,160 us. The queue is nearly all of it: the loop costs the L4 little over a vector op.
    ("l4", _loop(33554432, "float32", 2 * 33554432 * 4 + 8 * 512 * 4), 990.7, 1160.0),
])
def test_the_floor_is_the_walk_and_its_queue(device, kernel, floor_us, measured_us) -> None:
    floor = walk_ms([kernel], load_device(device))[0] * 1e3
    assert floor == pytest.approx(floor_us, rel=2e-3)
    assert floor < measured_us


def test_an_l2_resident_loop_waits_on_no_dram() -> None:
    """A working set the L2 holds (a 4 MB add on an A100's 40 MB L2) neither queues at the
    DRAM nor waits on its latency: no floor beyond the learned time."""
    small = _loop(524288, "float32", 3 * 524288 * 4)
    assert walk_ms([small], load_device("a100-pcie-40gb"))[0] == 0.0


def test_a_broadcast_operands_repeats_queue_too() -> None:
    """OPT's mask slice (16.8 MB) read again for each of 32 heads beyond a 4 MB L2 (T4 has
    no sourced latency, so a V100's 6 MB): (1 - 6 / 16) of 31 repeats come from DRAM."""
    n, slice_b = 2 * 32 * 2048 * 2048, 2048 * 2048 * 4
    plain = _loop(n, "float32", 2 * n * 4 + 2 * slice_b)
    rr = BroadcastReread(31 * 2 * slice_b, slice_b, 2 * slice_b)
    v100 = load_device("v100-pcie-32gb")
    extra = walk_ms([_loop(n, "float32", 2 * n * 4 + 2 * slice_b, rr)], v100)[0] \
        - walk_ms([plain], v100)[0]
    repeats = rr.bytes * (1 - v100.l2_cache_mb * 2**20 / slice_b)
    assert extra == pytest.approx(repeats / (v100.mem_bandwidth_gbps * 1e6))


MASKED = """<ir_version: 8, opset_import: ["" : 17]>
masked (float[8, 16, 512, 512] x, float[8, 1, 1, 512] m) => (float[8, 16, 512, 512] y) {
  y = Add (x, m)
}"""


@pytest.mark.parametrize("runtime, fusion, loop", [
    ("eager", False, True), ("cudagraph", False, True),
    ("graph", False, False),  # a compiled runtime writes its own kernel
    ("eager", True, False),  # so does a fusing compiler (torch.compile), even for one op
])
def test_only_pytorchs_own_kernels_keep_the_loop(runtime, fusion, loop) -> None:
    f = tilecast.analyze(onnx.parser.parse_model(MASKED), "a100-pcie-40gb", runtime=runtime,
                         fusion=fusion)
    (k,) = f.kernels
    assert (k.kernel.cost.native is not None) is loop
    assert (k.bound == "latency") is loop


def test_the_floor_raises_the_mask_add_where_the_waits_show() -> None:
    """On an A100 the loop's waits lift the add above the vector kernel's time (1.36x in the
    labels); on the L4 its bandwidth hides them. A GPU with no sourced DRAM latency keeps the
    learned time and says it is outside the data (no sweep row runs this loop)."""
    model = onnx.parser.parse_model(MASKED)

    def one(device: str, runtime: str = "cudagraph"):
        (k,) = tilecast.analyze(model, device, runtime=runtime).kernels
        return k

    a100, graph = one("a100-pcie-40gb"), one("a100-pcie-40gb", "graph")
    assert a100.bound == "latency" and a100.latency_ms > 1.15 * graph.latency_ms
    assert not a100.extrapolated
    assert one("l4").bound == "memory"
    t4 = one("t4")
    assert t4.extrapolated and t4.bound == "memory"


@pytest.mark.parametrize("device", [d.name for d in list_devices()])
def test_more_elements_never_lower_the_floor(device) -> None:
    dev = load_device(device)
    sizes = [2**e for e in range(10, 31, 2)]
    floors = walk_ms([_loop(n, "bfloat16", 6 * n) for n in sizes], dev)
    if dev.dram_latency_ns is None:
        assert all(f != f for f in floors)  # NaN: no floor
    else:
        assert all(b >= a for a, b in zip(floors, floors[1:], strict=False))
