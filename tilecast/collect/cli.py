"""Argument handling of ``tilecast collect`` (kept out of cli.py so the CLI stays thin)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError
from .shapes import default_grid, parse_dtypes, parse_ops, read_shapes_file, zoo_shapes

ZOO_DIR = Path(__file__).resolve().parents[1] / "exporters" / "zoo"


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".tilecast-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output folder {out} is not writable ({exc.strerror or exc})"
                          ) from None


def _shapes(spec: str, ops: tuple[str, ...], per_op: int):
    if spec != "default":
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"shapes file not found: {path}")
        return read_shapes_file(path, ops)
    zoo = sorted(ZOO_DIR.glob("*.json")) if ZOO_DIR.is_dir() else []
    return [s for op in ops for s in (*default_grid(op, per_op), *zoo_shapes(op, zoo))]


def _device_info(path: Path | None) -> dict | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--device-info {path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--device-info {path}: expected a JSON object of device fields")
    return data


def collect_command(out: Path, ops: str, dtypes: str, shapes: str, per_op: int, repeats: int,
                    device_spec: str, device_info: Path | None,
                    echo: Callable[[str], None], budget_s: float | None = None) -> str:
    from .runner import run_collection

    op_names, dts = parse_ops(ops), parse_dtypes(dtypes)
    shape_list = _shapes(shapes, op_names, per_op)
    info = _device_info(device_info)
    _writable(out)

    def progress(i: int, n: int, label: str) -> None:
        end = "\n" if i == n or not sys.stderr.isatty() and i % 50 else "\r"
        if sys.stderr.isatty() or i == n or i % 50 == 1:
            print(f"[{i}/{n}] {label}".ljust(60), end=end, file=sys.stderr, flush=True)

    res = run_collection(out, shape_list, dts, device_spec=device_spec, repeats=repeats,
                         device_info=info, progress=progress, budget_s=budget_s)
    left = (f", {res.left_for_next_run} left for the next run (--budget-s ran out)"
            if res.left_for_next_run else "")
    return (f"{res.device}: measured {res.measured} kernels, {res.skipped_existing} already in "
            f"{out}, {res.skipped_too_large} skipped as too large{left}; files: "
            + ", ".join(str(f) for f in res.files))
