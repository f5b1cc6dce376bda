"""`tilecast evaluate --by-family`: fx-node classification, per-node CSV sums, the comparison
with the forecast and the CLI, on tiny hand-written CSVs and a tiny ONNX model (no export)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from tilecast.analyzer.pipeline import analyze
from tilecast.analyzer.predictor import RooflinePredictor
from tilecast.cli import main
from tilecast.device_db import load_device
from tilecast.errors import ConfigError
from tilecast.evaluation import evaluate_by_family
from tilecast.evaluation.by_family import (
    compare_run,
    copies_inside_matmul,
    gemm_operand_copies,
)
from tilecast.evaluation.fx_nodes import (
    HOST,
    UNCLASSIFIED,
    FxNode,
    fx_family,
    read_per_node_csv,
)
from tilecast.evaluation.labels import Label

TINY = """
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[2, 8, 16] x, float[16, 16] w) => (float[2, 16, 8] z) {
    y = MatMul(x, w)
    s = Softmax<axis = -1>(y)
    z = Transpose<perm = [0, 2, 1]>(s)
}
"""
BLOCK = ("{'nn_module_stack': OrderedDict([('layers', <class 'torch.nn.ModuleList'>), "
         "('layers.0', <class 'm.Block'>)])}")
LINEAR = BLOCK[:-3] + ", ('layers.0.dense', <class 'torch.nn.modules.linear.Linear'>)])}"
TOP = "{'nn_module_stack': OrderedDict([('drop', <class 'torch.nn.modules.dropout.Dropout'>)])}"
# op, target, meta, dtype, input_shapes, fw, bw, acc, Name
ROWS = [
    ("placeholder", "x", "{}", "torch.float32", "[]", 0, 0, 0, "x"),
    ("call_method", "size", "{}", "", "[[2, 8, 16]]", 0.010, 0, 0, "size"),
    ("call_function", "<built-in function add>", "{}", "", "[[1]]", 0.011, 0, 0, "add"),
    ("call_module", "layers.0.dense", LINEAR, "torch.float32", "[[2, 8, 16]]", 0.5, 1.0, 0.2,
     "dense"),
    ("call_function", "<function softmax at 0x7f>", BLOCK, "torch.float32", "[[2, 8, 16]]",
     0.2, 0.3, 0, "softmax"),
    ("call_method", "view", BLOCK, "torch.float32", "[[2, 8, 16], [1]]", 0.012, 0, 0, "view"),
    ("call_function", "<built-in function add>", "{}", "torch.float32",
     "[[2, 8, 16], [2, 8, 16]]", 0.1, 0.05, 0, "add_1"),
    ("call_function", "<built-in function getitem>", "{}", "torch.float32",
     "[[2, 8, 16], [2, 8]]", 0.05, 0, 0, "getitem"),
    ("call_module", "drop", TOP, "torch.float32", "[[2, 8, 16]]", 0.02, 0.04, 0, "drop"),
    ("call_function", "<built-in method frobnicate of type object at 0x1>", "{}",
     "torch.float32", "[[2, 8, 16]]", 0.03, 0, 0, "frobnicate"),
    ("output", "output", "{}", "torch.float32", "[[2, 16, 8]]", 0, 0, 0, "output"),
]
HEADER = ["op", "target", "meta", "dtype", "input_shapes", "fw_latency", "bw_latency",
          "acc_latency", "Name"]


def _write_csv(path: Path, rows=ROWS, header=HEADER) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return path


@pytest.mark.parametrize("op,target,is_tensor,inputs,training,family", [
    ("placeholder", "x", True, 0, False, HOST),  # graph input: no work
    ("call_method", "size", False, 1, False, HOST),  # shape query
    ("call_function", "add", False, 1, False, HOST),  # int + int for a shape
    ("call_function", "add", True, 2, False, "elementwise"),  # tensor + tensor
    ("call_module", "Linear", True, 1, False, "matmul"),
    ("call_function", "baddbmm", True, 3, False, "matmul"),
    ("call_module", "LayerNorm", True, 1, False, "normalization"),
    ("call_module", "Embedding", True, 1, False, "gather"),
    ("call_function", "softmax", True, 1, False, "softmax"),
    ("call_method", "permute", True, 1, False, HOST),  # a view
    ("call_method", "contiguous", True, 1, False, "movement"),  # the copy after it
    ("call_function", "getitem", True, 1, False, HOST),  # x[:, 0]: a view
    ("call_function", "getitem", True, 2, False, "movement"),  # x[mask]: a gather copy
    ("call_function", "max", True, 2, False, "elementwise"),  # torch.max(a, b)
    ("call_function", "max", False, 1, False, "reduction"),  # torch.max(a, dim) -> tuple
    ("call_module", "Dropout", True, 1, False, HOST),  # identity under eval()
    ("call_module", "Dropout", True, 1, True, "elementwise"),  # a mask kernel when training
    ("call_function", "frobnicate", True, 1, False, UNCLASSIFIED),  # unknown: counted
])
def test_fx_family_table(op, target, is_tensor, inputs, training, family):
    assert fx_family(op, target, is_tensor=is_tensor, tensor_inputs=inputs,
                     training=training) == family


def test_reader_classifies_and_repeats_the_first_block(tmp_path):
    nodes = read_per_node_csv(_write_csv(tmp_path / "run.csv"), num_layer=3)
    got = {n.name: (n.target, n.family, n.repeats) for n in nodes}
    assert got["dense"] == ("Linear", "matmul", 3)  # module class from nn_module_stack
    assert got["softmax"] == ("softmax", "softmax", 3)
    assert got["view"] == ("view", HOST, 3)
    assert got["add"] == ("add", HOST, 1) and got["add_1"] == ("add", "elementwise", 1)
    assert got["getitem"] == ("getitem", "movement", 1)
    assert got["frobnicate"][1] == UNCLASSIFIED
    # num_layer 0: the CSV is the whole model, nothing repeats
    assert {n.repeats for n in read_per_node_csv(tmp_path / "run.csv")} == {1}


def test_reader_keeps_the_recorded_shapes_for_same_shape_checks(tmp_path):
    # benchmarks/data_consistency.py matches a Linear node to the kernel sweep by
    # (rows, in, out): rows = 2 * 8 = 16, in = 16, out = the output's last dim, 32.
    rows = [r + ("(2, 8, 32)" if r[-1] == "dense" else "",) for r in ROWS]
    nodes = read_per_node_csv(_write_csv(tmp_path / "s.csv", rows, HEADER + ["output_shape"]))
    dense = next(n for n in nodes if n.name == "dense")
    assert (dense.input_shapes, dense.output_shape) == ("[[2, 8, 16]]", "(2, 8, 32)")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data_consistency.py"
    spec = importlib.util.spec_from_file_location("data_consistency", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.gemm_dims(dense) == (16, 16, 32)
    softmax = next(n for n in nodes if n.name == "softmax")
    assert bench.gemm_dims(softmax) is None  # not a GEMM module


def test_reader_names_the_missing_column_and_the_bad_value(tmp_path):
    with pytest.raises(ConfigError, match="missing column.*acc_latency"):
        read_per_node_csv(_write_csv(tmp_path / "a.csv", [r[:7] + r[8:] for r in ROWS],
                                     HEADER[:7] + HEADER[8:]))
    bad = [ROWS[0], ROWS[1][:5] + ("fast",) + ROWS[1][6:]]
    with pytest.raises(ConfigError, match=r"line 3 \(size\).*'fw_latency'.*'fast'"):
        read_per_node_csv(_write_csv(tmp_path / "b.csv", bad))


def _label(tmp_path: Path, mode: str, measured_ms: float, passes: str = "{}") -> Label:
    (tmp_path / "tiny-inf-8-2.json").write_text(passes)
    return Label(tmp_path / "tiny-inf-8-2.json", "NVIDIA_L4", load_device("l4"), "tiny",
                 tmp_path / "tiny.json", mode, 8, 2, "plain", measured_ms)


def test_compare_run_sums_each_family_and_phase(tmp_path):
    nodes = read_per_node_csv(_write_csv(tmp_path / "run.csv"), num_layer=3, training=True)
    forecast = analyze(onnx.parser.parse_model(TINY), "l4", predictor="roofline")
    passes = '{"fw_latency": 4.714, "bwall_latency": 4.59}'
    run = compare_run(_label(tmp_path, "training", 10.0, passes), nodes, forecast)
    rows = {(r.phase, r.family): r for r in run.rows}
    # the block's Linear x 3 layers: forward 0.5 * 3, backward 1.0 * 3; its .grad += 0.2 * 3
    assert rows[("forward", "matmul")].measured_ms == pytest.approx(1.5)
    assert rows[("forward", "matmul")].nodes == 3
    assert rows[("backward", "matmul")].measured_ms == pytest.approx(3.0)
    assert rows[("accumulate", "elementwise")].measured_ms == pytest.approx(0.6)
    # elementwise: add_1 (0.1) and, when training, the dropout (0.02)
    assert rows[("forward", "elementwise")].measured_ms == pytest.approx(0.12)
    assert rows[("backward", "elementwise")].measured_ms == pytest.approx(0.09)
    # predicted: the forecast's own kernels of each family; the Transpose is movement
    for family in ("matmul", "softmax", "movement"):
        row = rows[("forward", family)]
        assert row.predicted_ms == pytest.approx(forecast.by_family[family], abs=1e-4)
        assert row.ratio == pytest.approx(row.predicted_ms / row.measured_ms, abs=1e-3)
    assert rows[("forward", "host")].predicted_ms == 0 and rows[("forward", "host")].kernels == 0
    # host: size 0.010 + int add 0.011 + the block's view 0.012 * 3
    assert run.host_ms == pytest.approx(0.057)
    # every non-host node, all phases: Linear (0.5+1.0+0.2)*3, softmax (0.2+0.3)*3, add_1
    # 0.1+0.05, getitem 0.05, dropout 0.02+0.04, the unclassified frobnicate 0.03
    kernels = 1.7 * 3 + 0.5 * 3 + 0.15 + 0.05 + 0.06 + 0.03
    assert run.kernel_ms == pytest.approx(kernels)
    assert run.gap_ms == pytest.approx(10.0 - kernels)
    assert run.unclassified == ("frobnicate",)
    # measured passes beside their nodes (host nodes included). Forward: size .010 + add .011
    # + dense 0.5 * 3 + softmax 0.2 * 3 + view .012 * 3 + add_1 .1 + getitem .05 + drop .02
    # + frobnicate .03 = 2.357; backward with the accumulation: dense 1.2 * 3 + softmax
    # 0.3 * 3 + add_1 .05 + drop .04 = 4.59
    phases = {p.phase: (p.nodes_ms, p.ratio) for p in run.phases}
    assert phases == {"forward": (pytest.approx(2.357), pytest.approx(2.0)),
                      "backward": (pytest.approx(4.59), pytest.approx(1.0))}
    # an inference forecast has no backward kernels to set beside the backward pass
    assert [p.forecast_ms for p in run.phases] == [pytest.approx(forecast.total_ms, abs=1e-4),
                                                   0.0]


# Attention scores at batch 2: q and k permuted (0, 2, 1, 3) then multiplied. torch.matmul
# copies both (their batch dims do not merge; analyzer/views.py) inside the matmul node, and
# tilecast's two costed Transposes stand for those copies; the output's Transpose is movement.
SCORES = """
<ir_version: 8, opset_import: ["" : 17]>
scores (float[2, 8, 4, 16] q, float[2, 8, 4, 16] k) => (float[2, 8, 4, 8] out) {
    qp = Transpose<perm = [0, 2, 1, 3]>(q)
    kp = Transpose<perm = [0, 2, 1, 3]>(k)
    kt = Transpose<perm = [0, 1, 3, 2]>(kp)
    y = MatMul(qp, kt)
    out = Transpose<perm = [0, 2, 1, 3]>(y)
}
"""


def test_transposes_read_only_by_gemms_count_as_matmul(tmp_path):
    model = onnx.parser.parse_model(SCORES)
    for i, n in enumerate(model.graph.node):
        n.name = f"n{i}"
    onnx.save(model, tmp_path / "scores.onnx")
    copies = gemm_operand_copies(tmp_path / "scores.onnx")
    assert copies == {"n0", "n1", "n2"}  # not n4: a graph output
    forecast = analyze(model, "l4", predictor="roofline")
    nodes = read_per_node_csv(_write_csv(tmp_path / "run.csv"))
    plain = {(r.phase, r.family): r for r in compare_run(
        _label(tmp_path, "inference", 1.0), nodes, forecast).rows}
    booked = {(r.phase, r.family): r for r in compare_run(
        _label(tmp_path, "inference", 1.0), nodes, forecast, as_matmul=copies).rows}
    # n2 is a view (a last-two swap); n0 and n1 are costed and move to matmul, n4 stays
    assert plain[("forward", "movement")].kernels == 3
    assert booked[("forward", "movement")].kernels == 1
    assert booked[("forward", "matmul")].kernels == 3
    assert booked[("forward", "matmul")].predicted_ms == pytest.approx(
        plain[("forward", "matmul")].predicted_ms + plain[("forward", "movement")].predicted_ms
        - booked[("forward", "movement")].predicted_ms, abs=1e-4)


def _mm(shapes: str, contiguous: str) -> FxNode:
    return FxNode("matmul", "call_function", "matmul", "matmul", 1, 1.0, 0.0, 0.0, shapes, "",
                  contiguous)


@pytest.mark.parametrize("node, inside", [
    # BERT / GPT-2: q @ k^T on permuted heads: torch.matmul reshapes (copies) both inside
    (_mm("[[8, 16, 512, 64], [8, 16, 64, 512]]", "[False, False]"), True),
    # OPT: .contiguous() heads, bmm on 3-D; a transposed 3-D operand is no copy
    (_mm("[[64, 2048, 64], [64, 64, 2048]]", "[True, False]"), False),
    (_mm("[[8, 16, 512, 64], [8, 16, 64, 512]]", "[True, True]"), False),
    (_mm("[[8, 16, 512, 64], [8, 16, 64, 512]]", ""), False),  # column not recorded
])
def test_copies_inside_matmul_reads_the_csvs_contiguity(node, inside):
    assert copies_inside_matmul([node]) is inside


@pytest.fixture
def labels_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    labels, models = tmp_path / "labels", tmp_path / "models"
    (labels / "NVIDIA_L4").mkdir(parents=True)
    models.mkdir()
    (models / "tiny.json").write_text('{"model_type": "gpt2"}')
    (labels / "NVIDIA_L4" / "tiny-inf-8-2.json").write_text(
        '{"num_layer": 3, "e2e_latency": 4.0}')
    _write_csv(labels / "NVIDIA_L4" / "tiny-inf-8-2.csv")
    (labels / "NVIDIA_L4" / "tiny-inf-8-2-fusion.json").write_text('{"e2e_latency": 3.0}')

    def fake_export(config, *, output, **kwargs):  # the cache miss writes the tiny graph
        onnx.save(onnx.parser.parse_model(TINY), output)

    monkeypatch.setattr("tilecast.exporters.export_model", fake_export)
    return labels


def test_cli_by_family_json_table_and_markdown(labels_tree, tmp_path):
    args = ["evaluate", str(labels_tree), "--by-family", "--predictor", "roofline",
            "--cache", str(tmp_path / "cache")]
    res = CliRunner().invoke(main, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    (run,) = data["runs"]
    rows = {(r["phase"], r["family"]): r for r in run["rows"]}
    forecast = analyze(onnx.parser.parse_model(TINY), "l4", predictor="roofline")
    assert rows[("forward", "matmul")]["measured_ms"] == pytest.approx(1.5)
    # families compare kernels timed alone, as the per-node CSV does (launch included), not
    # what each adds to the step when queued
    softmax = [k.kernel for k in forecast.kernels if k.kernel.family == "softmax"]
    alone = sum(p.latency_ms for p in RooflinePredictor().predict(softmax, forecast.device))
    assert rows[("forward", "softmax")]["predicted_ms"] == pytest.approx(alone, abs=1e-4)
    assert run["predicted_ms"] == pytest.approx(forecast.total_ms, abs=1e-3)
    assert run["gap_ms"] == pytest.approx(4.0 - run["kernel_ms"], abs=1e-3)
    assert [s["reason"] for s in data["skipped"]] == ["no per-node CSV beside it"]
    table = CliRunner().invoke(main, args).stdout
    assert "per-node kernels" in table and "frobnicate" in table
    assert "all runs, per GPU and mode:" in table
    markdown = CliRunner().invoke(main, [*args, "--format", "markdown"]).stdout
    assert "| phase | family | measured_ms |" in markdown


def test_no_per_node_csv_is_one_error_line(labels_tree, tmp_path):
    (labels_tree / "NVIDIA_L4" / "tiny-inf-8-2.csv").unlink()
    with pytest.raises(ConfigError, match="with a per-node CSV"):
        evaluate_by_family(labels_tree, cache_dir=tmp_path / "cache", predictor="roofline")
    res = CliRunner().invoke(main, ["evaluate", str(labels_tree), "--by-family"])
    assert res.exit_code == 2 and res.output.startswith("Error:")


def test_every_fx_target_of_the_shared_csvs_is_classified(dataset_dir):
    labels = dataset_dir / "labels"
    for path in sorted(labels.glob("*/*.csv")):
        nodes = read_per_node_csv(path, training="-train-" in path.name)
        assert not [n.target for n in nodes if n.family == UNCLASSIFIED], path


def test_repeated_block_makes_the_per_node_sum_the_step(dataset_dir):
    # V100 GPT-2 large, 36 layers; the CSV holds one block. Repeated, its kernels add up to
    # the measured step (104 % of it); counted once they would be about 1/36 of it.
    path = dataset_dir / "labels" / "Tesla_V100-PCIE-32GB" / "gpt2_large-inf-1024-4"
    e2e = json.loads(path.with_suffix(".json").read_text())
    nodes = read_per_node_csv(path.with_suffix(".csv"), num_layer=e2e["num_layer"])
    kernel_ms = sum(n.forward_ms * n.repeats for n in nodes if n.family != HOST)
    assert kernel_ms == pytest.approx(e2e["e2e_latency"], rel=0.1)


def test_batch_scaling_pairs_runs_that_differ_only_in_the_batch():
    # benchmarks/batch_scaling.py: batch 2 -> 8 measured 100 -> 350 ms (3.5x), forecast
    # 110 -> 330 ms (3.0x): the forecast grows 3.0 / 3.5 = 0.857 as fast. The fusion run and
    # the other GPU's run share no group with them, so they pair with nothing.
    from tilecast.evaluation.runner import Run

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "batch_scaling.py"
    spec = importlib.util.spec_from_file_location("batch_scaling", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def run(gpu, batch, measured, predicted, variant="plain"):
        return Run(gpu, "bert", "training", batch, 512, variant, measured, predicted, 0.0, None)

    runs = [run("G", 8, 350.0, 330.0), run("G", 2, 100.0, 110.0),
            run("G", 8, 300.0, 300.0, "fusion"), run("H", 2, 50.0, 50.0)]
    (row,) = bench.scaling_rows(runs)
    assert (row["gpu"], row["batches"]) == ("G", "2->8")
    assert row["measured_ratio"] == pytest.approx(3.5)
    assert row["forecast_ratio"] == pytest.approx(3.0)
    assert row["quotient"] == pytest.approx(3.0 / 3.5)


def test_attention_passes_use_the_scalar_divide_as_the_streaming_rate():
    # benchmarks/data_consistency.py check 4: the divide's forward on [2, 4, 8, 8] (2 passes)
    # takes 1 ms, so softmax's 3 ms backward is 6 passes and dropout's 2.25 ms is 4.5; a
    # node on another shape, and inference runs, have no reference and are not counted.
    from types import SimpleNamespace

    from tilecast.evaluation.fx_nodes import FxNode

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "data_consistency.py"
    spec = importlib.util.spec_from_file_location("data_consistency", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def node(target, fw, bw, shape="[[2, 4, 8, 8]]"):
        return FxNode(target, "call_function", target, "elementwise", 1, fw, bw, 0.0, shape)

    nodes = (node("truediv", 1.0, 1.0), node("softmax", 1.0, 3.0),
             node("Dropout", 1.2, 2.25), node("softmax", 1.0, 9.0, "[[2, 4, 8, 16]]"))
    train = SimpleNamespace(mode="training", gpu="G")
    infer = SimpleNamespace(mode="inference", gpu="H")
    lines = bench.attention_passes([(train, nodes), (infer, nodes)])
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in lines[2:]}
    assert rows == {("G", "dropout"): ["1", "4.50", "4.50", "4.50"],
                    ("G", "softmax"): ["1", "6.00", "6.00", "6.00"]}



@pytest.mark.parametrize("shapes, want", [
    # GPT-3 2.7B at batch 8: 8 x 32 heads of 80 over 2048 tokens. Q (.., 2048, 80) times the
    # transposed key view (.., 80, 2048): Q K^T, (B, M, N, K) = (256, 2048, 2048, 80)
    ("[[8, 32, 2048, 80], [8, 32, 80, 2048]]", ("qk", (256, 2048, 2048, 80))),
    # the scores (.., 2048, 2048) times V (.., 2048, 80): P V, reduction over the tokens
    ("[[8, 32, 2048, 2048], [8, 32, 2048, 80]]", ("pv", (256, 2048, 80, 2048))),
    ("[[16, 64], [64, 32]]", None),  # a 2-D GEMM is no attention product
    ("[[2, 4, 8, 16], [2, 4, 32, 8]]", None),  # inner dims differ: not a product
    ("not a shape", None),
])
def test_attention_layout_classifies_the_two_products(shapes, want):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "attention_layout.py"
    spec = importlib.util.spec_from_file_location("attention_layout", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    got = bench.product(shapes)
    assert (got and (got[0], (got[1].b, got[1].m, got[1].n, got[1].k))) == (want or None)
    assert got is None or got[1].batched
