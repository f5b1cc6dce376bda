"""Leave-one-GPU-out cross-validation: the protocol that chooses features, target and
hyper-parameters (``tilecast kernels-eval --cv logo``).

Each fold trains on every training GPU but one and scores the held-out GPU on all of its
kernels (train and eval shapes alike: the GPU itself is unseen), beside the roofline on the
same rows, and again on its held-out shapes alone (column ``shapes``: the eval split, where
rows wider than the training data and other unseen shapes live). The development GPUs (L4,
A100 80GB) are never part of this protocol.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..analyzer.predictor import RooflinePredictor
from .dataset import KernelSamples, load_kernels
from .evaluate import SHAPES, EvalRow, load_eval, mape_rows, predict_by_device
from .prepare import TRAIN_DEVICES, DeviceLookup, default_lookup

# The folds: NVIDIA's five training GPUs (AMD's two train in every fold).
LOGO_GPUS = tuple(d for d in TRAIN_DEVICES if not d.startswith("AMD"))


def held_out_rows(data_dirs: Sequence[Path | str], gpu: str
                  ) -> tuple[KernelSamples, np.ndarray]:
    """Every measured kernel of one GPU, train and eval splits, and which rows are eval."""
    train, ev = (s.select(s.device == gpu)
                 for s in (load_kernels(data_dirs, "train"), load_eval(data_dirs)))
    return KernelSamples.concat([train, ev]), np.arange(len(train) + len(ev)) >= len(train)


def logo(data_dirs: Sequence[Path | str], config=None, gpus: Sequence[str] = LOGO_GPUS,
         lookup: DeviceLookup = default_lookup,
         progress: Callable[[str], None] | None = None,
         collect: Callable[[KernelSamples, np.ndarray], None] | None = None) -> list[EvalRow]:
    """MAPE per held-out GPU x family for tilecast (trained without that GPU) and roofline.
    Only ``config.families`` train and are scored: a run of one or two families takes a
    fraction of the time of all of them (each family's model trains on its own).
    ``collect(kernels, forecast_ms)`` receives each fold's held-out kernels (``bands.py``)."""
    from .predictor import OnnxPredictor
    from .train import TrainConfig, train_all

    config = config or TrainConfig()
    # Conv has its own folds on held-out shapes (conv_train.logo_conv).
    families = tuple(f for f in config.families if f != "conv")
    rows: list[EvalRow] = []
    for gpu in gpus:
        if progress:
            progress(f"fold: {gpu} held out")
        fold = replace(config, devices=tuple(d for d in config.devices if d != gpu),
                       families=families)
        with tempfile.TemporaryDirectory() as tmp:
            train_all(data_dirs, tmp, fold, progress=None, lookup=lookup)
            test, shapes = held_out_rows(data_dirs, gpu)
            keep = np.isin(test.family, families)
            test, shapes = test.select(keep), shapes[keep]
            model = OnnxPredictor(Path(tmp), families=families)
            preds = {"tilecast": predict_by_device(model, test, lookup),
                     "roofline": predict_by_device(RooflinePredictor(), test, lookup)}
        rows += mape_rows(test, preds)
        if collect is not None:
            collect(test, preds["tilecast"])
        if shapes.any():
            rows += [replace(r, predictor=SHAPES) for r in
                     mape_rows(test.select(shapes), {"tilecast": preds["tilecast"][shapes]})]
    return rows


def summary(rows: Sequence[EvalRow], predictor: str = "tilecast") -> dict[str, float]:
    """Mean MAPE over the folds per family (``predictor``: tilecast, or SHAPES)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if r.predictor == predictor:
            out.setdefault(r.family, []).append(r.mape_pct)
    return {fam: float(np.mean(v)) for fam, v in out.items()}


def repeat_seeds(repeats: int, config=None) -> tuple[int, ...]:
    """Training seeds of ``repeats`` runs of the protocol whose ensemble members never share
    a seed (members of a run use seed, seed + 1, ...: ``TrainConfig.ensemble``)."""
    from .train import TrainConfig

    config = config or TrainConfig()
    step = max(1, config.ensemble)
    return tuple(config.seed + step * i for i in range(repeats))


def average_rows(runs: Sequence[Sequence[EvalRow]]) -> list[EvalRow]:
    """One row per (GPU, family, predictor): the MAPE averaged over runs of the protocol that
    differ only in their training seed (the first run's order)."""
    cells: dict[tuple[str, str, str], list[EvalRow]] = {}
    for rows in runs:
        for r in rows:
            cells.setdefault((r.gpu, r.family, r.predictor), []).append(r)
    return [replace(rs[0], mape_pct=float(np.mean([r.mape_pct for r in rs])))
            for rs in cells.values()]
