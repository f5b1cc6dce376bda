"""SVG charts (tilecast/plots): valid SVG whose marks are the numbers they stand for."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import onnx
import onnx.parser
import pytest
from click.testing import CliRunner
from graph_texts import BATCH_MLP

import tilecast
from tilecast.cli import main
from tilecast.plots import comparison_svg, evaluation_svg, forecast_svg, serving_svg, sweep_svg
from tilecast.plots.svg import log_ticks, nice_ticks
from tilecast.sweep import sweep

NS = {"s": "http://www.w3.org/2000/svg"}


@pytest.fixture
def mlp(batch_mlp) -> Path:
    return batch_mlp("mlp <&> net.onnx")  # markup in the name must be escaped


def _svg(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert float(root.get("height")) > 60 and float(root.get("width")) > 0
    return root


def _bar_widths(root: ET.Element) -> dict[str, float]:
    """Bar rects by their tooltip's label (the part before ': ')."""
    return {r.find("s:title", NS).text.split(": ")[0]: float(r.get("width"))
            for r in root.iterfind(".//s:rect", NS) if r.find("s:title", NS) is not None}


def test_family_bars_are_proportional_to_their_time(gpt2_path: Path) -> None:
    f = tilecast.analyze(gpt2_path, "l4", predictor="roofline")
    root = _svg(forecast_svg(f, top=5))
    widths = _bar_widths(root)
    fams = f.by_family
    top = max(fams, key=fams.get)
    for fam, ms in fams.items():
        assert widths[fam] == pytest.approx(widths[top] * ms / fams[top], abs=0.02)
    texts = " ".join(t.text or "" for t in root.iterfind(".//s:text", NS))
    assert f"{f.total_ms:.3f} ms" in texts and "Slowest 5 kernels" in texts


def _points(line: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in line.get("points").split()]


def test_a_sweep_draws_one_line_per_gpu_with_its_points_in_order(mlp: Path) -> None:
    s = sweep(mlp, ["t4", "h100"], {"batch": [1, 8, 64, 512]}, predictor="roofline")
    root = _svg(sweep_svg(s))
    lines = {ln.find("s:title", NS).text: ln for ln in root.findall(".//s:polyline", NS)}
    gpus = ("Tesla T4", "NVIDIA H100 SXM5 80GB")
    assert sorted(lines) == sorted(f"{g}, graph, eager ({m})" for g in gpus
                                   for m in ("ms per pass", "samples / s"))
    for gpu in gpus:
        rows = [r for r in s.rows if r.device == gpu]
        for measure, values in (("ms per pass", [r.total_ms for r in rows]),
                                ("samples / s", [r.samples_per_s for r in rows])):
            pts = _points(lines[f"{gpu}, graph, eager ({measure})"])
            assert [x for x, _ in pts] == sorted(x for x, _ in pts)  # batch to the right
            # SVG y grows downwards: the larger value, the higher on the page
            assert sorted(range(4), key=lambda i: -pts[i][1]) == sorted(
                range(4), key=values.__getitem__)
    # the throughput panel lies wholly under the latency one
    ms_low = max(y for g in gpus for _, y in _points(lines[f"{g}, graph, eager (ms per pass)"]))
    tp_high = min(y for g in gpus for _, y in _points(lines[f"{g}, graph, eager (samples / s)"]))
    assert ms_low < tp_high
    assert "mlp &lt;&amp;&gt; net" in sweep_svg(s)


def test_a_sweep_over_another_dim_has_no_throughput_panel(mlp: Path, tmp_path: Path) -> None:
    text = BATCH_MLP.replace("float[batch, 256] x", "float[8, seq, 256] x").replace(
        "float[batch, 512] y", "float[8, seq, 512] y")
    onnx.save(onnx.parser.parse_model(text), tmp_path / "seq.onnx")
    s = sweep(tmp_path / "seq.onnx", ["l4"], {"seq": [16, 64]}, predictor="roofline")
    titles = [ln.find("s:title", NS).text for ln in _svg(sweep_svg(s)).findall(".//s:polyline",
                                                                             NS)]
    assert titles == ["NVIDIA L4, graph, eager (ms per pass)"]


def test_a_sweep_without_a_varied_dim_is_bars_and_lists_its_skips(mlp: Path) -> None:
    s = sweep(mlp, ["t4", "a100-sxm4-40gb"], {"batch": [8]}, math="tf32", predictor="roofline")
    text = sweep_svg(s)
    root = _svg(text)
    assert not root.findall(".//s:polyline", NS)
    assert "NVIDIA A100 SXM4 40GB, tf32, eager" in _bar_widths(root)
    assert re.search(r"skipped Tesla T4 tf32 eager: .*no TF32", text)


