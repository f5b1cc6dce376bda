"""Data loading and training of the learned predictor: a tiny synthetic folder (fast), and
checks against the shared NeuSight data when it is present."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from tilecast.learned.dataset import KernelSamples, data_hash, load_kernels

GPUS = ("Tesla T4", "NVIDIA A100-PCIE-40GB")
HEADER = ["OPName", "Latency", "Device", "Kernel Name", "Grid x", "Grid y", "Grid z",
          "Block x", "Block y", "Block z"]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _row(op: str, gpu: str, latency: float, kernel: str, **dims: int) -> dict:
    return {"OPName": op, "Latency": latency, "Device": gpu, "Kernel Name": kernel,
            "Grid x": 1, "Grid y": 1, "Grid z": 1, "Block x": 128, "Block y": 1, "Block z": 1,
            **dims}


def make_dataset(root: Path, n: int = 24, seed: int = 0) -> Path:
    """kernels/nvidia/{train,eval}: bmm, linear, add, softmax, ln on two GPUs, latency a
    made-up function of the size (the smoke test checks plumbing, not accuracy)."""
    rng = np.random.default_rng(seed)
    base = root / "kernels" / "nvidia"
    for gpu in GPUS:
        scale = 1.0 if gpu == GPUS[0] else 0.4
        files: dict[str, list[dict]] = {}
        for _ in range(n):
            b, m, nn, k = (int(2 ** rng.uniform(2, 9)) for _ in range(4))
            lat = 0.02 + scale * 2 * b * m * nn * k / 4e12 * 1e3
            files.setdefault("bmm", []).append(
                _row("bmm", gpu, lat, "volta_sgemm_64x64_nn", B=b, M=m, N=nn, K=k))
            files.setdefault("linear", []).append(
                _row("linear", gpu, lat / b, "volta_sgemm_128x64_tn", B=1, M=m, N=nn, K=k))
            rows, cols = int(2 ** rng.uniform(2, 13)), int(2 ** rng.uniform(2, 12))
            lat = 0.02 + scale * 12 * rows * cols / 2e11 * 1e3
            files.setdefault("add", []).append(_row("add", gpu, lat, "elementwise_kernel",
                                                    B=rows, H=cols))
            files.setdefault("softmax", []).append(_row("softmax", gpu, lat, "softmax",
                                                        B=rows, H=cols))
            files.setdefault("ln", []).append(_row("ln", gpu, lat * 1.2, "layer_norm",
                                                   B=rows, H=4 * cols))
        tag = gpu.replace(" ", "_")
        for op, rows_ in files.items():
            _write(base / "train" / op / f"{tag}.csv", rows_)
    for op, name in (("bmm", "bmm"), ("linear", "linear"), ("add", "elem"),
                     ("softmax", "softmax"), ("ln", "ln")):
        rows_ = []
        for gpu in GPUS:
            with (base / "train" / op / f"{gpu.replace(' ', '_')}.csv").open() as fh:
                rows_ += list(csv.DictReader(fh))[:4]
        _write(base / "eval" / f"{name}.csv", rows_)
    return root


def test_loader_costs_follow_the_conventions(tmp_path: Path) -> None:
    root = make_dataset(tmp_path)
    s = load_kernels([root], "train")
    assert set(s.family) == {"matmul", "elementwise", "softmax", "layernorm"}
    assert len(s) == 2 * 5 * 24 and (s.dtype == "float32").all()
    i = int(np.nonzero(s.op == "bmm")[0][0])
    b, m, n, k = s.b[i], s.m[i], s.n[i], s.k[i]
    assert s.flops[i] == 2 * b * m * n * k  # one FMA = 2 FLOPs
    assert s.bytes[i] == 4 * b * (m * k + k * n + m * n)
    j = int(np.nonzero(s.op == "add")[0][0])
    assert s.bytes[j] == 12 * s.elements[j]  # two fp32 inputs, one output
    ev = load_kernels([root], "eval")
    assert len(ev) == 5 * 2 * 4
    # The hash covers names and bytes of the training CSVs, and changes with them.
    h = data_hash([root])
    assert len(h) == 64 and h == data_hash([root])
    (root / "kernels/nvidia/train/add/Tesla_T4.csv").write_text("OPName,Latency,Device\n")
    assert data_hash([root]) != h


def test_loader_rejects_empty_folder(tmp_path: Path) -> None:
    from tilecast.errors import ConfigError

    with pytest.raises(ConfigError, match="no nvidia train kernel CSVs"):
        load_kernels([tmp_path], "train")


def test_training_smoke_exports_a_loadable_deterministic_predictor(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="training needs torch (pip install 'tilecast[train]')")
    pytest.importorskip("sklearn", reason="the tile table needs scikit-learn")
    from tilecast.analyzer.types import Kernel, MatmulDims, OpCost
    from tilecast.device_db.loader import load_device
    from tilecast.learned.export import ARTIFACT_NAME
    from tilecast.learned.predictor import OnnxPredictor
    from tilecast.learned.train import TrainConfig, train_all

    root = make_dataset(tmp_path / "data")
    config = TrainConfig(hidden=(8,), epochs=2, batch_size=16, devices=GPUS)
    lines: list[str] = []
    outs = []
    for run in ("a", "b"):
        scores = train_all([root], tmp_path / run, config, progress=lines.append)
        assert set(scores) == {"matmul", "elementwise", "softmax", "layernorm"}
        assert all(math.isfinite(v) for v in scores.values())
        outs.append(OnnxPredictor(tmp_path / run / ARTIFACT_NAME))
    assert any("val MAPE" in line and "epoch   2/2" in line for line in lines)
    assert (tmp_path / "a" / "tile_table.json").is_file()
    assert outs[0].metadata["training_data_sha256"] == data_hash([root])
    k = Kernel("mm", ("mm",), "MatMul", OpCost("matmul", 2 * 8 * 64**3, 4 * 8 * 3 * 64**2,
                                                "float32", "matrix",
                                                matmul=MatmulDims(8, 64, 64, 64)))
    dev = load_device("NVIDIA L4")
    a, b = (o.predict([k], dev)[0].latency_ms for o in outs)
    assert a == b and a > 0  # same seed, same data: the same model


@pytest.fixture(scope="module")
def shared_train(dataset_dir: Path):
    return load_kernels([dataset_dir], "train")


def test_shared_data_row_kernel_grids_match_the_tile_rules(shared_train) -> None:
    from tilecast.learned import row_tiles as rt

    s = shared_train
    assert len(s) > 200_000 and {"Tesla T4", "NVIDIA A100-PCIE-40GB"} <= set(s.device)
    for family, rule in (("softmax", lambda x: rt.softmax_tiles(x.rows, x.cols, x.itemsize)),
                         ("layernorm", lambda x: rt.layernorm_tiles(x.rows))):
        x = s.select(s.family == family)
        blocks, _, threads = rule(x)
        assert (blocks == x.grid).all() and (threads == x.block_threads).all(), family
    x = s.select(s.family == "elementwise")
    assert (rt.elementwise_tiles(x.elements, x.itemsize)[0] == x.grid).all()


def test_shared_data_amd_block_softmax_launches_match_the_rocm_rule(dataset_dir: Path) -> None:
    from tilecast.learned import row_tiles as rt

    s = load_kernels([dataset_dir], "train", vendor="amd")
    x = s.select((s.family == "softmax")
                 & (s.cols * s.itemsize > rt.SOFTMAX_WARP_MAX_BYTES))
    assert len(x) >= 1000  # 700 rows per GPU, MI100 and MI210
    blocks, _, threads = rt.softmax_tiles(x.rows, x.cols, x.itemsize, amd=np.ones(len(x)))
    assert (threads == x.block_threads).all() and (blocks == x.grid).all()
    assert not (rt.softmax_tiles(x.rows, x.cols, x.itemsize)[2] == x.block_threads).any()


def test_shared_data_tile_table_on_held_out_shapes(dataset_dir: Path, shared_train) -> None:
    pytest.importorskip("sklearn", reason="the tile table needs scikit-learn")
    from tilecast.learned import prepare

    train = shared_train
    table = prepare.fit_tiles(train.select(np.isin(train.device, prepare.TRAIN_DEVICES)))
    ev = load_kernels([dataset_dir], "eval")
    ev = ev.select((ev.device == "NVIDIA A100-PCIE-40GB") & (ev.op == "bmm"))
    fam, layout, x = prepare.matmul_tree_inputs(ev, [prepare.default_lookup(ev.device[0])],
                                                np.zeros(len(ev), dtype=np.int64))
    picked, _ = table.select("ampere", layout, x)
    assert np.mean(picked == prepare.measured_tiles(ev)) > 0.95


def test_shared_data_dims_convention_reproduces_the_launch_grids(shared_train) -> None:
    """The CSVs' B, M, N, K mean (B x M x N) @ (B x N x K) (N the reduction): with tilecast's
    dims read from them, its own tile count (b * ceil(n / tm) * ceil(m / tn)) divides the
    recorded grid x*y*z (the quotient is the split-K count) on >= 99 % of the bmm rows whose
    kernel name carries a tile, and times the split read it is the grid itself; with the old,
    swapped reading it is the grid on fewer than half of them."""
    from tilecast.learned import tiles as tl
    from tilecast.learned.prepare import measured_tiles

    s = shared_train.select(shared_train.op == "bmm")
    named = np.array([tl.parse_tile(k) is not None for k in s.kernel_name])
    s = s.select(named)
    tm, tn = tl.split_tiles(measured_tiles(s))
    tiles = s.b * np.ceil(s.n / tm) * np.ceil(s.m / tn)
    assert len(s) > 80_000 and np.mean(s.grid % tiles == 0) >= 0.99
    assert np.mean(tiles * s.split_k == s.grid) >= 0.99
    swapped = s.b * np.ceil(s.k / tm) * np.ceil(s.m / tn)  # the old reading
    assert np.mean(swapped * s.split_k == s.grid) < 0.5


# Launches of one kernel name, (op, (b, m, n, k), grid x, y, z) -> split read. Derivations:
# 128x128 tiles of m = 1024, n = 2560 are 20 x 8 = 160; a 4 x 10 x 4 grid is 160 blocks, so its
# z carries tiles (the P4's NT_vec), split 1; a 20 x 8 x 3 grid is 3 x 160: split-K 3; a bmm of
# batch 6 on 20 x 8 x 12 is 6 x 160 x 2: split 2; 32x32 tiles of a 64 x 64 bmm of batch 4 are
# 16, and a 2 x 2 x 4 grid holds exactly those (split 1, where z // b reads 1 too); at batch 2
# (8 tiles) the same grid is 2 x 8: split 2. Tensile names its split (GSU3).
SPLIT_CASES = [
    ("linear", (1, 1024, 2560, 4096), "sgemm_128x128x8_NT_vec", (4, 10, 4), 1),
    ("linear", (1, 1024, 2560, 4096), "ampere_sgemm_128x128_tn", (20, 8, 3), 3),
    ("bmm", (6, 1024, 2560, 4096), "ampere_sgemm_128x128_nn", (20, 8, 12), 2),
    ("bmm", (4, 64, 64, 4096), "sgemm_32x32x32_NN", (2, 2, 4), 1),
    ("bmm", (2, 64, 64, 4096), "sgemm_32x32x32_NN", (2, 2, 4), 2),
    ("linear", (1, 1024, 2560, 4096), "Cijk_Ailk_Bljk_SB_MT64x64x16_GSU3_SN", (256, 48, 1), 3),
]


@pytest.mark.parametrize(("op", "dims", "name", "grid", "split"), SPLIT_CASES)
def test_split_k_of_row_reads_tiles_spread_over_z_as_unsplit(op, dims, name, grid, split) -> None:
    from tilecast.learned.dataset import split_k_of_row

    row = {"Kernel Name": name, **{f"Grid {a}": str(g) for a, g in zip("xyz", grid, strict=True)}}
    assert split_k_of_row(op, dims, row) == split


def test_cli_train_then_kernels_eval_json(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="training needs torch (pip install 'tilecast[train]')")
    pytest.importorskip("sklearn", reason="the tile table and direct baseline need scikit-learn")
    import json

    from click.testing import CliRunner

    from tilecast.cli import main

    root = make_dataset(tmp_path / "data")
    out = tmp_path / "model"
    runner = CliRunner()
    r = runner.invoke(main, ["train", "--data", str(root), "-o", str(out), "--epochs", "1"])
    assert r.exit_code == 0, r.output
    assert "validation MAPE" in r.output and (out / "tilecast_predictor.onnx").is_file()
    r = runner.invoke(main, ["kernels-eval", "--data", str(root), "--predictor",
                             str(out / "tilecast_predictor.onnx"), "--format", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert {row["predictor"] for row in rows} == {"tilecast", "roofline", "direct"}
    assert {row["family"] for row in rows} == {"matmul", "linear", "elementwise", "softmax",
                                               "layernorm"}
    assert {row["gpu"] for row in rows} == set(GPUS)
    assert all(row["n"] == 4 and row["mape_pct"] >= 0 for row in rows)
    r = runner.invoke(main, ["kernels-eval", "--data", str(tmp_path / "nothing")])
    assert r.exit_code == 2  # a missing folder is bad input, not a traceback


@pytest.mark.parametrize("n_members", [1, 2, 3])
@pytest.mark.parametrize("family", ["matmul", "elementwise"])
def test_exported_graph_computes_the_trained_form(family: str, n_members: int) -> None:
    """The ONNX export and the torch model are one form: random weights (every head) and
    work terms spanning 1e-4..1e4 ms give the same latency in both, for one model and for an
    ensemble (the median of its members' latencies in both)."""
    torch = pytest.importorskip("torch", reason="the torch form needs torch")
    import onnxruntime as ort

    from tilecast.learned import export
    from tilecast.learned import features as ft
    from tilecast.learned.model import Ensemble, LatencyMLP
    from tilecast.learned.train import to_weights

    names, n = ft.FEATURES[family], 256
    rng = np.random.default_rng(1)
    members = [LatencyMLP(names, (8, 8), "silu", u_floor=0.05, host_ms=0.02)
               for _ in range(n_members)]
    with torch.no_grad():
        for param in (p for m in members for p in m.parameters()):
            param.normal_(0.0, 1.0)
    model = Ensemble(members)
    x = rng.normal(size=(n, len(names))).astype(np.float32)
    x[:, names.index("amd")] = rng.integers(0, 2, n)  # a 0/1 flag, as served
    terms = {t: np.exp(rng.uniform(np.log(1e-4), np.log(1e4), n)).astype(np.float32)
             for t in export.TERMS}
    terms["launch_ms"] = np.full(n, 0.005, np.float32)
    with torch.no_grad():
        want = np.exp(model.log_latency(torch.from_numpy(x), {
            k: torch.from_numpy(np.log(v)) for k, v in terms.items()}).numpy())
    weights = to_weights(model, family)
    assert len(weights) == n_members
    proto = export.build_model(weights, export.metadata_for(weights, ft.UNITS, {}))
    io = export.io_names(family)
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got, = session.run([io["latency_ms"]], {io["features"]: x} | {io[t]: v for t, v
                                                                   in terms.items()})
    np.testing.assert_allclose(got, want, rtol=2e-3)


# target - pred = e; loss = 2 max(q e, (q - 1) e): an over-forecast (e < 0) costs 2 (1 - q) |e|,
# an under-forecast 2 q |e|; q = 0.5 is the plain mean |e|.
@pytest.mark.parametrize(("q", "pred", "target", "want"), [
    (0.5, [0.0, 0.0], [1.0, -1.0], 1.0),
    (0.3, [0.0], [1.0], 0.6),  # under-forecast by 1: 2 * 0.3
    (0.3, [1.0], [0.0], 1.4),  # over-forecast by 1: 2 * 0.7
    (0.3, [2.0, 0.0], [2.0, 0.0], 0.0),
])
def test_quantile_loss_table(q: float, pred: list, target: list, want: float) -> None:
    torch = pytest.importorskip("torch", reason="training needs torch")
    from tilecast.learned.train import quantile_loss

    got = quantile_loss(torch.tensor(pred), torch.tensor(target), q)
    assert float(got) == pytest.approx(want)


def test_default_quantiles_per_family() -> None:
    pytest.importorskip("torch", reason="training needs torch")
    from tilecast.learned.train import TrainConfig

    c = TrainConfig()
    assert c.quantile("matmul") == 0.3
    assert {c.quantile(f) for f in ("elementwise", "softmax", "layernorm", "conv")} == {0.5}


def test_logo_table_shows_the_held_out_shapes_column_and_its_mean():
    # cv.logo adds a SHAPES row per fold x family (tilecast on the left-out GPU's eval split);
    # the table shows it as its own column and summary() averages it apart from tilecast's.
    from tilecast.learned.cv import summary
    from tilecast.learned.evaluate import SHAPES, EvalRow, format_table

    rows = [EvalRow("G1", "softmax", "tilecast", 100, 20.0),
            EvalRow("G1", "softmax", "roofline", 100, 50.0),
            EvalRow("G1", "softmax", SHAPES, 10, 12.0),
            EvalRow("G2", "softmax", "tilecast", 100, 30.0),
            EvalRow("G2", "softmax", SHAPES, 10, 16.0)]
    head, _, g1, g2 = format_table(rows).splitlines()
    assert head.split()[-1] == SHAPES
    assert g1.split()[-3:] == ["20.0%", "50.0%", "12.0%"]
    assert g2.split()[-3:] == ["30.0%", "-", "16.0%"]
    assert summary(rows) == {"softmax": 25.0}
    assert summary(rows, SHAPES) == {"softmax": 14.0}


def test_table_columns_line_up_with_long_family_names():
    from tilecast.learned.evaluate import EvalRow, format_table

    rows = [EvalRow("G1", "conv", "tilecast", 10, 20.0),
            EvalRow("G1", "conv, recorded", "tilecast", 10, 30.0)]
    head, _, short, long_ = format_table(rows).splitlines()
    assert len({len(head), len(short), len(long_)}) == 1


def test_shared_data_amd_split_u_reproduces_the_launch_grids(dataset_dir: Path) -> None:
    """Tensile's GlobalSplitU (``_GSU3_`` in the kernel name) splits the reduction along grid
    y: with it as the split count, tilecast's block count b * ceil(n / MT0) * ceil(m / MT1) *
    split is the recorded workgroup count on every AMD matmul row (220 of them split)."""
    from tilecast.learned import tiles as tl
    from tilecast.learned.prepare import measured_tiles

    s = KernelSamples.concat([load_kernels([dataset_dir], split, vendor="amd")
                              for split in ("train", "eval")])
    s = s.select(s.family == "matmul")
    tm, tn = tl.split_tiles(measured_tiles(s))
    blocks = s.b * np.ceil(s.n / tm) * np.ceil(s.m / tn) * s.split_k
    assert len(s) > 6000 and (s.split_k > 1).sum() >= 200
    assert (blocks == s.grid / s.block_threads).all()  # AMD's grid x counts threads


def test_logo_repeats_use_disjoint_seeds_and_average_the_folds() -> None:
    # Members of one run train from seed, seed + 1, seed + 2 (ensemble 3): the next run starts
    # at seed + 3, so no member is shared. Averages: (20 + 30) / 2 = 25, (12 + 18) / 2 = 15.
    pytest.importorskip("torch", reason="the protocol trains models")
    from tilecast.learned.conv_train import ConvFold, average_folds
    from tilecast.learned.cv import average_rows, repeat_seeds
    from tilecast.learned.evaluate import SHAPES, EvalRow
    from tilecast.learned.train import TrainConfig

    assert repeat_seeds(3) == (0, 3, 6)
    assert repeat_seeds(2, TrainConfig(seed=5, ensemble=1)) == (5, 6)
    runs = [[EvalRow("G1", "softmax", "tilecast", 100, 20.0),
             EvalRow("G1", "softmax", SHAPES, 10, 12.0)],
            [EvalRow("G1", "softmax", "tilecast", 100, 30.0),
             EvalRow("G1", "softmax", SHAPES, 10, 18.0)]]
    assert [(r.predictor, r.n, r.mape_pct) for r in average_rows(runs)] == [
        ("tilecast", 100, 25.0), (SHAPES, 10, 15.0)]
    folds = average_folds([[ConvFold("G1", 50, 20.0, 40.0, 0.6, 30.0)],
                           [ConvFold("G1", 50, 24.0, 40.0, 0.7, 34.0)]])
    assert folds == [ConvFold("G1", 50, 22.0, 40.0, pytest.approx(0.65), 32.0)]


def test_logo_spread_lines_show_each_run() -> None:
    from tilecast.learned.commands import _spread_lines

    runs = [{"seed": 0, "mean": {"softmax": 19.3}, "shapes": {"softmax": 11.1}, "conv_mean": 23.7},
            {"seed": 3, "mean": {"softmax": 21.0}, "shapes": {"softmax": 10.0}, "conv_mean": 22.0}]
    assert _spread_lines(runs[:1]) == ""
    text = _spread_lines(runs)
    assert "softmax        1.7 /   1.1  (runs: 19.3/11.1, 21.0/10.0)" in text
    assert "conv           1.7  (runs: 23.7, 22.0)" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--repeats", "2"], "use it with --cv logo"),
    (["--repeats", "0", "--cv", "logo"], "'--repeats'"),
    (["--family", "softmax"], "use it with --cv logo"),
    (["--family", "sofmax", "--cv", "logo"], "'sofmax' is not a trained family"),
])
def test_kernels_eval_options_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    from click.testing import CliRunner

    from tilecast.cli import main

    root = make_dataset(tmp_path / "data")
    r = CliRunner().invoke(main, ["kernels-eval", "--data", str(root), *args])
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output


