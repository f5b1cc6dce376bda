"""Device database: shipped JSONs, name resolution, the NeuSight format, validation errors."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from tilecast.device_db import Device, list_devices, load_device, parse_device, resolve_name
from tilecast.device_db.loader import (
    DEFAULT_LAUNCH_OVERHEAD_US,
    GPUS_DIR,
    NUMERIC_FIELDS,
    build_index,
)
from tilecast.errors import DeviceError

SHIPPED = sorted(GPUS_DIR.glob("*.json"))
DATASET = Path(__file__).resolve().parents[1].parent / "shared/datasets/neusight-asplos25"
DATASET_DEVICES = sorted((DATASET / "devices").glob("*.json")) if DATASET.is_dir() else []
NO_DATASET = pytest.param(
    None, marks=pytest.mark.skip(reason=f"NeuSight dataset not found at {DATASET}")
)

REQUIRED_GPUS = [
    "Tesla P4", "Tesla P100 PCIe 16GB", "Tesla V100 PCIe 32GB", "Tesla V100 SXM2 32GB",
    "Tesla T4", "NVIDIA A10", "NVIDIA A100 PCIe 40GB", "NVIDIA A100 SXM4 40GB",
    "NVIDIA A100 PCIe 80GB", "NVIDIA A100 SXM4 80GB", "NVIDIA L4", "NVIDIA L40S",
    "NVIDIA GeForce RTX 4090", "NVIDIA H100 PCIe", "NVIDIA H100 SXM5 80GB", "NVIDIA H200 SXM",
    "NVIDIA B200", "AMD Instinct MI100", "AMD Instinct MI210", "AMD Instinct MI250",
    "AMD Instinct MI250X", "AMD Instinct MI300X",
]

# (what torch / nvidia-smi / rocm-smi report, or a short name) -> canonical name
ALIASES = [
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
    ("NVIDIA_H100_80GB_HBM3", "NVIDIA H100 SXM5 80GB"),
    ("Tesla T4", "Tesla T4"),
    ("Tesla_T4", "Tesla T4"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM4 40GB"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB"),
    ("nvidia a100 80gb pcie", "NVIDIA A100 PCIe 80GB"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM4 80GB"),
    ("Tesla P100-PCIE-16GB", "Tesla P100 PCIe 16GB"),
    ("Tesla V100-PCIE-32GB", "Tesla V100 PCIe 32GB"),
    ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2 32GB"),
    ("Tesla P4", "Tesla P4"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA H200", "NVIDIA H200 SXM"),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("AMD Instinct MI100", "AMD Instinct MI100"),
    ("AMD Instinct MI210", "AMD Instinct MI210"),
    ("AMD_Instinct_MI210", "AMD Instinct MI210"),
    ("AMD Instinct MI250", "AMD Instinct MI250"),
    ("AMD Instinct MI300X", "AMD Instinct MI300X"),
    ("l4", "NVIDIA L4"),
    ("L4", "NVIDIA L4"),
    ("t4", "Tesla T4"),
    ("p4", "Tesla P4"),
    ("a10", "NVIDIA A10"),
    ("a100-40gb", "NVIDIA A100 SXM4 40GB"),
    ("a100_80gb", "NVIDIA A100 SXM4 80GB"),
    ("h100", "NVIDIA H100 SXM5 80GB"),
    ("h100-sxm", "NVIDIA H100 SXM5 80GB"),
    ("h100-pcie", "NVIDIA H100 PCIe"),
    ("h200", "NVIDIA H200 SXM"),
    ("b200", "NVIDIA B200"),
    ("l40s", "NVIDIA L40S"),
    ("rtx4090", "NVIDIA GeForce RTX 4090"),
    ("mi100", "AMD Instinct MI100"),
    ("mi210", "AMD Instinct MI210"),
    ("mi250", "AMD Instinct MI250"),
    ("MI250X", "AMD Instinct MI250X"),
    ("mi300x", "AMD Instinct MI300X"),
    ("  Tesla   V100 pcie 32gb ", "Tesla V100 PCIe 32GB"),
]


def _shipped_json(stem: str = "nvidia_l4") -> dict:
    return json.loads((GPUS_DIR / f"{stem}.json").read_text())


def _write(tmp_path: Path, obj: object, name: str = "dev.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


# ---- the shipped database -------------------------------------------------------------------
@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_json_loads(path: Path) -> None:
    device = load_device(path)
    assert isinstance(device, Device)
    assert device.source_file == str(path)
    # every numeric value carries a source (also enforced by the loader)
    values = {f: getattr(device, f, None) for f in NUMERIC_FIELDS if "." not in f}
    values.update({f"interconnect.{k}": v for k, v in vars(device.interconnect).items()})
    assert {f for f, v in values.items() if v is not None} <= set(device.sources)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_json_lists_every_field(path: Path) -> None:
    # nulls are written out, so a reviewer sees "lacks it" rather than "forgot it"
    obj = json.loads(path.read_text())
    assert {f for f in NUMERIC_FIELDS if "." not in f} <= set(obj)
    assert set(obj["interconnect"]) == {"nvlink_gbps", "xgmi_gbps", "pcie_gen"}


def test_database_has_the_required_gpus() -> None:
    names = {d.name for d in list_devices()}
    assert len(SHIPPED) >= 22
    assert set(REQUIRED_GPUS) <= names


def test_list_devices_sorted_by_vendor_then_name() -> None:
    devices = list_devices()
    assert devices == sorted(devices, key=lambda d: (d.vendor, d.name))
    assert {d.vendor for d in devices} == {"nvidia", "amd"}


def test_devices_table_keeps_every_name_apart_from_its_vendor() -> None:
    # The longest name ("AMD Instinct MI250 (package, 2 GCDs)") once ran into the vendor column.
    from tilecast.device_db.report import render_devices

    rows = render_devices("table").splitlines()[1:-1]
    for device, row in zip(list_devices(), rows, strict=True):
        assert row.split("  ")[0] == device.name
        assert row[len(device.name):].split()[0] == device.vendor


@pytest.mark.parametrize(("device", "unit"), [("mi210", "104 CUs"), ("h100", "132 SMs")])
def test_analyze_header_counts_amd_compute_units_as_cus(device: str, unit: str) -> None:
    from click.testing import CliRunner

    from tilecast.cli import main

    example = Path(__file__).resolve().parents[1] / "examples" / "small-cnn.onnx"
    r = CliRunner().invoke(main, ["analyze", str(example), "-d", device,
                                  "--predictor", "roofline"])
    assert r.exit_code == 0 and f"({load_device(device).arch}, {unit}," in r.output


def test_names_unique_and_aliases_do_not_collide() -> None:
    owner: dict[str, str] = {}
    for device in list_devices():
        for label in (device.name, *device.aliases):
            key = " ".join(label.lower().replace("_", " ").replace("-", " ").split())
            assert owner.setdefault(key, device.name) == device.name, (label, owner[key])
    assert len({d.name for d in list_devices()}) == len(list_devices())


def test_build_index_rejects_colliding_alias() -> None:
    l4 = load_device("l4")
    clash = Device(**{**vars(l4), "name": "Other GPU", "aliases": ("nvidia_l4",)})
    with pytest.raises(DeviceError, match="collides"):
        build_index([l4, clash])
    with pytest.raises(DeviceError, match="used by both"):
        build_index([l4, l4])


def test_database_is_cached() -> None:
    assert load_device("l4") is load_device("NVIDIA_L4")
    assert list_devices() == list_devices()


@pytest.mark.parametrize("device", list_devices(), ids=lambda d: d.name)
def test_fp32_peak_matches_units_times_clock(device: Device) -> None:
    # FMA = 2 FLOPs; catches SM/CU counts or clocks copied from the wrong product. The P4's
    # datasheet 5.5 TFLOP/s is below 20 x 128 x 2 x 1114 MHz (its sustained boost is lower).
    derived = device.sm_count * device.cores_per_sm * 2 * device.boost_clock_mhz / 1e6
    assert device.peak_tflops_fp32 == pytest.approx(derived, rel=0.04)


@pytest.mark.parametrize("device", list_devices(), ids=lambda d: d.name)
def test_dense_matrix_peaks_are_ordered(device: Device) -> None:
    # dense tensor peaks: tf32 < fp16 = bf16 (when both exist) <= fp8; a sparse figure copied by
    # mistake would usually break fp16 == bf16 or tf32 * 2 == fp16.
    fp16, bf16, tf32 = (device.peak_tflops_fp16_matrix, device.peak_tflops_bf16_matrix,
                        device.peak_tflops_tf32_matrix)
    if tf32 and fp16:
        assert fp16 == pytest.approx(2 * tf32, rel=0.03)
    if fp16 and bf16 and device.arch != "cdna1":  # MI100 runs bf16 at half the fp16 rate
        assert bf16 == fp16
    if device.peak_tflops_fp8_matrix:
        assert device.peak_tflops_fp8_matrix >= (fp16 or 0)
    assert device.peak_tflops_fp32_matrix is None or device.vendor == "amd"


# ---- names ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("alias", "canonical"), ALIASES)
def test_alias_resolves(alias: str, canonical: str) -> None:
    assert resolve_name(alias) == canonical
    assert load_device(alias).name == canonical


@pytest.mark.parametrize(
    "path", DATASET_DEVICES or [NO_DATASET], ids=[p.stem for p in DATASET_DEVICES] or ["absent"]
)
def test_dataset_device_names_resolve(path: Path) -> None:
    raw = json.loads(path.read_text())
    shipped = load_device(raw["Device"])
    legacy = load_device(path)  # the NeuSight file itself loads through the legacy path
    assert legacy.name == raw["Device"]
    assert legacy.vendor == shipped.vendor
    assert legacy.arch == shipped.arch
    if not path.stem.endswith("_TP"):  # the TP file describes 2 GPUs under one GPU's name
        assert resolve_name(path.stem) == shipped.name


@pytest.mark.parametrize(
    ("query", "expected"),
    [("a100", "NVIDIA A100 PCIe 40GB"), ("mi25", "AMD Instinct MI250"),
     ("h300", "NVIDIA H200 SXM"), ("NVIDIA L40", "NVIDIA L40S")],
)
def test_unknown_name_suggests_close_matches(query: str, expected: str) -> None:
    with pytest.raises(DeviceError, match=f"unknown device '{query}'") as info:
        load_device(query)
    assert "did you mean" in str(info.value)
    assert expected in str(info.value)


def test_unknown_name_without_close_match_lists_devices() -> None:
    with pytest.raises(DeviceError, match="known devices: .*NVIDIA L4"):
        resolve_name("zzzz")


def test_load_device_accepts_device_path_and_str_path(tmp_path: Path) -> None:
    l4 = load_device("l4")
    assert load_device(l4) is l4
    path = _write(tmp_path, _shipped_json())
    assert load_device(path).sm_count == 58
    assert load_device(str(path)).sm_count == 58
    assert parse_device(_shipped_json()).name == "NVIDIA L4"


# ---- known datasheet pitfalls and figures ----------------------------------------------------
def test_l4_and_p4_figures() -> None:
    l4, p4 = load_device("l4"), load_device("p4")
    assert (l4.sm_count, l4.boost_clock_mhz, l4.mem_bandwidth_gbps, l4.l2_cache_mb) == (
        58, 2040, 300, 48)
    assert l4.peak_tflops_fp32 == 30.3
    assert l4.peak_tflops_bf16_matrix == 121.0  # 242 is the 2:4 sparse figure
    assert (p4.sm_count, p4.sm_count * p4.cores_per_sm, p4.boost_clock_mhz) == (20, 2560, 1114)
    assert (p4.mem_bandwidth_gbps, p4.l2_cache_mb, p4.peak_tflops_fp32) == (192, 2, 5.5)


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [("NVIDIA A100-PCIE-40GB", "peak_tflops_bf16_matrix", 312.0),
     ("NVIDIA A100-PCIE-40GB", "peak_tflops_tf32_matrix", 156.0),
     ("h100", "peak_tflops_bf16_matrix", 989.4),
     ("mi100", "sm_count", 120), ("mi210", "sm_count", 104),
     ("mi250", "sm_count", 104), ("mi250-package", "sm_count", 208), ("mi300x", "sm_count", 304),
     ("t4", "peak_tflops_bf16_matrix", None), ("p100", "peak_tflops_fp16_matrix", None)],
)
def test_datasheet_figures(name: str, field: str, value: object) -> None:
    assert getattr(load_device(name), field) == value


def test_peak_tflops_semantics() -> None:
    for device in list_devices():
        if device.vendor == "nvidia":  # fp32 GEMMs run on the vector units (no TF32 by default)
            assert device.peak_tflops("float32", "matrix") == device.peak_tflops_fp32
    assert load_device("NVIDIA A100-SXM4-40GB").peak_tflops("bfloat16", "matrix") == 312.0
    assert load_device("mi210").peak_tflops("float32", "matrix") == 45.3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_vector_work_runs_at_the_fp32_peak_in_16_bit(dtype: str) -> None:
    # PyTorch computes 16-bit elementwise, softmax and norm math in fp32 (at::opmath_type), so
    # their peak is fp32's; only a GEMM without matrix units issues packed half2 FMAs.
    for device in list_devices():
        assert device.peak_tflops(dtype, "vector") == device.peak_tflops_fp32, device.name
    p100 = load_device("p100")  # no tensor cores: an fp16 GEMM runs half2 on CUDA cores
    assert p100.peak_tflops("float16", "matrix") == p100.peak_tflops_fp16_vector > 9.3


# ---- the older NeuSight format --------------------------------------------------------------
def test_legacy_nvidia_json_converts(tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "Device": "NVIDIA A100-PCIE-40GB", "Dev_Mem": 40, "Mem_Bw": 1555, "Num_Sm": 108,
        "Core_Per_SM": 64, "Freq": 1410, "SingleFLOPs": 19492, "L2Cache": 40,
    })
    device = load_device(path)
    assert (device.vendor, device.arch) == ("nvidia", "ampere")
    assert device.name == "NVIDIA A100-PCIE-40GB"
    assert device.peak_tflops_fp32 == pytest.approx(19.492)  # GFLOP/s -> TFLOP/s
    assert (device.sm_count, device.cores_per_sm, device.memory_gb) == (108, 64, 40.0)
    assert device.launch_overhead_us == DEFAULT_LAUNCH_OVERHEAD_US
    assert device.sources["launch_overhead_us"].startswith("tilecast default")
    assert "Mem_Bw" in device.sources["mem_bandwidth_gbps"]


def test_legacy_amd_json_converts(tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "Device": "AMD Instinct MI999", "Dev_Mem": 64, "Mem_Bw": 1640, "Num_Sm": 104,
        "Core_Per_SM": 4, "Freq": 1700, "SingleFLOPsMM": 45300, "SingleFLOPsVEC": 22600,
        "L2Cache": 8,
    })
    device = load_device(path)
    assert (device.vendor, device.arch) == ("amd", "generic")
    assert device.peak_tflops_fp32 == pytest.approx(22.6)
    assert device.peak_tflops_fp32_matrix == pytest.approx(45.3)
    assert device.peak_tflops("float32", "matrix") == pytest.approx(45.3)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"Mem_Bw": -5}, "Mem_Bw"), ({"Freq": "fast"}, "Freq"), ({"Colour": 1}, "Colour"),
     ({"Device": "Voodoo 5"}, "Device")],
)
def test_legacy_json_errors_name_the_key(tmp_path: Path, change: dict, field: str) -> None:
    obj = {"Device": "Tesla T4", "Dev_Mem": 15, "Mem_Bw": 320, "Num_Sm": 40, "Core_Per_SM": 64,
           "Freq": 1590, "SingleFLOPs": 8141, "L2Cache": 4, **change}
    path = _write(tmp_path, obj)
    with pytest.raises(DeviceError, match=re.escape(f"device JSON {path}: field '{field}'")):
        load_device(path)


def test_legacy_json_missing_key(tmp_path: Path) -> None:
    path = _write(tmp_path, {"Device": "Tesla T4", "Num_Sm": 40, "Dev_Mem": 15})
    with pytest.raises(DeviceError, match="field 'Mem_Bw' is missing"):
        load_device(path)


# ---- validation of the tilecast schema ------------------------------------------------------
def _drop(key: str):
    return lambda obj: obj.pop(key)


def _set(key: str, value: object):
    return lambda obj: obj.__setitem__(key, value)


def _drop_source(key: str):
    return lambda obj: obj["sources"].pop(key)


BAD = [
    ("missing field", _drop("mem_bandwidth_gbps"), "'mem_bandwidth_gbps' is missing"),
    ("missing sources", _drop("sources"), "'sources' is missing"),
    ("negative bandwidth", _set("mem_bandwidth_gbps", -300), "'mem_bandwidth_gbps' must be a pos"),
    ("zero l2", _set("l2_cache_mb", 0), "'l2_cache_mb' must be a positive"),
    ("string number", _set("mem_bandwidth_gbps", "300"), "'mem_bandwidth_gbps' must be a number"),
    ("bool number", _set("peak_tflops_fp32", True), "'peak_tflops_fp32' must be a number"),
    ("float count", _set("sm_count", 58.5), "'sm_count' must be an integer"),
    ("bad optional", _set("peak_tflops_fp8_matrix", "n/a"), "'peak_tflops_fp8_matrix' must be"),
    ("no source", _drop_source("l2_cache_mb"), "'l2_cache_mb' has no entry in 'sources'"),
    ("no link source", _drop_source("interconnect.pcie_gen"), "'interconnect.pcie_gen' has no"),
    ("unknown key", _set("boost_clock_ghz", 2.0), "'boost_clock_ghz' is not a known field"),
    ("loader-only key", _set("source_file", "x"), "'source_file' is not a known field"),
    ("unknown link key", _set("interconnect", {"nvlink": 1}), "'interconnect.nvlink' is not a"),
    ("link not object", _set("interconnect", 4), "'interconnect' must be a JSON object"),
    ("bad pcie gen", _set("interconnect", {"pcie_gen": 4.5}), "'interconnect.pcie_gen' must be an"),
    ("unknown source", lambda o: o["sources"].update(colour="x"), "'sources.colour' is not a"),
    ("empty source", lambda o: o["sources"].update(sm_count=" "), "'sources.sm_count' must be a"),
    ("bad vendor", _set("vendor", "intel"), "'vendor' must be one of nvidia, amd"),
    ("bad dtype", _set("supported_dtypes", ["fp32"]), "'supported_dtypes' has 'fp32'"),
    ("aliases not list", _set("aliases", "l4"), "'aliases' must be a list"),
    ("empty name", _set("name", ""), "'name' must be a non-empty string"),
    ("no power source", _drop_source("board_power_w"), "'board_power_w' has no entry in 'sour"),
    ("share above 1", _set("fp32_issue_share", 2.0), "'fp32_issue_share' is a fraction"),
    ("fraction above 1", _set("matrix_sustained_fraction", 1.2), "'matrix_sustained_fraction' is"),
    ("fp32 fraction above 1", _set("fp32_sustained_fraction", 1.1), "'fp32_sustained_fraction' is"),
    ("zero power", _set("board_power_w", 0), "'board_power_w' must be a positive"),
    ("base above boost", _set("base_clock_mhz", 2100), "'base_clock_mhz' (2100.0) must not exce"),
    ("bad memory type", _set("memory_type", "HBM"), "'memory_type' must be one of HBM2, HBM2e"),
    ("memory type not text", _set("memory_type", 6), "'memory_type' must be a non-empty string"),
    ("no memory source", _drop_source("memory_type"), "'memory_type' has no entry in 'sources'"),
]


@pytest.mark.parametrize(("label", "mutate", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_file_names_file_and_field(tmp_path: Path, label: str, mutate, message: str) -> None:
    obj = copy.deepcopy(_shipped_json())
    mutate(obj)
    path = _write(tmp_path, obj)
    with pytest.raises(DeviceError) as info:
        load_device(path)
    text = str(info.value)
    assert text.startswith(f"device JSON {path}: ")
    assert f"field {message}" in text


def test_null_value_needs_no_source(tmp_path: Path) -> None:
    obj = _shipped_json()
    obj["peak_tflops_fp8_matrix"] = None
    obj["sources"].pop("peak_tflops_fp8_matrix")
    assert load_device(_write(tmp_path, obj)).peak_tflops_fp8_matrix is None


PHYSICAL = ("base_clock_mhz", "board_power_w", "fp32_issue_share", "matrix_sustained_fraction",
            "fp32_sustained_fraction")


def test_physical_fields_are_optional(tmp_path: Path) -> None:
    # older and user-written files predate them; they load with None
    obj = _shipped_json()
    for key in PHYSICAL:
        obj.pop(key)
        obj["sources"].pop(key)
    device = load_device(_write(tmp_path, obj))
    assert [getattr(device, key) for key in PHYSICAL] == [None] * len(PHYSICAL)


@pytest.mark.parametrize("device", list_devices(), ids=lambda d: d.name)
def test_shipped_physical_fields(device: Device) -> None:
    # every shipped GPU sets each field, or says in its source why it is null
    for key in PHYSICAL:
        value = getattr(device, key)
        assert value is not None or device.sources.get(key, "").startswith("not set:"), key
    assert device.board_power_w is not None and device.board_power_w > 0
    assert device.fp32_issue_share is not None and 0 < device.fp32_issue_share <= 1
    fraction = device.matrix_sustained_fraction
    assert fraction is None or 0 < fraction <= 1
    assert device.base_clock_mhz is None or device.base_clock_mhz <= device.boost_clock_mhz
    # a sustained fraction of a matrix peak needs a matrix peak
    assert fraction is None or device.peak_tflops_fp16_matrix is not None
    # the SIMT SGEMM fraction is NVIDIA's: AMD fp32 GEMMs run on matrix cores
    simt = device.fp32_sustained_fraction
    assert simt is None or (0 < simt <= 1 and device.vendor == "nvidia")


def test_memory_type_is_optional_and_says_hbm(tmp_path: Path) -> None:
    obj = _shipped_json()
    obj.pop("memory_type")
    obj["sources"].pop("memory_type")
    device = load_device(_write(tmp_path, obj))
    assert device.memory_type is None and device.hbm is None


@pytest.mark.parametrize(("name", "memory", "hbm"), [
    ("l4", "GDDR6", False), ("t4", "GDDR6", False), ("Tesla P4", "GDDR5", False),
    ("NVIDIA GeForce RTX 4090", "GDDR6X", False), ("a100-pcie-40gb", "HBM2", True),
    ("h100-sxm5-80gb", "HBM3", True), ("mi210", "HBM2e", True), ("b200", "HBM3e", True)])
def test_shipped_memory_types(name: str, memory: str, hbm: bool) -> None:
    device = load_device(name)
    assert (device.memory_type, device.hbm) == (memory, hbm)
    assert memory in device.sources["memory_type"]


def test_every_shipped_gpu_states_its_memory_type() -> None:
    assert all(d.memory_type is not None for d in list_devices())


@pytest.mark.parametrize("device", list_devices(), ids=lambda d: d.name)
def test_fp32_issue_share_matches_the_sm_layout(device: Device) -> None:
    # NVIDIA Volta..Blackwell: 4 partitions, each dispatching one 32-thread warp instruction per
    # clock, so share = FP32 lanes / 128 (64 lanes -> 0.5, 128 -> 1.0). Pascal schedulers have
    # two dispatch units (GP100: 64 / (2 x 2 x 32), GP104: 128 / (4 x 2 x 32)) -> 0.5.
    # AMD: 64 lanes per CU, 64 thread-ops issued per clock; packed FP32 (CDNA2/3) doubles the
    # FMAs per issue slot against the stored non-packed peak -> 1.0 on CDNA1, 0.5 after.
    if device.arch == "pascal":
        expected = 0.5
    elif device.vendor == "nvidia":
        expected = device.cores_per_sm / (4 * 32)
    else:
        expected = 1.0 if device.arch == "cdna1" else 0.5
    assert device.fp32_issue_share == expected


def test_broken_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", ')
    with pytest.raises(DeviceError, match=re.escape(f"device JSON {path}: invalid JSON at line 1")):
        load_device(path)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(DeviceError, match=re.escape(f"device JSON {path}: cannot read")):
        load_device(str(path))


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    path = _write(tmp_path, [1, 2])
    with pytest.raises(DeviceError, match="the top level must be a JSON object"):
        load_device(path)