def test_every_row_skipped_is_still_a_chart(mlp: Path) -> None:
    # sweep() refuses such a sweep; a Sweep built another way (from its JSON) can hold one
    s = sweep(mlp, ["t4", "a100-sxm4-40gb"], {"batch": [1, 8]}, math="tf32",
              predictor="roofline")
    only_skips = replace(s, rows=tuple(r for r in s.rows if r.total_ms is None))
    assert "every row was skipped" in sweep_svg(only_skips)
    _svg(sweep_svg(only_skips))


# nice_ticks: steps of 1, 2 or 5 x 10^k covering the range; log_ticks: 1-2-5 per decade.
@pytest.mark.parametrize(("lo", "hi", "ticks"), [
    (0, 10, [0, 2, 4, 6, 8, 10]),        # raw step 2 -> 2
    (0, 0.7, [0, 0.2, 0.4, 0.6, 0.8]),   # raw 0.14 -> 0.2, the last tick past 0.7
    (0, 0, [0, 0.2, 0.4, 0.6, 0.8, 1.0]),  # an empty range widens to [0, 1]
])
def test_nice_ticks(lo: float, hi: float, ticks: list[float]) -> None:
    assert nice_ticks(lo, hi) == pytest.approx(ticks)


def test_log_ticks_cover_the_range() -> None:
    assert log_ticks(3, 40) == pytest.approx([2, 5, 10, 20, 50])
    assert log_ticks(0.01, 1e5) == pytest.approx([10.0 ** e for e in range(-2, 6)])


