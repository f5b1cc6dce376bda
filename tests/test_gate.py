"""``tilecast gate``: the GitHub Actions workflow of docs/ci-gate.md run end to end on tiny
models (its tilecast.toml, its commands, in its order), configuration errors, baselines."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from tilecast import __version__
from tilecast.analyzer.synthetic import gpt2_like
from tilecast.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DOC = Path(__file__).resolve().parents[1] / "docs" / "ci-gate.md"


def fenced(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


# --- the workflow in the doc ----------------------------------------------------------------
def _scalar(value: str) -> str:
    value = re.sub(r"\s+#.*$", "", value).strip()
    return value[1:-1] if value[:1] == value[-1:] and value[:1] in "'\"" else value


def _block(lines: list[str], i: int, indent: int) -> tuple[list[str], int]:
    """The lines after ``i`` indented deeper than ``indent`` (a block scalar or a mapping)."""
    out = []
    while i + 1 < len(lines) and (not lines[i + 1].strip() or
                                  len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent):
        i += 1
        out.append(lines[i])
    return out, i


def workflow_steps(text: str) -> list[dict[str, Any]]:
    """The ``steps:`` of the workflow's one job. A small reader for the YAML subset the doc uses
    (PyYAML is not a tilecast dependency; where it is installed the result is checked against
    it)."""
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.strip() == "steps:")
    steps: list[dict[str, Any]] = []
    item = -1
    while (i := i + 1) < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if line.lstrip().startswith("- "):
            item, steps = indent, [*steps, {}]
            lines[i] = " " * (indent + 2) + line.lstrip()[2:]
            indent += 2
        key, _, value = lines[i].strip().partition(":")
        if value.strip() == "|":
            body, i = _block(lines, i, indent)
            steps[-1][key] = "\n".join(b[indent + 2:] for b in body).strip() + "\n"
        elif not value.strip():
            body, i = _block(lines, i, indent)
            steps[-1][key] = {k.strip(): _scalar(v) for k, _, v in
                              (b.partition(":") for b in body if b.strip())}
        else:
            steps[-1][key] = _scalar(value)
        assert indent == item + 2, f"unexpected indent at {line!r}"
    return steps


@pytest.fixture(scope="module")
def workflow() -> list[dict[str, Any]]:
    (text,) = fenced("yaml")
    steps = workflow_steps(text)
    try:
        import yaml
    except ImportError:
        return steps
    (job,) = yaml.safe_load(text)["jobs"].values()
    assert job["steps"] == steps  # the small reader agrees with a real YAML parser
    return steps


@dataclass
class Run:
    """What a workflow run did: the gate's exit status and what it posted."""

    gate_exit: int | None = None
    gate_output: str = ""
    comment: str | None = None
    summary: str = ""
    installs: list[str] = field(default_factory=list)


def _tilecast(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(main, args)
    return result.exit_code, result.output


def _shell(line: str, env: dict[str, str]) -> int:
    if shutil.which("bash") is None:  # pragma: no cover
        pytest.skip("no bash to run the workflow's shell steps")
    return subprocess.run(["bash", "-c", line], env=env, check=False).returncode


def _should_run(step: dict[str, Any], repo: Path, failed: bool) -> bool:
    """The ``if:`` forms the doc uses: ``always()`` and ``hashFiles('f') != ''``, with &&."""
    cond = step.get("if", "")
    files = re.findall(r"hashFiles\('([^']+)'\) != ''", cond)
    rest = re.sub(r"hashFiles\('[^']+'\) != ''|always\(\)|&&|\s", "", cond)
    assert not rest, f"condition not understood: {cond}"
    if failed and "always()" not in cond:
        return False
    return all((repo / f).exists() for f in files)


def run_workflow(steps: list[dict[str, Any]], repo: Path) -> Run:
    """Run the steps as GitHub Actions would, in ``repo`` (the checkout): a step after a failure
    runs only under ``always()``; pip installs are recorded, not run (tilecast is installed)."""
    run, failed = Run(), False
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(repo / "step-summary.md")}
    for step in steps:
        if not _should_run(step, repo, failed):
            continue
        if "marocchino/sticky-pull-request-comment" in step.get("uses", ""):
            run.comment = (repo / step["with"]["path"]).read_text(encoding="utf-8")
        for line in step.get("run", "").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("pip install"):
                run.installs.append(line)
                continue
            args = shlex.split(line)
            if args[:2] == ["tilecast", "gate"]:
                status, run.gate_output = _tilecast(args[1:])
                run.gate_exit = status
            elif line:
                status = _shell(line, env)
            failed = failed or status != 0
    summary = repo / "step-summary.md"
    run.summary = summary.read_text(encoding="utf-8") if summary.is_file() else ""
    return run