def _softmax_only(tmp_path: Path):
    """(synthetic data folder, a quick config that trains the softmax family alone)."""
    pytest.importorskip("torch", reason="the protocol trains models")
    pytest.importorskip("sklearn", reason="the tile table needs scikit-learn")
    from tilecast.learned.train import TrainConfig

    return make_dataset(tmp_path / "data"), TrainConfig(
        hidden=(8,), epochs=1, batch_size=16, ensemble=1, devices=GPUS, families=("softmax",))


def test_logo_of_one_family_trains_and_scores_only_it(tmp_path: Path) -> None:
    # `kernels-eval --cv logo --family softmax`: each fold's artifact holds the softmax model
    # alone, and only softmax rows are scored (a partial artifact refuses other families).
    root, config = _softmax_only(tmp_path)
    from tilecast.learned.cv import logo

    rows = logo([root], config, gpus=GPUS)
    assert {r.family for r in rows} == {"softmax"}
    assert {r.gpu for r in rows} == set(GPUS)
    assert all(math.isfinite(r.mape_pct) for r in rows)


def test_a_partial_artifact_refuses_a_family_it_lacks(tmp_path: Path) -> None:
    root, config = _softmax_only(tmp_path)
    from tilecast.analyzer.types import Kernel, OpCost, RowDims
    from tilecast.device_db.loader import load_device
    from tilecast.errors import PredictorError
    from tilecast.learned.predictor import OnnxPredictor
    from tilecast.learned.train import train_all

    train_all([root], tmp_path / "art", config, progress=None)
    with pytest.raises(PredictorError, match="'matmul' features None"):
        OnnxPredictor(tmp_path / "art")  # the default: every family is required
    model = OnnxPredictor(tmp_path / "art", families=("softmax",))
    dev = load_device("NVIDIA L4")
    soft = Kernel("s", ("s",), "Softmax", OpCost("softmax", 5 * 64 * 512, 8 * 64 * 512,
                                                  "float32", "vector", rows=RowDims(64, 512),
                                                  elements=64 * 512))
    assert model.predict([soft], dev)[0].latency_ms > 0
    relu = Kernel("r", ("r",), "Relu", OpCost("elementwise", 4096, 8 * 4096, "float32",
                                              "vector", elements=4096))
    with pytest.raises(PredictorError, match="no 'elementwise' model"):
        model.predict([soft, relu], dev)
