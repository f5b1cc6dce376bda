"""Time `tilecast analyze` on a GPT-3 2.7B-shaped graph against a bare `onnx.load`, and report
peak memory.

    python benchmarks/analyze_speed.py [--model PATH] [--device l4] [--repeats 5]

Without --model it builds the graph with tilecast's synthetic GPT-2 builder (32 layers, hidden
2560, 32 heads, batch 2, seq 2048, vocab 50257; weights as external references that do not
exist). With --model it measures any ONNX file (e.g. a `tilecast export gpt3-2.7b` output).
Each measurement runs in a fresh subprocess so peak RSS (ru_maxrss) is the measurement's own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
what, path, device, predictor = sys.argv[1:5]
import onnx
t_import = time.perf_counter()
if what == "load":
    onnx.load(path, load_external_data=False)
else:
    import tilecast
    t_import = time.perf_counter()
    f = tilecast.analyze(path, device, predictor=predictor)
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t_import, "process_seconds": t1 - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(what: str, path: Path, device: str, predictor: str, repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", CHILD, what, str(path), device, predictor],
                             check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def cli_seconds(args: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def build_default(tmp: Path) -> Path:
    import onnx

    from tilecast.analyzer.synthetic import gpt2_like

    path = tmp / "gpt3-2.7b-b2-s2048.onnx"
    onnx.save(gpt2_like(layers=32, hidden=2560, heads=32, seq=2048, batch=2, vocab=50257,
                        name="gpt3_2.7b"), path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--device", default="l4")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or build_default(Path(tmp))
        print(f"model: {path} ({path.stat().st_size / 1e6:.2f} MB on disk)")
        load = measure("load", path, args.device, "default", args.repeats)
        rows = [("bare onnx.load (no external data)", load)]
        for pred in ("roofline", "default"):
            rows.append((f"tilecast.analyze (predictor={pred})",
                         measure("analyze", path, args.device, pred, args.repeats)))
        title = f"in-process timing (median of {args.repeats})"
        print(f"{title:<44}{'seconds':>10}"
              f"{'x load':>9}{'peak RSS MB':>13}")
        for label, r in rows:
            print(f"{label:<44}{r['seconds']:>10.3f}{r['seconds'] / load['seconds']:>9.1f}"
                  f"{r['peak_rss_mb']:>13.0f}")
        py = sys.executable
        bare = cli_seconds([py, "-c", f"import onnx; onnx.load({str(path)!r}, "
                            "load_external_data=False)"], args.repeats)
        cli = cli_seconds([py, "-m", "tilecast", "analyze", str(path), "-d", args.device],
                          args.repeats)
        print(f"\nwhole commands: `python -c onnx.load` {bare:.3f} s, `tilecast analyze` "
              f"{cli:.3f} s ({cli / bare:.1f}x)")
        added = rows[2][1]["seconds"] - rows[1][1]["seconds"]
        print(f"learned predictor adds {added * 1e3:.0f} ms over roofline")


if __name__ == "__main__":
    main()