# --- a repository with the doc's tilecast.toml ----------------------------------------------
def doc_config() -> str:
    return fenced("toml")[0]


def write_models(repo: Path, layers: int) -> None:
    """The doc config's models: ``layers`` layers for the encoder, a fixed decoder."""
    config = tomllib.loads(doc_config())
    for spec in config["models"]:
        path = repo / spec["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        if spec["name"] == "encoder":  # its config binds a symbolic batch
            model = gpt2_like(layers=layers, batch="batch")
        else:
            model = gpt2_like(layers=2, hidden=32, heads=2, seq=16)
        onnx.save(model, path)


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The doc's config as written, plus the analytic predictor for test figures that do not
    # depend on the shipped learned predictor.
    (tmp_path / "tilecast.toml").write_text('predictor = "roofline"\n' + doc_config())
    write_models(tmp_path, layers=2)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def create_baselines() -> None:
    """The doc's one-time step: every ``$ tilecast gate ...`` line of its console blocks that
    writes baselines."""
    commands = [line[2:] for block in fenced("console") for line in block.splitlines()
                if line.startswith("$ tilecast gate --update-baseline")]
    assert commands
    for command in commands:
        status, output = _tilecast(shlex.split(command)[1:])
        assert status == 0, output


def test_workflow_shape(workflow):
    uses = [s.get("uses", "") for s in workflow]
    assert uses[0].startswith("actions/checkout@") and uses[1].startswith("actions/setup-python@")
    runs = "\n".join(s.get("run", "") for s in workflow)
    assert "pip install torch==2.13.0" in runs and "pip install tilecast" in runs
    torch_step = next(s for s in workflow if "torch==2.13.0" in s.get("run", ""))
    assert "exports only" in torch_step["name"]
    gate = next(s for s in workflow if s.get("run", "").startswith("tilecast gate"))
    args = shlex.split(gate["run"])
    report = args[args.index("-o") + 1]
    assert args[args.index("--format") + 1] == "markdown"
    comment = next(s for s in workflow if "sticky-pull-request-comment" in s.get("uses", ""))
    assert comment["with"]["path"] == report and "always()" in comment["if"]


def test_workflow_noop_change_passes(workflow, repo):
    create_baselines()
    assert sorted(p.name for p in (repo / ".tilecast").iterdir()) == ["decoder.json",
                                                                      "encoder.json"]
    run = run_workflow(workflow, repo)
    assert run.gate_exit == 0 and run.comment is not None
    assert run.comment.startswith("### tilecast latency gate\n\n✅ no regression\n")
    assert run.summary == run.comment
    assert "| encoder | NVIDIA L4 | inference |" in run.comment
    assert "| decoder | NVIDIA A100 SXM4 80GB |" in run.comment


def test_workflow_added_layers_fail(workflow, repo):
    create_baselines()
    write_models(repo, layers=3)
    run = run_workflow(workflow, repo)
    assert run.gate_exit == 1
    assert run.comment is not None and run.summary == run.comment  # posted despite the failure
    verdict = run.comment.splitlines()[2]
    assert re.match(r"❌ encoder: NVIDIA L4 inference is \d+\.\d % slower \(threshold 5 %\); "
                    r"encoder: NVIDIA A100 SXM4 80GB inference is", verdict), verdict
    assert "decoder" not in verdict
    assert "| `h.2." in run.comment and "| added |" in run.comment


def test_workflow_faster_change_passes(workflow, repo):
    create_baselines()
    write_models(repo, layers=1)
    run = run_workflow(workflow, repo)
    assert run.gate_exit == 0 and run.comment is not None
    verdict = run.comment.splitlines()[2]
    assert verdict.startswith("✅ no regression: encoder: NVIDIA L4 inference is")
    assert "faster" in verdict and "slower" not in verdict
    assert "| removed |" in run.comment


def test_workflow_without_baseline_reports_nothing(workflow, repo):
    run = run_workflow(workflow, repo)  # no baselines: exit 2 and no report to post
    assert run.gate_exit == 2 and run.comment is None and run.summary == ""
    assert "Error: model 'encoder': no baseline at .tilecast/encoder.json" in run.gate_output


def test_workflow_inputs_change_warns(workflow, repo):
    create_baselines()
    onnx.save(gpt2_like(layers=2, batch="batch", seq=16), repo / "models" / "encoder.onnx")
    status, output = _tilecast(["gate"])
    assert status == 0 and "Warning: encoder: the models take different inputs" in output


def test_gate_draws_each_model_of_its_report(repo):
    create_baselines()
    status, output = _tilecast(["gate", "--format", "svg"])
    assert status == 0, output
    svg = output[output.index("<svg"):]
    assert "model encoder:" in svg and "model decoder:" in svg
    assert svg.rstrip().endswith("</svg>")


# --- baselines ------------------------------------------------------------------------------
def test_update_baseline_is_deterministic(repo):
    create_baselines()
    first = (repo / ".tilecast" / "encoder.json").read_bytes()
    create_baselines()
    assert (repo / ".tilecast" / "encoder.json").read_bytes() == first
    data = json.loads(first)
    assert data["kind"] == "tilecast-baseline" and data["model"] == "models/encoder.onnx"
    assert data["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": ["batch", 32]}]
    assert [f["device"] for f in data["forecasts"]] == ["NVIDIA L4", "NVIDIA A100 SXM4 80GB"]
    assert all(f["dims"] == {"batch": 8} for f in data["forecasts"])
    # One kernel per line: a changed kernel is a one-line diff.
    assert first.count(b'\n      {"name": ') == sum(len(f["kernels"]) for f in data["forecasts"])


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema=2),
     f"found baseline schema 2; tilecast {__version__} reads schema 1"),
    (lambda d: d["forecasts"].pop(), "holds no inference forecast for NVIDIA A100 SXM4 80GB"),
    (lambda d: d["forecasts"][0].update(predictor="learned-old"), "predictor 'learned-old'"),
])
def test_stale_baselines_are_errors(repo, edit, message: str):
    create_baselines()
    path = repo / ".tilecast" / "encoder.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    status, output = _tilecast(["gate"])
    assert status == 2 and output.splitlines()[-1].startswith("Error: model 'encoder': ")
    assert message in output


