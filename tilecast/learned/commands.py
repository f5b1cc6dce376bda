"""What the ``tilecast train`` and ``tilecast kernels-eval`` commands run (the CLI stays thin)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ConfigError

Echo = Callable[[str], None]


def _out_folder(path: Path) -> Path:
    """``-o`` may name the folder or the .onnx file inside it (its name is fixed)."""
    from .export import ARTIFACT_NAME

    if path.suffix == ".onnx":
        if path.name != ARTIFACT_NAME:
            raise ConfigError(f"the predictor file must be named {ARTIFACT_NAME} (got {path})")
        return path.parent
    return path


def train_command(data_dirs: Sequence[Path], out: Path, epochs: int | None, echo: Echo) -> str:
    """Train every family, write the artifacts, return a summary line per family."""
    try:
        from .train import TrainConfig, train_all
    except ImportError as exc:
        raise ConfigError(f"tilecast train needs torch ({exc.name} is missing): "
                          "pip install 'tilecast[train]'") from exc
    config = TrainConfig() if epochs is None else TrainConfig(epochs=epochs)
    t0 = time.perf_counter()
    folder = _out_folder(out)
    scores = train_all(data_dirs, folder, config, progress=echo)
    lines = [f"{fam:12s} validation MAPE {val:5.1f} % (held-out shapes, training GPUs)"
             for fam, val in scores.items()]
    lines.append(f"wrote {folder} in {time.perf_counter() - t0:.0f} s")
    return "\n".join(lines) + "\n"


def kernels_eval_command(data_dirs: Sequence[Path], predictor: Path | None, fmt: str,
                         echo: Echo, cv: str = "none") -> str:
    """The MAPE table (or JSON) of tilecast, roofline and the direct regressor; with
    ``cv="logo"`` the leave-one-GPU-out folds instead."""
    from .conv_eval import conv_eval_rows
    from .evaluate import PREDICTORS, evaluate_kernels, format_table, tile_accuracy

    if cv == "logo":
        return _logo_command(data_dirs, fmt, echo)

    names = PREDICTORS
    try:
        import sklearn  # noqa: F401
    except ImportError:
        echo("scikit-learn is missing: the 'direct' baseline is skipped")
        names = tuple(p for p in PREDICTORS if p != "direct")
    rows = evaluate_kernels(data_dirs, predictor, predictors=names)
    rows += conv_eval_rows(data_dirs, predictor)  # held-out conv shapes, serving path
    tiles = tile_accuracy(data_dirs, predictor)
    if fmt == "json":
        return json.dumps({"rows": [r.to_json() for r in rows],
                           "tile_selection": [t.to_json() for t in tiles]}, indent=1) + "\n"
    lines = ["", "matmul tile selection on held-out shapes (predicted tile == the tile cuBLAS ran;"
             " split-K count too)", f"{'GPU':26s} {'op':8s} {'n':>6s} {'tile':>7s} "
             f"{'tile+split':>11s}"]
    lines += [f"{t.gpu:26s} {t.op:8s} {t.n:6d} {t.tile_pct:6.1f}% {t.config_pct:10.1f}%"
              for t in tiles]
    return format_table(rows) + "\n" + "\n".join(lines) + "\n"


def _logo_command(data_dirs: Sequence[Path], fmt: str, echo: Echo) -> str:
    try:
        from .conv_train import logo_conv
        from .cv import logo, summary
    except ImportError as exc:
        raise ConfigError(f"--cv logo trains models and needs torch ({exc.name} is missing): "
                          "pip install 'tilecast[train]'") from exc
    from .conv_data import load_conv
    from .conv_eval import format_folds
    from .evaluate import SHAPES, format_table

    rows = logo(data_dirs, progress=echo)
    samples = load_conv(data_dirs)  # conv: its own GPUs, on held-out shapes (conv_train.py)
    folds = logo_conv(samples, progress=echo) if samples is not None else []
    if fmt == "json":
        return json.dumps({"folds": [r.to_json() for r in rows],
                           "conv_folds": [f.to_json() for f in folds]}, indent=1) + "\n"
    mean = ", ".join(f"{fam} {v:.1f} %" for fam, v in summary(rows).items())
    shapes = ", ".join(f"{fam} {v:.1f} %" for fam, v in summary(rows, SHAPES).items())
    conv = "\n\n" + format_folds(folds) if folds else ""
    return (format_table(rows) + f"\n\nmean over the held-out GPUs (tilecast): {mean}"
            + f"\n... on their held-out shapes only (column {SHAPES}): {shapes}" + conv + "\n")
