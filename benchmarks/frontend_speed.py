"""Front-end speed and memory on the exporter corpus: time and peak RSS of ``analyze`` per graph.

Every graph of ``tests/corpus`` (built on the fly and cached under ``~/.cache/tilecast/corpus``,
including GPT-2 small with ~500 MB of inline weights) is analyzed in a fresh subprocess with only
its input dims bound; the child reports its own peak RSS (``VmHWM`` of /proc/self/status, the
kernel's high-water mark; ``getrusage`` where /proc is absent). Target (issue 11):
<= 3 s and <= 400 MB peak RSS per graph, whatever the file size.

    PYTHONPATH=. python benchmarks/frontend_speed.py                # every graph, on L4
    PYTHONPATH=. python benchmarks/frontend_speed.py --only bert_legacy --device h100
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import corpus  # noqa: E402  (tests/corpus: the graph builders)

TIME_LIMIT_S, RSS_LIMIT_MB = 3.0, 400.0

# The child: one analyze, timed; it prints one JSON line. Import time is not counted (it is
# the same for every graph); peak RSS is the whole process's. (The parent's os.wait4 rusage is
# not used: Linux carries the parent's high-water mark into a forked child.)
CHILD = """
import json, resource, sys, time
import tilecast
from tilecast.errors import TilecastError
path, device, dims = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
start = time.perf_counter()
try:
    f = tilecast.analyze(path, device, dims=dims)
    out = {"total_ms": f.total_ms, "unsupported": sum(f.unsupported.values()),
           "unshaped": sum(getattr(f, "unshaped", {}).values())}
except TilecastError as exc:
    out = {"error": str(exc).splitlines()[0][:100]}
out["seconds"] = time.perf_counter() - start
try:
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
    out["rss_mb"] = int(hwm.split()[1]) / 1024
except (OSError, StopIteration):
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def measure(path: Path, device: str, dims: dict[str, int]) -> dict[str, object]:
    """Run the child on one graph: its seconds, peak RSS, forecast and counts (or error)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), device, json.dumps(dims)],
                          capture_output=True, text=True, check=False,
                          cwd=tempfile.gettempdir())  # tilecast from PYTHONPATH, not cwd
    lines = proc.stdout.strip().splitlines()
    if not lines:
        return {"error": f"exit {proc.returncode}", "seconds": 0.0, "rss_mb": 0.0}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="l4")
    parser.add_argument("--only", nargs="*", help="corpus graph names (default: all)")
    args = parser.parse_args()
    names = args.only or list(corpus.NAMES)
    print(f"{'graph':<22}{'file MB':>9}{'s':>7}{'RSS MB':>8}{'ms ' + args.device:>11}"
          f"{'unsup':>7}{'unshp':>7}  verdict")
    for name in names:
        path = corpus.build(name)
        dims = {d: corpus.DIMS[d] for d in corpus.builders.CORPUS[name].dims}
        r = measure(path, args.device, dims)
        ok = r["seconds"] <= TIME_LIMIT_S and r["rss_mb"] <= RSS_LIMIT_MB and "error" not in r
        ms = f"{r['total_ms']:.3f}" if "total_ms" in r else "-"
        print(f"{name:<22}{path.stat().st_size / 1e6:>9.1f}{r['seconds']:>7.2f}"
              f"{r['rss_mb']:>8.0f}{ms:>11}{r.get('unsupported', '-'):>7}"
              f"{r.get('unshaped', '-'):>7}  {'ok' if ok else 'OVER'} {r.get('error', '')}",
              flush=True)


if __name__ == "__main__":
    main()
