"""Time `tilecast export` of real-size models, with peak memory and the written file's size.

    python benchmarks/export_speed.py [--case NAME:BATCH:SEQ ...] [--keep DIR]

Default cases: gpt3-2.7b at batch 2, seq 2048 and llama-3-8b at batch 1, seq 4096 (zoo names).
Each export runs in a fresh process (the command line's own path: imports, build on the meta
device, trace, write); wall time is the whole process, peak RSS is that process's ru_maxrss
(from os.wait4, so one case never masks another). Targets on a 2-core machine: under 60 s and
3 GB each, .onnx under 20 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_CASES = ("gpt3-2.7b:2:2048", "llama-3-8b:1:4096")
TARGETS = {"seconds": 60.0, "peak_rss_mb": 3072.0, "onnx_mb": 20.0}
CHILD = r"""
import json, sys
from tilecast.exporters import export_model
name, batch, seq, out = sys.argv[1:5]
r = export_model(name, batch=int(batch), seq=int(seq), output=out)
print(json.dumps({"nodes": r.nodes, "parameters": r.parameters, "in_process_s": r.seconds}))
"""


def measure(case: str, folder: Path) -> dict:
    name, batch, seq = case.split(":")
    out = folder / f"{name}-b{batch}-s{seq}.onnx"
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, name, batch, seq, str(out)],
                                stdout=stdout, stderr=stderr, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0), stderr.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{case}: export failed\n{stderr.read()}")
        child = json.loads(stdout.read().strip().splitlines()[-1])
    return {"case": case, "seconds": round(seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024),  # Linux reports KiB
            "onnx_mb": round(out.stat().st_size / 1e6, 2), "nodes": child["nodes"],
            "parameters_b": round(child["parameters"] / 1e9, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", help="NAME:BATCH:SEQ (repeatable)")
    parser.add_argument("--keep", type=Path, help="Write the .onnx files here (else a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        rows = [measure(c, folder) for c in args.case or DEFAULT_CASES]
    print(f"{'case':<22} {'wall s':>7} {'peak RSS MB':>12} {'.onnx MB':>9} {'nodes':>6}  "
          f"{'params':>7}  within targets")
    for r in rows:
        ok = all(r[k] <= v for k, v in TARGETS.items())
        print(f"{r['case']:<22} {r['seconds']:>7} {r['peak_rss_mb']:>12.0f} {r['onnx_mb']:>9} "
              f"{r['nodes']:>6}  {r['parameters_b']:>6}B  {'yes' if ok else 'NO'}")
    print(f"targets: < {TARGETS['seconds']:.0f} s, < {TARGETS['peak_rss_mb']:.0f} MB peak RSS, "
          f"< {TARGETS['onnx_mb']:.0f} MB .onnx; cpu count {os.cpu_count()}")


if __name__ == "__main__":
    main()
