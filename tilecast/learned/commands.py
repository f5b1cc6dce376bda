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
    """The MAPE table (or JSON) of tilecast, roofline and the direct regressor; ``cv="logo"``:
    the conv leave-one-GPU-out table on held-out shapes (retrains per fold; needs torch)."""
    from .conv_eval import conv_eval_rows
    from .evaluate import PREDICTORS, evaluate_kernels, format_table

    if cv == "logo":
        return _conv_logo(data_dirs, fmt, echo)

    names = PREDICTORS
    try:
        import sklearn  # noqa: F401
    except ImportError:
        echo("scikit-learn is missing: the 'direct' baseline is skipped")
        names = tuple(p for p in PREDICTORS if p != "direct")
    rows = evaluate_kernels(data_dirs, predictor, predictors=names)
    rows += conv_eval_rows(data_dirs, predictor)  # held-out conv shapes, serving path
    if fmt == "json":
        return json.dumps({"rows": [r.to_json() for r in rows]}, indent=1) + "\n"
    return format_table(rows) + "\n"


def _conv_logo(data_dirs: Sequence[Path], fmt: str, echo: Echo) -> str:
    try:
        from .conv_train import logo_conv
    except ImportError as exc:
        raise ConfigError(f"--cv logo retrains per fold and needs torch ({exc.name} is "
                          "missing): pip install 'tilecast[train]'") from exc
    from .conv_data import load_conv
    from .conv_eval import format_folds

    samples = load_conv(data_dirs)
    if samples is None:
        raise ConfigError("no conv CSVs (kernels/nvidia/train/conv/*.csv) under "
                          + ", ".join(map(str, data_dirs)))
    folds = logo_conv(samples, progress=echo)
    if fmt == "json":
        return json.dumps({"conv_logo": [f.to_json() for f in folds]}, indent=1) + "\n"
    return format_folds(folds) + "\n"