def test_cli_writes_svg_and_refuses_it_with_parallel(gpt2_path: Path, mlp: Path,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "f.svg"
    res = CliRunner().invoke(main, ["analyze", str(gpt2_path), "-d", "l4", "--predictor",
                                    "roofline", "--format", "svg", "-o", str(out)])
    assert res.exit_code == 0, res.output
    _svg(out.read_text())
    res = CliRunner().invoke(main, ["sweep", str(mlp), "-d", "t4,l4", "--dim", "batch=1,16",
                                    "--predictor", "roofline", "--format", "svg"])
    # two GPUs, each a latency and a throughput line
    assert res.exit_code == 0 and len(_svg(res.output).findall(".//s:polyline", NS)) == 4
    res = CliRunner().invoke(main, ["analyze", str(gpt2_path), "--mode", "training",
                                    "--parallel", "dp=2", "--cluster", "dgx-a100",
                                    "--format", "svg"])
    assert res.exit_code != 0 and "Error:" in res.output and "--format svg" in res.output
    assert "Traceback" not in res.output


GPT = dict(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=1000)


def _serve(batch: int | None = None):
    from tilecast.analyzer.synthetic import gpt2_like
    from tilecast.serving import analyze_serving

    return analyze_serving(gpt2_like(**GPT), "l4", generate=9, batch=batch,
                           predictor="roofline")


def test_one_request_is_its_phases_whose_bars_add_up() -> None:
    f = _serve()
    widths = list(_bar_widths(_svg(serving_svg([f]))).values())
    ttft, decode, total = widths  # prefill + 8 decode steps = the request
    assert ttft + decode == pytest.approx(total, abs=0.02)
    assert total == max(widths) and f.total_ms == pytest.approx(f.ttft_ms + 8 * f.tpot_ms)


def test_batch_sizes_are_a_latency_throughput_curve_greying_what_does_not_fit() -> None:
    runs = [_serve(b) for b in (1, 4, 16)]
    # the largest batch made too big for the L4's memory: its KV cache alone
    runs[-1] = replace(runs[-1], kv_bytes_per_token=runs[-1].capacity_bytes)
    text = serving_svg(runs)
    root = _svg(text)
    dots = root.findall(".//s:circle", NS)
    assert [d.find("s:title", NS).text.split(":")[0] for d in dots] == [
        "batch 1", "batch 4", "batch 16"]
    xs = [float(d.get("cx")) for d in dots]
    assert xs == sorted(xs)  # more batch, more tokens per second, further right
    assert [d.get("fill") for d in dots][-1] != dots[0].get("fill")
    assert "grey: batch 16 does not fit" in text


def test_cli_serve_writes_a_chart(tmp_path: Path) -> None:
    from tilecast.analyzer.synthetic import gpt2_like

    path = tmp_path / "gpt.onnx"
    onnx.save(gpt2_like(**GPT), path)
    res = CliRunner().invoke(main, ["serve", str(path), "-d", "l4", "--generate", "9",
                                    "--batch", "1,8", "--predictor", "roofline",
                                    "--format", "svg"])
    assert res.exit_code == 0, res.output
    assert len(_svg(res.output).findall(".//s:circle", NS)) == 2


def _run(gpu: str, measured: float, predicted: float):
    from tilecast.evaluation.runner import Run

    return Run(gpu, "bert", "inference", 8, 128, "plain", measured, predicted,
               abs(predicted - measured) / measured * 100, None)


def test_forecast_against_measured_puts_an_exact_run_on_the_diagonal() -> None:
    from tilecast.evaluation.runner import EvalResult

    runs = (_run("A", 10.0, 10.0), _run("A", 100.0, 125.0), _run("B", 3.0, 2.4))
    text = evaluation_svg(EvalResult(runs, (), (), "roofline"))
    root = _svg(text)
    dots = [(float(d.get("cx")), float(d.get("cy"))) for d in root.iterfind(".//s:circle", NS)]
    assert len(dots) == 3
    diagonal = next(ln for ln in root.iterfind(".//s:line", NS) if ln.get("stroke") == "#555")
    (x1, y1), (x2, y2) = ((float(diagonal.get(f"x{i}")), float(diagonal.get(f"y{i}")))
                          for i in (1, 2))
    (px, py) = dots[0]  # measured = forecast: on the diagonal (collinear with its ends)
    assert (x2 - x1) * (py - y1) - (y2 - y1) * (px - x1) == pytest.approx(0, abs=1e-3)
    qx, qy = dots[1]  # forecast 25 % over: above the diagonal (smaller y on the page)
    assert qy < y1 + (y2 - y1) * (qx - x1) / (x2 - x1)
    # MAPE over all runs (0 + 25 + 20) / 3 = 15.0; per GPU A (0 + 25) / 2, B 20
    assert "MAPE 15.0 %" in text and "A (n 2, MAPE 12.5 %)" in text
    assert "B (n 1, MAPE 20.0 %)" in text


def test_evaluate_refuses_svg_by_family(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["evaluate", str(tmp_path), "--by-family", "--format",
                                    "svg"])
    assert res.exit_code != 0 and "--format svg" in res.output and "Traceback" not in res.output


def _mlp_at(tmp_path: Path, batch: int) -> Path:
    path = tmp_path / f"mlp{batch}.onnx"
    onnx.save(onnx.parser.parse_model(BATCH_MLP.replace("batch", str(batch))), path)
    return path


def test_a_comparison_shows_each_family_before_and_after_and_slower_kernels_right(
        tmp_path: Path) -> None:
    # the same MLP at batch 64 (base) and 256 (new): every kernel slower, nothing faster
    cmp = tilecast.compare(_mlp_at(tmp_path, 64), _mlp_at(tmp_path, 256), ["l4", "h100"],
                           predictor="roofline")
    root = _svg(comparison_svg([cmp]))
    bars = {r.find("s:title", NS).text: float(r.get("width"))
            for r in root.iterfind(".//s:rect", NS) if r.find("s:title", NS) is not None}
    l4 = cmp.devices[0]
    fam = max(l4.by_family, key=lambda f: f.new_ms)
    assert bars[f"{fam.family} base: {fam.base_ms:.4f} ms"] == pytest.approx(
        bars[f"{fam.family} new: {fam.new_ms:.4f} ms"] * fam.base_ms / fam.new_ms, abs=0.02)
    centre = float(next(ln for ln in root.iterfind(".//s:line", NS)
                        if ln.get("stroke") == "#333").get("x1"))
    slower = [r for r in root.iterfind(".//s:rect", NS) if r.find("s:title", NS) is not None
              and "changed, +" in r.find("s:title", NS).text]
    assert slower and all(float(r.get("x")) == pytest.approx(centre) for r in slower)
    text = comparison_svg([cmp])
    assert "REGRESSED" in text and l4.summary in text


def test_cli_compare_svg_keeps_the_regression_exit_status(tmp_path: Path) -> None:
    paths = [_mlp_at(tmp_path, batch) for batch in (64, 4096)]
    res = CliRunner().invoke(main, ["compare", *map(str, paths), "-d", "l4", "--predictor",
                                    "roofline", "--format", "svg"])
    assert res.exit_code == 1  # slower past the threshold: the gate still fails
    _svg(res.output[res.output.index("<svg"):])


def test_a_training_step_is_drawn_by_phase_too(gpt2_path: Path) -> None:
    f = tilecast.analyze(gpt2_path, "l4", mode="training", optimizer="adam",
                         predictor="roofline")
    widths = _bar_widths(_svg(forecast_svg(f)))
    phases = f.by_phase
    assert set(phases) == {"forward", "backward", "update"}
    longest = max(phases, key=phases.get)
    for phase, ms in phases.items():  # one scale: proportional to each phase's ms
        assert widths[phase] == pytest.approx(widths[longest] * ms / phases[longest], abs=0.02)
    assert "Time by phase" not in forecast_svg(tilecast.analyze(gpt2_path, "l4",
                                                                predictor="roofline"))
