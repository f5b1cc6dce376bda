"""Feed tilecast's commands random malformed inputs and count what happens to each.

    python benchmarks/robustness.py [--cases 420] [--seed 0] [--timeout 30]

Every case is an input that is invalid by construction (a wrong type, a negative or non-finite
number, a deleted required key, a total that disagrees with its kernels, a truncated or empty
file, a broken graph, an unknown architecture, a label or kernel row that is not a latency, a
folder without data), run through the CLI in-process with click's CliRunner. Outcomes:

- rejected: exit status 2 and exactly one ``Error:`` line (what tilecast promises);
- accepted: exit 0 or 1, i.e. the invalid input passed as a good one;
- crashed: a traceback or an internal error (exit 3);
- hang: no answer within --timeout seconds;
- bad error: exit 2 with other than one ``Error:`` line.

A few valid controls per command (the unmutated inputs) must be accepted, so that a command
that rejects everything cannot score well. `evaluate` does not export with torch here: its
export step returns a prepared tiny model (the point is the label reading, not the exporter).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import onnx.parser
from click.testing import CliRunner

from tilecast.analyzer.pipeline import analyze
from tilecast.analyzer.synthetic import gpt2_like
from tilecast.cli import main
from tilecast.device_db.loader import GPUS_DIR
from tilecast.gate.baseline import baseline_text, model_inputs

GRAPH = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4,8] x, float[8,8] w) => (float[2,32] z) {
  shape = Constant<value = int64[2] {2, 32}>()
  m = MatMul(x, w)
  a = Add(m, x)
  s = Softmax<axis = -1>(a)
  z = Reshape(s, shape)
}"""
RF = ["--predictor", "roofline"]
KERNEL_HEADER = "OPName,Device,B,M,N,K,Latency,Grid x,Block x"
Case = tuple[str, list[str], bool]  # (command, argv, valid input?)


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` swallows it."""


# --- the valid inputs everything is mutated from --------------------------------------------
def workspace(root: Path) -> dict[str, Any]:
    model = onnx.parser.parse_model(GRAPH)
    onnx.save(model, root / "m.onnx")
    forecast = analyze(root / "m.onnx", "l4", predictor="roofline")
    (root / "f.json").write_text(forecast.to_json())
    gate = root / "gate"
    (gate / ".tilecast").mkdir(parents=True)
    onnx.save(model, gate / "m.onnx")
    (gate / "tilecast.toml").write_text('devices = ["l4"]\npredictor = "roofline"\n'
                                        '[[models]]\npath = "m.onnx"\n')
    (gate / ".tilecast" / "m.json").write_text(
        baseline_text([forecast], "m.onnx", model_inputs(model)))
    decoder = gpt2_like(layers=1, hidden=32, heads=2, seq=16, batch=2, vocab=64)
    onnx.save(decoder, root / "gpt.onnx")
    return {"root": root, "model": model, "decoder": decoder,
            "forecast": json.loads(forecast.to_json()),
            "baseline": json.loads((gate / ".tilecast" / "m.json").read_text()),
            "device": json.loads((GPUS_DIR / "nvidia_l4.json").read_text())}


# --- JSON mutations that are invalid by construction --------------------------------------------
def _leaves(obj: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [x for i, v in enumerate(obj) for x in _leaves(v, (*path, i))]
    return [(path, obj)]


def _set(obj: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def _bad_value(rng: random.Random, old: Any) -> Any:
    """A value of the wrong kind for ``old`` (numbers also get negative and non-finite)."""
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        return rng.choice([-abs(old) - 1.0, float("nan"), float("inf"), "12", None, [1], True])
    if isinstance(old, str):
        return rng.choice([3, None, [old], {"x": 1}, True])
    if isinstance(old, bool):
        return rng.choice(["yes", 2, [True]])
    return rng.choice([-1, "x", {"a": []}])


def mutate_json(rng: random.Random, valid: dict, required: list[tuple]) -> str:
    """Text of ``valid`` after one edit that must make it invalid."""
    data = copy.deepcopy(valid)
    kind = rng.choice(("value", "value", "drop", "truncate", "empty", "version"))
    if kind == "value":
        typed = [(p, v) for p, v in _leaves(data) if v is not None and p[-1] not in (
            "tilecast_version", "model", "tile", "name", "nodes", "dtype", "bound", "op_type",
            "family", "predictor") and not isinstance(p[-1], int)]
        path, old = rng.choice(typed)
        _set(data, path, _bad_value(rng, old))
    elif kind == "drop":
        path = rng.choice(required)
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    elif kind == "version":
        data["schema"] = rng.choice([0, 2, "1", None, 1.5])
    text = json.dumps(data)
    if kind == "truncate":
        return text[:rng.randrange(0, len(text) - 1)]
    return "" if kind == "empty" else text


def _required(prefix: tuple, kernels: int) -> list[tuple]:
    top = [(*prefix, k) for k in ("schema", "model", "device", "mode", "predictor", "kernels")]
    return top + [(*prefix, "kernels", rng_i, k) for rng_i in range(min(kernels, 3))
                  for k in ("name", "op_type", "latency_ms", "flops", "bytes", "phase")]


# --- case generators, one per command ------------------------------------------------------------
def _file(ws: dict, name: str, text: str | bytes) -> str:
    path = ws["root"] / "cases" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


REQUIRED_SECOND = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Gather", "Reshape",
                             "Expand", "Equal", "Less", "Greater"})


def broken_graph_bytes(rng: random.Random, ws: dict) -> bytes:
    model = copy.deepcopy(ws["model"])
    nodes = model.graph.node
    i = rng.randrange(len(nodes))
    kind = rng.choice(("input", "ssa", "drop", "order", "elem", "bytes", "arity"))
    if kind == "input" and not nodes[i].input:
        nodes[i].input.append("nope")
    elif kind == "input":
        nodes[i].input[rng.randrange(len(nodes[i].input))] = "nope"
    elif kind == "ssa":
        nodes[-1].output[0] = nodes[0].output[0]
    elif kind == "drop":
        del nodes[-1]
    elif kind == "order":
        first, last = copy.deepcopy(nodes[0]), copy.deepcopy(nodes[-1])
        nodes[0].CopyFrom(last)
        nodes[-1].CopyFrom(first)
    elif kind == "elem":
        model.graph.input[0].type.tensor_type.elem_type = rng.choice([99, 40, -1, 1000])
    elif kind == "arity":  # ops whose second input is required (Split's is optional)
        j = rng.choice([n for n in range(len(nodes)) if len(nodes[n].input) == 2
                        and nodes[n].op_type in REQUIRED_SECOND])
        del nodes[j].input[1]
    raw = model.SerializeToString()
    if kind == "bytes":
        cut = rng.randrange(1, len(raw) - 1)
        return raw[:cut] if rng.random() < 0.5 else raw[:cut] + b"\xff\xfe" + raw[cut:]
    return raw


def analyze_case(rng: random.Random, ws: dict, n: int) -> Case:
    if rng.random() < 0.15:
        return "analyze", [_file(ws, f"a{n}.onnx", rng.choice([b"", b"garbage", b"{}"])),
                           "-d", "l4", *RF], False
    return "analyze", [_file(ws, f"a{n}.onnx", broken_graph_bytes(rng, ws)), "-d", "l4", *RF], False


def compare_case(rng: random.Random, ws: dict, n: int) -> Case:
    required = _required((), len(ws["forecast"]["kernels"]))
    bad = _file(ws, f"c{n}.json", mutate_json(rng, ws["forecast"], required))
    if rng.random() < 0.2:  # a kernel edited without its total
        data = copy.deepcopy(ws["forecast"])
        data["kernels"][0]["latency_ms"] += 1.0
        bad = _file(ws, f"c{n}.json", json.dumps(data))
    sides = [bad, str(ws["root"] / "m.onnx")]
    return "compare", (sides if rng.random() < 0.5 else sides[::-1]) + RF, False


def gate_case(rng: random.Random, ws: dict, n: int) -> Case:
    gate = ws["root"] / "cases" / f"gate{n}"
    (gate / ".tilecast").mkdir(parents=True)
    onnx.save(ws["model"], gate / "m.onnx")
    config = (ws["root"] / "gate" / "tilecast.toml").read_text()
    kind = rng.choice(("baseline", "baseline", "baseline", "model", "config", "missing"))
    baseline = json.dumps(ws["baseline"])
    if kind == "baseline":
        baseline = mutate_json(rng, ws["baseline"], _required(("forecasts", 0), 3))
    elif kind == "model":
        (gate / "m.onnx").write_bytes(broken_graph_bytes(rng, ws))
    elif kind == "config":
        config = rng.choice([config.replace("l4", "h9000"), config.replace('"m.onnx"', "1"),
                             config[:rng.randrange(len(config) - 1)] + "[", "models = []"])
    if kind != "missing":
        (gate / ".tilecast" / "m.json").write_text(baseline)
    (gate / "tilecast.toml").write_text(config)
    return "gate", ["--config", str(gate / "tilecast.toml")], False


def evaluate_case(rng: random.Random, ws: dict, n: int) -> Case:
    root = ws["root"] / "cases" / f"ev{n}"
    labels, models = root / "labels", root / "models"
    models.mkdir(parents=True)
    (models / "tiny.json").write_text('{"model_type": "gpt2"}')
    kind = rng.choice(("latency", "latency", "name", "gpu", "config", "empty", "unrelated"))
    gpu, name, body = "NVIDIA_L4", "tiny-inf-8-2.json", {"e2e_latency": 1.5}
    if kind == "latency":
        body = rng.choice([{"e2e_latency": v} for v in ("fast", None, -1, 0, [1])]
                          + [{}, [], {"latency": 1.0}])
    elif kind == "name":
        name = rng.choice(["tiny-inf-8.json", "tiny-fast-8-2.json", "tiny.json", "x-inf-a-2.json"])
    elif kind == "gpu":
        gpu = rng.choice(["NVIDIA_Quantum", "GPU0", "l4x"])
    elif kind == "config":
        (models / "tiny.json").unlink()
    if kind not in ("empty", "unrelated"):
        (labels / gpu).mkdir(parents=True)
        text = json.dumps(body) if rng.random() < 0.8 else json.dumps(body)[:-1]
        (labels / gpu / name).write_text(text)
    else:
        labels.mkdir()
        if kind == "unrelated":
            (labels / "results.csv").write_text("a,b\n1,2\n")
    return "evaluate", [str(labels), "--models", str(models)], False


def _kernel_rows(latency: str = "0.02", device: str = "NVIDIA L4", m: str = "64") -> str:
    return f"bmm,{device},1,{m},64,64,{latency},4,256\n"


def kernels_eval_case(rng: random.Random, ws: dict, n: int) -> Case:
    root = ws["root"] / "cases" / f"ke{n}"
    kind = rng.choice(("latency", "latency", "dim", "device", "empty", "nocsv"))
    row = _kernel_rows()
    if kind == "latency":
        row = _kernel_rows(latency=rng.choice(["nan", "inf", "-0.5", "0", "fast", ""]))
    elif kind == "dim":
        row = _kernel_rows(m=rng.choice(["x", "-4", "nan", "1e999"]))
    elif kind == "device":
        row = _kernel_rows(device=rng.choice(["", "NVIDIA Quantum", "GPU 0"]))
    folder = root / "kernels" / "nvidia" / "eval"
    folder.mkdir(parents=True)
    if kind != "nocsv":
        (folder / "bmm.csv").write_text(KERNEL_HEADER + "\n" + ("" if kind == "empty" else row))
    return "kernels-eval", ["--data", str(root)], False


def device_case(rng: random.Random, ws: dict, n: int) -> Case:
    data = copy.deepcopy(ws["device"])
    kind = rng.choice(("number", "number", "arch", "vendor", "drop", "extra", "truncate"))
    if kind == "number":
        key = rng.choice(["sm_count", "mem_bandwidth_gbps", "peak_tflops_fp32",
                          "boost_clock_mhz", "l2_cache_mb", "launch_overhead_us"])
        data[key] = rng.choice([0, -1, float("nan"), float("inf"), "fast", None, True])
    elif kind == "arch":
        data["arch"] = rng.choice(["quantum", "", "Ampere", "hopper2", 7])
    elif kind == "vendor":
        data["vendor"] = rng.choice(["intel", "", None])
    elif kind == "drop":
        del data[rng.choice(["name", "arch", "sources", "sm_count", "memory_gb"])]
    elif kind == "extra":
        data[rng.choice(["colour", "schema"])] = 2
    text = json.dumps(data)
    if kind == "truncate":
        text = text[:rng.randrange(len(text) - 1)]
    path = _file(ws, f"d{n}.json", text)
    if rng.random() < 0.5:
        return "device", ["devices", "show", path], False
    return "device", ["analyze", str(ws["root"] / "m.onnx"), "-d", path, *RF], False


def serve_case(rng: random.Random, ws: dict, n: int) -> Case:
    """A broken decoder graph, or the valid one with a bad --generate, --dim or --batch."""
    root = ws["root"]
    kind = rng.choice(("graph", "graph", "generate", "dim", "batch"))
    if kind == "graph":
        model = _file(ws, f"s{n}.onnx", broken_graph_bytes(rng, {"model": ws["decoder"]}))
        return "serve", [model, "-d", "l4", "--generate", "4", *RF], False
    if kind == "generate":
        bad = rng.choice(["0", "-3", "x", "1e3", str(10**12), ""])
        return "serve", [str(root / "gpt.onnx"), "-d", "l4", "--generate", bad, *RF], False
    if kind == "batch":
        return "serve", [str(root / "gpt.onnx"), "-d", "l4", "--generate", "4", "--batch",
                         rng.choice(["0", "1,,2", "x", "", "8,-1", str(10**7)]), *RF], False
    return "serve", [str(root / "gpt.onnx"), "-d", "l4", "--generate", "4", "--dim",
                     rng.choice(["batch=2", "seq", "x=0", "=4"]), *RF], False


def sweep_case(rng: random.Random, ws: dict, n: int) -> Case:
    """A broken graph, or the valid one with a bad GPU list, --dim grid, --math or --runtime."""
    model = str(ws["root"] / "m.onnx")
    kind = rng.choice(("graph", "device", "dim", "math", "runtime"))
    if kind == "graph":
        return "sweep", [_file(ws, f"w{n}.onnx", broken_graph_bytes(rng, ws)), "-d", "l4,t4",
                         *RF], False
    if kind == "device":
        return "sweep", [model, "-d", rng.choice(["", ",", "l4,,t4", "l4,nope", " , "]),
                         *RF], False
    if kind == "dim":
        return "sweep", [model, "-d", "l4", "--dim", rng.choice(
            ["batch=1,0", "batch=", "=1,2", "batch=1,x", "batch=-1", "nodim=2", "batch=1.5"]),
            *RF], False
    if kind == "math":  # the T4 runs neither tf32 nor bf16: no row can run
        return "sweep", [model, "-d", "t4", "--math", rng.choice(
            ["", "graph,,tf32", "fp8", "tf32", "tf32,amp-bf16"]), *RF], False
    return "sweep", [model, "-d", "l4", "--runtime", rng.choice(["", "eager,", "jit",
                                                                 "eager,graph,xla"]), *RF], False


GENERATORS: dict[str, Callable[[random.Random, dict, int], Case]] = {
    "analyze": analyze_case, "compare": compare_case, "gate": gate_case,
    "evaluate": evaluate_case, "kernels-eval": kernels_eval_case, "device": device_case,
    "serve": serve_case, "sweep": sweep_case,
}


def controls(ws: dict) -> list[Case]:
    """Valid inputs: each must be accepted."""
    root = ws["root"]
    ke = root / "cases" / "ke-valid" / "kernels" / "nvidia"
    (ke / "eval").mkdir(parents=True)
    (ke / "eval" / "bmm.csv").write_text(KERNEL_HEADER + "\n" + _kernel_rows() * 3)
    (ke / "train" / "bmm").mkdir(parents=True)
    (ke / "train" / "bmm" / "Tesla T4.csv").write_text(
        KERNEL_HEADER + "\n" + _kernel_rows(device="Tesla T4") * 3)
    ev = root / "cases" / "ev-valid"
    (ev / "labels" / "NVIDIA_L4").mkdir(parents=True)
    (ev / "models").mkdir()
    (ev / "models" / "tiny.json").write_text('{"model_type": "gpt2"}')
    (ev / "labels" / "NVIDIA_L4" / "tiny-inf-8-2.json").write_text('{"e2e_latency": 1.5}')
    device = _file(ws, "device-valid.json", json.dumps(ws["device"]))
    return [("analyze", [str(root / "m.onnx"), "-d", "l4", *RF], True),
            ("compare", [str(root / "f.json"), str(root / "m.onnx"), *RF], True),
            ("gate", ["--config", str(root / "gate" / "tilecast.toml")], True),
            ("evaluate", [str(ev / "labels"), "--models", str(ev / "models"), *RF], True),
            ("kernels-eval", ["--data", str(ke.parent.parent)], True),
            ("device", ["analyze", str(root / "m.onnx"), "-d", device, *RF], True),
            ("serve", [str(root / "gpt.onnx"), "-d", "l4", "--generate", "8", *RF], True),
            ("sweep", [str(root / "m.onnx"), "-d", "l4,t4", "--math", "graph,amp-fp16",
                       "--runtime", "eager,graph", *RF], True)]


# --- running and classifying ----------------------------------------------------------------------
def run_case(argv: list[str], timeout: int) -> str:
    def alarm(_signum: int, _frame: Any) -> None:
        raise Hang

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    try:
        result = CliRunner().invoke(main, argv)
    except Hang:
        return "hang"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
    if result.exit_code == 3 or "Traceback" in result.output or (
            result.exception is not None and not isinstance(result.exception, SystemExit)):
        return "crashed"
    if result.exit_code in (0, 1):
        return "accepted"
    return "rejected" if result.exit_code == 2 and len(errors) == 1 else "bad error"


def main_() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=420, help="malformed inputs in all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=30, help="seconds before a case is a hang")
    args = ap.parse_args()
    import tilecast.evaluation.runner as runner

    rng = random.Random(args.seed)
    counts: dict[str, Counter[str]] = {name: Counter() for name in GENERATORS}
    examples: dict[str, str] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tilecast-robustness-") as tmp:
        ws = workspace(Path(tmp))
        # evaluate's export step: the prepared tiny model instead of a torch export.
        runner.cached_export = lambda label, cache, progress=None: ws["root"] / "m.onnx"
        names = list(GENERATORS)
        cases = [GENERATORS[names[i % len(names)]](rng, ws, i) for i in range(args.cases)]
        for command, argv, valid in cases + controls(ws):
            if command != "device":  # device cases name their own command
                argv = [command, *argv]
            outcome = run_case(argv, args.timeout)
            key = f"valid {outcome}" if valid else outcome
            counts[command][key] += 1
            if not valid and outcome != "rejected":
                examples.setdefault(f"{command} {outcome}", " ".join(argv))
    seconds = time.perf_counter() - t0
    report(counts, examples, args, seconds)
    bad = sum(c[k] for c in counts.values() for k in ("accepted", "crashed", "hang",
                                                       "bad error", "valid rejected",
                                                       "valid crashed", "valid hang"))
    return 1 if bad else 0


def report(counts: dict[str, Counter[str]], examples: dict[str, str], args: Any,
           seconds: float) -> None:
    cols = ("rejected", "accepted", "crashed", "hang", "bad error", "valid accepted")
    print(f"{args.cases} malformed inputs (seed {args.seed}) + valid controls, {seconds:.0f} s")
    print(f"{'command':<14}" + "".join(f"{c:>16}" for c in cols))
    total: Counter[str] = Counter()
    for command, c in counts.items():
        total.update(c)
        print(f"{command:<14}" + "".join(f"{c[k]:>16}" for k in cols))
    print(f"{'total':<14}" + "".join(f"{total[k]:>16}" for k in cols))
    for what, argv in examples.items():
        print(f"first {what}: tilecast {argv}")


if __name__ == "__main__":
    sys.exit(main_())