def test_baseline_from_another_version_warns(repo):
    create_baselines()
    path = repo / ".tilecast" / "decoder.json"
    path.write_text(path.read_text().replace(f'"tilecast_version": "{__version__}"',
                                             '"tilecast_version": "0.0.9"'))
    status, output = _tilecast(["gate"])
    assert status == 0, output
    assert "Warning: decoder: .tilecast/decoder.json was written by tilecast 0.0.9" in output


# --- configuration --------------------------------------------------------------------------
MODEL = """
[[models]]
path = "m.onnx"
"""


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    onnx.save(gpt2_like(layers=2), tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def gate(*args: str) -> tuple[int, str]:
    return _tilecast(["gate", *args])


@pytest.mark.parametrize("config, message", [
    ('devices = ["l4"]\ntreshold = "5%"' + MODEL, "tilecast.toml: treshold: unknown key"),
    ('devices = ["l4"]' + MODEL + 'treshold = "5%"', "models[0].treshold: unknown key"),
    ('devices = ["l4"]', "tilecast.toml: models: is missing"),
    ("models = []", "models: must list at least one model"),
    (MODEL, "tilecast.toml: devices: is missing"),
    ('devices = "l4"' + MODEL, "devices: must be a list"),
    ('devices = ["l4", "nope"]' + MODEL, "tilecast.toml: devices[1]: unknown device 'nope'"),
    ('devices = ["l4"]' + MODEL + 'devices = ["h9000"]', "models[0].devices[0]: unknown device"),
    ('devices = ["l4"]\nthreshold = 5' + MODEL, "threshold: threshold 5: write a percentage"),
    ('devices = ["l4"]' + MODEL + 'threshold = "5"', "models[0].threshold: threshold '5'"),
    ('devices = ["l4"]\nmode = "train"' + MODEL, "mode: must be one of inference, training"),
    ('devices = ["l4"]\n[[models]]\nname = "x"', "models[0].path: give exactly one of"),
    ('devices = ["l4"]' + MODEL + 'export = "gpt2"', "models[0].path: give exactly one of"),
    ('devices = ["l4"]' + MODEL + "batch = 8", "models[0].batch: only applies to 'export'"),
    ('devices = ["l4"]' + MODEL + "dims = { batch = 0 }", "models[0].dims.batch: must be a "
                                                          "positive integer"),
    ('devices = ["l4"]' + MODEL + MODEL, "two models are named 'm'"),
    ('devices = ["l4"]\ntop = -1' + MODEL, "top: must be >= 0"),
    ('devices = ["l4"' + MODEL, "tilecast.toml: not valid TOML"),
])
def test_config_errors_name_the_key(bare, config: str, message: str):
    (bare / "tilecast.toml").write_text(config)
    status, output = gate()
    assert status == 2, output
    last = output.splitlines()[-1]
    assert last.startswith("Error: ") and message in last, last


def test_no_config_found(bare):
    status, output = gate()
    assert status == 2 and "no tilecast.toml, nor a [tool.tilecast] table" in output
    status, output = gate("--config", "missing.toml")
    assert status == 2 and "cannot read missing.toml" in output


def test_pyproject_table(bare):
    (bare / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.tilecast]\n'
                                         'devices = ["t4"]\npredictor = "roofline"\n'
                                         '[[tool.tilecast.models]]\npath = "m.onnx"\n'
                                         'threshold = "1ms"\n')
    assert gate("--update-baseline")[0] == 0 and (bare / ".tilecast" / "m.json").is_file()
    onnx.save(gpt2_like(layers=3), bare / "m.onnx")
    status, output = gate("--format", "json")
    assert status == 0  # +0.14 ms is within this model's 1 ms
    data = json.loads(output[output.index("{"):])
    assert data["kind"] == "tilecast-gate" and data["models"][0]["name"] == "m"
    assert data["models"][0]["devices"][0]["threshold"] == "1ms"
    (bare / "pyproject.toml").write_text('[project]\nname = "x"\n')
    status, output = gate("--config", "pyproject.toml")
    assert status == 2 and "no [tool.tilecast] table" in output


