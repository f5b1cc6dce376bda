"""`tilecast collect --device cpu`: the GPU code path end to end on the CPU, and its bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tilecast.cli import main
from tilecast.collect.shapes import Shape, default_grid, parse_ops, read_shapes_file
from tilecast.errors import ConfigError

pytest.importorskip("torch", reason="tilecast collect needs the [collect] extra (torch)")

SHAPES = """# op,dims
bmm,2,32,32,16
linear,1,64,32,16
add,16,64
gelu,16,64
softmax,8,64
ln,8,64
conv,1,3,4,3,8,1,1
conv,1,4,4,3,8,2,1,2,1
bn,1,4,8
sdpa,1,2,64,16,1
"""


def _collect(out: Path, shapes: Path, *extra: str):
    return CliRunner().invoke(main, ["collect", "--out", str(out), "--device", "cpu",
                                     "--shapes", str(shapes), "--repeats", "2", *extra])


def _rows(out: Path, op: str) -> list[dict[str, str]]:
    with (out / "kernels" / "cpu" / "train" / op / "cpu.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def shapes_file(tmp_path: Path) -> Path:
    path = tmp_path / "shapes.csv"
    path.write_text(SHAPES)
    return path


def test_collect_on_cpu_writes_dataset_schema(tmp_path, shapes_file):
    out = tmp_path / "out"
    r = _collect(out, shapes_file, "--dtype", "fp32,bf16")
    assert r.exit_code == 0, r.output
    rows = _rows(out, "bmm")
    assert [r["dtype"] for r in rows] == ["fp32", "bf16"]
    row = rows[0]
    assert (row["B"], row["M"], row["N"], row["K"]) == ("2", "32", "32", "16")
    assert row["Device"] == "cpu" and float(row["Latency"]) > 0
    assert float(row["Latency Fastest Mean"]) <= float(row["Latency"]) * 1.0001
    assert "bmm" in row["Kernel Name"]
    assert row["SM Clock MHz"] == ""  # no GPU clock on the CPU
    assert row["Kernels GPU ms"] == ""  # no CUPTI kernel durations either
    conv = _rows(out, "conv")
    assert conv[0]["Kernel_Szie"] == "3" and (conv[0]["Groups"], conv[0]["Channels_Last"]) == (
        "1", "0")  # the 7-column row takes the defaults
    assert (conv[2]["Stride"], conv[2]["Groups"], conv[2]["Channels_Last"]) == ("2", "2", "1")
    assert _rows(out, "bn")[0]["Channels"] == "4"
    sdpa = _rows(out, "sdpa")[0]
    assert (sdpa["Heads"], sdpa["Seq"], sdpa["Head_Dim"], sdpa["Causal"]) == ("2", "64", "16",
                                                                            "1")
    device = json.loads((out / "devices" / "cpu.json").read_text())
    assert device["vendor"] == "cpu" and device["peak_tflops_fp32"] > 0


def test_collect_is_resumable(tmp_path, shapes_file):
    out = tmp_path / "out"
    assert _collect(out, shapes_file).exit_code == 0
    r = _collect(out, shapes_file, "--dtype", "fp32,bf16")
    assert r.exit_code == 0, r.output
    assert "measured 10 kernels, 10 already" in r.output
    assert len(_rows(out, "add")) == 2  # fp32 kept, bf16 appended


def test_collect_stops_at_its_time_budget_and_resumes(tmp_path, shapes_file):
    out = tmp_path / "out"
    r = _collect(out, shapes_file, "--budget-s", "0")
    assert r.exit_code == 0, r.output
    assert "measured 0 kernels" in r.output and "10 left for the next run" in r.output
    r = _collect(out, shapes_file)
    assert "measured 10 kernels, 0 already" in r.output and "left" not in r.output


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda:0"], "no CUDA device"),
    (["--device", "cpu", "--ops", "matmul,warp"], "unknown op 'warp'"),
    (["--device", "cpu", "--dtype", "fp12"], "unknown dtype 'fp12'"),
])
def test_collect_bad_input(tmp_path, shapes_file, args, message):
    import torch

    if "cuda" in args[1] and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    r = CliRunner().invoke(main, ["collect", "--out", str(tmp_path / "o"), "--shapes",
                                  str(shapes_file), *args])
    assert r.exit_code != 0 and r.output.strip().splitlines()[-1].startswith("Error:")
    assert message in r.output


def test_malformed_shapes_row_names_the_line(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("bmm,1,2,3,4\n\nsoftmax,8,x\n")
    with pytest.raises(ConfigError, match=r"s.csv:3: dims must be integers"):
        read_shapes_file(path, parse_ops("matmul,softmax"))
    r = CliRunner().invoke(main, ["collect", "--out", str(tmp_path / "o"), "--device", "cpu",
                                  "--shapes", str(path)])
    assert r.exit_code != 0 and "s.csv:3" in r.output


@pytest.mark.parametrize("row, message", [
    # a 1x1 conv has no padding, channels-last and causal are flags: 0 is a value for them
    ("conv,1,4,4,1,8,1,0", None),
    ("convdw,2,4,8,1,8,2,0,1,1", None),
    ("sdpa,1,2,64,16,0", None),
    ("linear,1,8,0,4", "linear N must be positive, got 0"),  # every matmul dim is checked
    ("bn,1,0,8", "bn Channels must be positive, got 0"),
    ("conv,1,4,4,3,8,1,-1", "conv Padding must be 0 or more, got -1"),
    ("conv,1,4,4,3,8,1,1,1,2", "conv Channels_Last must be 0 or 1, got 2"),
    ("sdpa,1,2,64,16,3", "sdpa Causal must be 0 or 1, got 3"),
    ("rms,4", "rms needs 2 dims"),
])
def test_shapes_file_dims_are_checked_by_name(tmp_path, row, message):
    path = tmp_path / "s.csv"
    path.write_text(row + "\n")
    ops = parse_ops(row.split(",")[0])
    if message is None:
        assert len(read_shapes_file(path, ops)) == 1
    else:
        with pytest.raises(ConfigError, match=f"s.csv:1: {message}"):
            read_shapes_file(path, ops)


def test_unwritable_output_folder(tmp_path, shapes_file):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = _collect(blocker / "sub", shapes_file)
    assert r.exit_code != 0 and "not writable" in r.output


def test_default_grid_is_deterministic_and_in_range():
    a, b = default_grid("bmm", 50), default_grid("bmm", 50)
    assert a == b and len(a) == 50
    assert all(16 <= d <= 8192 for s in a for d in s.dims[1:])
    assert all(s.dims[0] == 1 for s in default_grid("linear", 10))


def test_zoo_linears_include_their_decode_steps():
    # Llama 3 8B's projections (hidden 4096, MLP 14336) at 1-128 rows: the memory-bound GEMMs
    # a decode step runs, beside the 512-16384-token prefill shapes.
    from tilecast.collect.cli import ZOO_DIR
    from tilecast.collect.shapes import DECODE_ROWS, zoo_shapes

    shapes = zoo_shapes("linear", [ZOO_DIR / "llama-3-8b.json"])
    # (B, M, N, K): Linear(N -> K) on M rows, here the MLP's up projection 4096 -> 14336
    rows = {s.dims[1] for s in shapes if (s.dims[2], s.dims[3]) == (4096, 14336)}
    assert rows == set(DECODE_ROWS) | {512, 2048, 8 * 512, 8 * 2048}
    # Batched products: attention (32 heads of 128) and the projections as batch-1 "nn" GEMMs.
    bmm = zoo_shapes("bmm", [ZOO_DIR / "llama-3-8b.json"])
    assert Shape("bmm", (32, 512, 128, 512)) in bmm  # Q K^T: reduce over the head's 128
    assert Shape("bmm", (32, 512, 512, 128)) in bmm  # P V: reduce over the 512 keys
    assert Shape("bmm", (1, 2048, 14336, 4096)) in bmm  # the down projection, "nn"
    assert not any(s.dims[0] == 1 and s.dims[1] in DECODE_ROWS for s in bmm)
    assert all(s.dims[1] >= 512 for s in zoo_shapes("ln", [ZOO_DIR / "llama-3-8b.json"]))


def test_default_conv_plan_covers_cnn_kinds():
    """1x1 / 3x3 / 7x7, strided, grouped, depthwise, NCHW and channels-last, and batch norm."""
    convs = default_grid("conv", 200)
    named = [s.named for s in convs]
    assert {d["Kernel_Szie"] for d in named} >= {1, 3, 7}
    assert {d["Stride"] for d in named} == {1, 2} and {d["Channels_Last"] for d in named} == {0, 1}
    assert any(d["Groups"] == 32 for d in named)
    assert any(d["Groups"] == d["Input_Channel"] == d["Output_Channel"] > 1 for d in named)
    assert all(d["Input_Channel"] % d["Groups"] == 0 for d in named)
    assert len(default_grid("bn", 5)) == 5


def test_default_attention_plan():
    """Fused attention (the rule of docs/predictor.md, "Fused attention", has no data yet):
    causal and not, heads of 64 to 128, 128 to 16384 tokens, every tensor under the cap."""
    from tilecast.collect.cli import ZOO_DIR
    from tilecast.collect.shapes import ATTENTION_MAX_ELEMENTS, zoo_shapes

    named = [s.named for s in default_grid("sdpa", 200)]
    assert {d["Causal"] for d in named} == {0, 1} and {64, 128} <= {d["Head_Dim"] for d in named}
    assert all(128 <= d["Seq"] <= 16384 for d in named)
    assert all(d["B"] * d["Heads"] * d["Seq"] * d["Head_Dim"] <= ATTENTION_MAX_ELEMENTS
               for d in named)
    # Llama 3 8B's prefill attention: 32 heads of 128, causal
    assert Shape("sdpa", (8, 32, 2048, 128, 1)) in zoo_shapes("sdpa", [ZOO_DIR / "llama-3-8b.json"])


def test_collected_data_trains_a_predictor(tmp_path, shapes_file):
    """collect --device cpu -> tilecast train -> a predictor that serves the collected device."""
    pytest.importorskip("sklearn", reason="tilecast train's extra")
    import onnx

    import tilecast
    from tilecast.analyzer.synthetic import gpt2_like

    out = tmp_path / "collected"
    assert _collect(out, shapes_file, "--dtype", "fp32,bf16").exit_code == 0
    r = CliRunner().invoke(main, ["train", "--data", str(out), "-o", str(tmp_path / "pred"),
                                  "--epochs", "2"])
    assert r.exit_code == 0, r.output
    artifact = tmp_path / "pred" / "tilecast_predictor.onnx"
    meta = {p.key: p.value for p in onnx.load(str(artifact)).metadata_props}
    assert json.loads(meta["training_dtypes"]) == ["bfloat16", "float32"]
    assert "cpu" in json.loads(meta["training_devices"])
    from tilecast.learned.dataset import data_hash

    # the recorded hash covers the collected (cpu) CSVs that trained the model
    assert meta["training_data_sha256"] == data_hash([out], "train", ("nvidia", "cpu"))
    assert meta["training_data_sha256"] != data_hash([out], "train")
    model = tmp_path / "tiny.onnx"
    onnx.save(gpt2_like(layers=1, hidden=32, heads=2, seq=16, batch=1, vocab=64), model)
    f = tilecast.analyze(model, out / "devices" / "cpu.json", predictor=str(artifact))
    assert f.total_ms > 0 and f.predictor.startswith("tilecast")


EXTRA_SHAPES = """bmm,2,32,48,16
bmmt,2,32,48,16
addb,16,64
whereb,16,64
maxt,16,64
and,16,64
cast,16,64
"""


@pytest.mark.parametrize("op, dims, out_shape", [
    # The shared CSVs' B, M, N, K: (B x M x N) @ (B x N x K), N the reduction (the launch
    # grids of the shared data and of datasets/h100-sxm5-80gb say so): collect must measure
    # that product, or every row it writes is read back with reduction and output swapped.
    ("linear", (1, 3, 5, 7), (3, 7)),  # Linear(5 -> 7) on 3 rows
    ("bmm", (2, 3, 5, 7), (2, 3, 7)),
    ("bmmt", (2, 3, 5, 7), (2, 3, 7)),
])
def test_matmuls_are_measured_in_the_shared_csv_convention(op, dims, out_shape):
    torch = pytest.importorskip("torch")
    from tilecast.collect.ops import build
    from tilecast.learned.dataset import matmul_dims_of_row

    out = build(Shape(op, dims), "fp32", torch.device("cpu"))()
    assert tuple(out.shape) == out_shape
    b, m, n, k = matmul_dims_of_row(dict(zip("BMNK", map(str, dims), strict=True)))
    assert (m, n) == out_shape[-2:] and k == dims[2]  # read back: output m x n, reduction k


def test_layout_mask_and_cast_ops_compute_what_they_name():
    torch = pytest.importorskip("torch")
    from tilecast.collect.ops import build

    cpu = torch.device("cpu")
    out = build(Shape("bmmt", (2, 3, 4, 5)), "fp32", cpu)()  # (2, 3 x 4) @ (2, 5 x 4)^T
    assert out.shape == (2, 3, 5)
    assert build(Shape("cast", (4, 8)), "fp32", cpu)().dtype == torch.bfloat16
    assert build(Shape("cast", (4, 8)), "bf16", cpu)().dtype == torch.float32
    assert build(Shape("and", (4, 8)), "bool", cpu)().dtype == torch.bool
    for op in ("addb", "whereb", "maxt"):
        assert build(Shape(op, (4, 8)), "fp16", cpu)().shape == (4, 8)
    # 4 tokens of 2 heads of 64, copied head-major; 96 columns: 3 heads of 32
    assert build(Shape("permc", (4, 128)), "fp32", cpu)().shape == (2, 4, 64)
    assert build(Shape("permc", (4, 96)), "fp32", cpu)().shape == (3, 4, 32)
    with pytest.raises(ConfigError, match="permc needs H a multiple of 32"):
        build(Shape("permc", (4, 100)), "fp32", cpu)
    # autocast's batch norm keeps fp32 weights: the output takes the input's dtype
    assert build(Shape("bnc", (2, 8, 7)), "bf16", cpu)().dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="and is measured in bool only"):
        build(Shape("and", (4, 8)), "fp16", cpu)


def test_collect_layout_mask_and_cast_ops(tmp_path):
    """bool And is measured once (in bool) whatever --dtype says; the rest once per dtype;
    training skips them (no model input for layout or broadcasting yet)."""
    from tilecast.learned.dataset import load_kernels

    shapes = tmp_path / "extra.csv"
    shapes.write_text(EXTRA_SHAPES)
    out = tmp_path / "out"
    r = _collect(out, shapes, "--dtype", "fp32,bf16")
    assert r.exit_code == 0, r.output
    assert [row["dtype"] for row in _rows(out, "and")] == ["bool"]
    assert [row["dtype"] for row in _rows(out, "cast")] == ["fp32", "bf16"]
    assert _rows(out, "bmmt")[0]["Kernel Name"]
    r = _collect(out, shapes, "--dtype", "fp32,bf16")
    assert "measured 0 kernels, 13 already" in r.output  # 6 ops x 2 dtypes + And once
    assert set(load_kernels([out], "train", vendor="cpu").op) == {"bmm"}


def test_zoo_plan_has_attention_layout_and_masks():
    from tilecast.collect.cli import ZOO_DIR
    from tilecast.collect.shapes import MASK_OPS, zoo_shapes

    llama = [ZOO_DIR / "llama-3-8b.json"]
    # Q K^T of 32 heads of 128 at 512 tokens, read transposed as eager attention does
    assert Shape("bmmt", (32, 512, 128, 512)) in zoo_shapes("bmmt", llama)
    for op in MASK_OPS:  # the scores (32 heads x 512 tokens rows of 512); cast: hidden states
        want = Shape(op, (512, 4096)) if op == "cast" else Shape(op, (32 * 512, 512))
        assert want in zoo_shapes(op, llama)


def test_resumed_file_with_an_older_header_stays_aligned(tmp_path, shapes_file):
    """A CSV begun before the clock column keeps its header; new rows drop that column."""
    out = tmp_path / "out"
    assert _collect(out, shapes_file).exit_code == 0
    path = out / "kernels" / "cpu" / "train" / "add" / "cpu.csv"
    rows = _rows(out, "add")
    with path.open("w", newline="") as fh:
        old = [c for c in rows[0] if c != "SM Clock MHz"]
        w = csv.DictWriter(fh, fieldnames=old, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    assert _collect(out, shapes_file, "--dtype", "fp32,bf16").exit_code == 0
    new = _rows(out, "add")
    assert [r["dtype"] for r in new] == ["fp32", "bf16"] and "SM Clock MHz" not in new[1]
    assert float(new[1]["Latency"]) > 0 and new[1]["B"] == "16"


@pytest.mark.parametrize("reading, want", [(1410.0, 1410), (RuntimeError("no NVML"), None)])
def test_sm_clock_reading(monkeypatch, reading, want):
    import types

    import torch

    from tilecast.collect.timing import sm_clock_mhz

    def clock_rate(device=None):
        if isinstance(reading, Exception):
            raise reading
        return reading

    monkeypatch.setattr(torch.cuda, "clock_rate", clock_rate)
    assert sm_clock_mhz(types.SimpleNamespace(type="cuda")) == want
    assert sm_clock_mhz(torch.device("cpu")) is None


def test_training_and_llama_ops_compute_what_they_name():
    """stop 48's ops: a linear's weight gradient dY^T X (dY stored (tokens, out)), a conv's
    data and weight gradients (aten.convolution_backward, the forward's dims and layout),
    RMS norm and SiLU."""
    torch = pytest.importorskip("torch")
    from tilecast.collect.ops import build

    cpu = torch.device("cpu")
    torch.manual_seed(0)
    # B, M, N, K = 1, 3, 5, 7: dY^T (3 x 5) @ X (5 x 7), N = 5 tokens the reduction
    assert tuple(build(Shape("mmtn", (1, 3, 5, 7)), "fp32", cpu)().shape) == (3, 7)
    assert tuple(build(Shape("mmtn", (2, 3, 5, 7)), "fp32", cpu)().shape) == (2, 3, 7)
    # 2 images of 8 channels, 14 x 14, 3x3 stride 2 to 16 channels, NCHW and channels-last
    for last in (0, 1):
        dims = (2, 8, 16, 3, 14, 2, 1, 1, last)
        dx, dw, db = build(Shape("convdx", dims), "fp32", cpu)()
        assert tuple(dx.shape) == (2, 8, 14, 14) and dw is None and db is None
        dx, dw, _ = build(Shape("convdw", dims), "fp32", cpu)()
        assert dx is None and tuple(dw.shape) == (16, 8, 3, 3)
    assert build(Shape("rms", (4, 8)), "bf16", cpu)().shape == (4, 8)
    assert build(Shape("silu", (4, 8)), "bf16", cpu)().dtype == torch.bfloat16
    # batch norm on batch statistics, 2 images of 8 channels of 6 x 6, and its backward:
    # dX, dgamma, dbeta; channels-last stays channels-last
    for last in (0, 1):
        y = build(Shape("bnfw", (2, 8, 6, last)), "bf16", cpu)()
        assert y.shape == (2, 8, 6, 6) and y.is_contiguous(
            memory_format=torch.channels_last if last else torch.contiguous_format)
        dx, dg, db = build(Shape("bnbw", (2, 8, 6, last)), "bf16", cpu)()
        assert (dx.shape, dg.shape, db.shape) == ((2, 8, 6, 6), (8,), (8,))


def test_conv_gradients_pair_with_the_forward_grid():
    conv = default_grid("conv", 30)
    for op in ("convdx", "convdw"):
        assert [s.dims for s in default_grid(op, 30)] == [s.dims for s in conv]


@pytest.mark.parametrize("op, dims, family, flops, nbytes", [
    # dY^T X as the analyzer's dB: (m x k) @ (k x n) with m = M 3, n = K 7, k = N 5 the
    # reduction; 2 m n k = 210 FLOPs; bytes 2 (bf16) x (3 x 5 + 5 x 7 + 3 x 7) = 142
    ("mmtn", "1,3,5,7", "matmul", 210, 142),
    # RMS norm on 4 rows of 8: 4 FLOPs per element (128); x in, y out, the gain: 2 (32 + 32 + 8)
    ("rms", "4,8", "layernorm", 128, 144),
    # SiLU: sigmoid 3 + mul 1 per element (128); x in, y out: 2 x 64
    ("silu", "4,8", "elementwise", 128, 128),
])
def test_new_ops_read_back_with_the_analyzers_costs(tmp_path, op, dims, family, flops, nbytes):
    from tilecast.learned.dataset import load_kernels

    shapes = tmp_path / "s.csv"
    shapes.write_text(f"{op},{dims}\n")
    out = tmp_path / "out"
    assert _collect(out, shapes, "--dtype", "bf16").exit_code == 0
    s = load_kernels([out], "train", vendor="cpu")
    assert (s.op.tolist(), s.family.tolist()) == ([op], [family])
    assert (s.flops[0], s.bytes[0]) == (flops, nbytes)
