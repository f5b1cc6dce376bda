"""What the ``tilecast train`` and ``tilecast kernels-eval`` commands run (the CLI stays thin)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError

MAX_REPEATS = 10  # each repeat retrains every fold (minutes each on two cores)
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
                         echo: Echo, cv: str = "none", repeats: int = 1,
                         families: Sequence[str] = (), bands: Path | None = None) -> str:
    """The MAPE table (or JSON) of tilecast, roofline and the direct regressor; with
    ``cv="logo"`` the leave-one-GPU-out folds instead, run ``repeats`` times from disjoint
    training seeds and averaged, of ``families`` only when any are given; ``bands``: write
    the folds' error bands there (``bands.py``)."""
    from .conv_eval import conv_eval_rows
    from .evaluate import PREDICTORS, evaluate_kernels, format_table, tile_accuracy
    from .prepare import TRAINED_FAMILIES

    if repeats < 1 or repeats > MAX_REPEATS:
        raise ConfigError(f"--repeats must be 1 to {MAX_REPEATS}, got {repeats}")
    unknown = sorted(set(families) - set(TRAINED_FAMILIES))
    if unknown:
        raise ConfigError(f"--family {unknown[0]!r} is not a trained family (one of "
                          f"{', '.join(TRAINED_FAMILIES)})")
    if cv == "logo":
        return _logo_command(data_dirs, fmt, echo, repeats, tuple(families), bands)
    if bands is not None:
        raise ConfigError("--write-bands takes the leave-one-GPU-out folds' errors: use it "
                          "with --cv logo")
    if repeats != 1:
        raise ConfigError("--repeats retrains the leave-one-GPU-out folds: use it with --cv logo")
    if families:
        raise ConfigError("--family picks the families the leave-one-GPU-out folds retrain: "
                          "use it with --cv logo")

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


def _logo_command(data_dirs: Sequence[Path], fmt: str, echo: Echo, repeats: int = 1,
                  families: tuple[str, ...] = (), bands_path: Path | None = None) -> str:
    try:
        from .conv_train import average_folds, fold_tile_tables, logo_conv
        from .cv import average_rows, logo, repeat_seeds, summary
        from .train import TrainConfig
    except ImportError as exc:
        raise ConfigError(f"--cv logo trains models and needs torch ({exc.name} is missing): "
                          "pip install 'tilecast[train]'") from exc
    import numpy as np

    from .bands import BandCollector
    from .conv_data import load_conv
    from .conv_eval import format_folds
    from .evaluate import SHAPES, format_table

    base = TrainConfig()
    if families:  # each family trains on its own: leave the others out of every fold
        base = replace(base, families=tuple(f for f in base.families if f in families))
    # conv: its own GPUs, on held-out shapes (conv_train.py)
    samples = load_conv(data_dirs) if "conv" in base.families else None
    tables = fold_tile_tables(data_dirs) if samples is not None else None
    seeds = repeat_seeds(repeats, base)
    runs, conv_runs = [], []
    collector = BandCollector() if bands_path is not None else None
    fold_kernels = None if collector is None else \
        (lambda test, pred: collector.add(test.family, test.latency_ms, pred))
    fold_convs = None if collector is None else \
        (lambda measured, pred: collector.add(np.full(len(measured), "conv"), measured, pred))
    for seed in seeds:
        if repeats > 1:
            echo(f"repeat with training seed {seed}")
        config = replace(base, seed=seed)
        others = any(f != "conv" for f in config.families)
        runs.append(logo(data_dirs, config, progress=echo, collect=fold_kernels)
                    if others else [])
        conv_runs.append(logo_conv(samples, config, progress=echo, collect=fold_convs,
                                   tables=tables) if samples is not None else [])
    if collector is not None:
        _write_bands(collector, bands_path, data_dirs, repeats, families, echo)
    rows, folds = average_rows(runs), average_folds(conv_runs)
    by_seed = [_seed_summary(seed, r, f) for seed, r, f in zip(seeds, runs, conv_runs,
                                                                  strict=True)]
    if fmt == "json":
        return json.dumps({"seeds": list(seeds), "folds": [r.to_json() for r in rows],
                           "conv_folds": [f.to_json() for f in folds], "by_seed": by_seed},
                          indent=1) + "\n"
    mean = ", ".join(f"{fam} {v:.1f} %" for fam, v in summary(rows).items())
    shapes = ", ".join(f"{fam} {v:.1f} %" for fam, v in summary(rows, SHAPES).items())
    over = f" (mean of {repeats} runs, training seeds {', '.join(map(str, seeds))})" \
        if repeats > 1 else ""
    parts = [format_table(rows) + f"\n\nmean over the held-out GPUs (tilecast){over}: {mean}"
             + f"\n... on their held-out shapes only (column {SHAPES}): {shapes}"] if rows \
        else []
    parts += [format_folds(folds)] if folds else []
    return "\n\n".join(parts) + _spread_lines(by_seed) + "\n"


def _write_bands(collector, path: Path, data_dirs: Sequence[Path], repeats: int,
                 families: tuple[str, ...], echo: Echo) -> None:
    """The folds' error bands as JSON at ``path`` (``bands.py``), with the command that made
    them."""
    cmd = ("tilecast kernels-eval --data " + " ".join(str(d) for d in data_dirs)
           + " --cv logo" + (f" --repeats {repeats}" if repeats > 1 else "")
           + "".join(f" --family {f}" for f in families) + f" --write-bands {path.name}")
    bands = collector.bands(protocol=cmd)
    path.write_text(json.dumps(bands.to_json(), indent=1) + "\n")
    echo(f"wrote {path}: " + ", ".join(f"{b.family}[{b.decade}] {b.low:.2f}-{b.high:.2f}"
                                      for b in bands.bands))


def _seed_summary(seed: int, rows, folds) -> dict:
    """One run's means over the held-out GPUs (all kernels, held-out shapes, conv)."""
    from .cv import summary
    from .evaluate import SHAPES

    conv = [f.tilecast_mape_pct for f in folds]
    return {"seed": seed, "mean": summary(rows), "shapes": summary(rows, SHAPES),
            "conv_mean": sum(conv) / len(conv) if conv else None}


def _spread_lines(by_seed: list[dict]) -> str:
    """How far the runs' means lie apart per family: a change of the protocol's means by less
    than this is not evidence either way."""
    if len(by_seed) < 2:
        return ""
    lines = ["", "spread over the training seeds (max - min of the means; all kernels / held-out "
             "shapes):"]
    for fam in by_seed[0]["mean"]:
        a = [b["mean"][fam] for b in by_seed]
        h = [b["shapes"].get(fam, float("nan")) for b in by_seed]
        lines.append(f"  {fam:12s} {max(a) - min(a):5.1f} / {max(h) - min(h):5.1f}  (runs: "
                     + ", ".join(f"{x:.1f}/{y:.1f}" for x, y in zip(a, h, strict=True)) + ")")
    conv = [b["conv_mean"] for b in by_seed if b["conv_mean"] is not None]
    if len(conv) == len(by_seed):
        lines.append(f"  {'conv':12s} {max(conv) - min(conv):5.1f}  (runs: "
                     + ", ".join(f"{c:.1f}" for c in conv) + ")")
    return "\n".join(lines)