def test_per_model_settings(bare):
    config = ('devices = ["l4"]\npredictor = "roofline"\nbaseline_dir = "perf"\ntop = 2\n'
              '[[models]]\nname = "train"\npath = "m.onnx"\nmode = "training"\n'
              'optimizer = "adam"\nthreshold = "60%"\ndevices = ["t4"]\n')
    (bare / "tilecast.toml").write_text(config)
    assert gate("--update-baseline")[0] == 0
    data = json.loads((bare / "perf" / "train.json").read_text())
    assert data["forecasts"][0]["device"] == "Tesla T4"
    assert set(data["forecasts"][0]["by_phase"]) == {"forward", "backward", "update"}
    onnx.save(gpt2_like(layers=3), bare / "m.onnx")
    status, output = gate("--format", "markdown")
    assert status == 0 and "Tesla T4 training is" in output
    assert output.count("| `") == 2  # top = 2 kernels


# --- exported models ------------------------------------------------------------------------
EXPORT_CONFIG = """devices = ["l4"]
predictor = "roofline"

[[models]]
name = "tiny"
export = "tiny-gpt"
batch = 2
seq = 32
layers = 2
"""


def test_export_models_go_through_export_model(bare, monkeypatch: pytest.MonkeyPatch):
    calls: list[tuple[str, dict[str, Any]]] = []

    def export_model(name_or_config: str, *, output: Path, **options: Any) -> Path:
        calls.append((name_or_config, options))
        onnx.save(gpt2_like(layers=options["layers"], seq=options["seq"],
                            batch=options["batch"]), output)
        return output

    fake = type(sys)("tilecast.exporters")
    fake.export_model = export_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tilecast.exporters", fake)
    (bare / "tilecast.toml").write_text(EXPORT_CONFIG)
    assert gate("--update-baseline")[0] == 0
    assert calls == [("tiny-gpt", {"batch": 2, "seq": 32, "layers": 2})]
    assert json.loads((bare / ".tilecast" / "tiny.json").read_text())["model"] == (
        "tiny-gpt (batch=2, seq=32, layers=2)")
    (bare / "tilecast.toml").write_text(EXPORT_CONFIG.replace("layers = 2", "layers = 3"))
    status, output = gate()
    assert status == 1 and "❌ tiny: NVIDIA L4 inference is" in output


def test_export_without_the_export_extra(bare, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "tilecast.exporters", None)  # as if torch were absent
    (bare / "tilecast.toml").write_text(EXPORT_CONFIG)
    status, output = gate("--update-baseline")
    assert status == 2 and "needs the export extra: pip install torch==2.13.0" in output
