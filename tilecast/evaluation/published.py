"""Read the paper's published error tables (``published/`` of the shared dataset).

Result: {(gpu_dir, model_stem, mode, batch, variant): error_pct} for the method tilecast
builds on (the "NeuSight" rows and columns).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

Key = tuple[str, str, str, int, str]
DISPLAY_TO_STEM = {"BERT-Large": "bert_large", "BERT": "bert_large",
                   "GPT2-Large": "gpt2_large", "GPT3-XL": "gpt3_xl", "OPT-1.3B": "opt_13",
                   "GPT3-2.7B": "gpt3_27", "SwitchTrans": "switchxl4"}
FUSION_GPUS = {"L4": "NVIDIA_L4", "A100-40GB": "NVIDIA_A100-PCIE-40GB"}
PCT = re.compile(r"\(?(-?\d+(?:\.\d+)?)%?\)?")


def _pct(text: str) -> float | None:
    m = PCT.search(text.strip()) if text and text.strip() else None
    return float(m.group(1)) if m else None


def _spread(row: list[str]) -> list[str]:
    """Fill a header row whose names span two columns ("BERT-Large,,GPT2-Large,,...")."""
    out, last = [], ""
    for cell in row:
        last = cell or last
        out.append(last)
    return out


def _nvidia(path: Path, mode: str) -> dict[Key, float]:
    rows = list(csv.reader(path.open()))
    out: dict[Key, float] = {}
    gpu, models, batches = "", [], []
    for row in rows:
        if not row or not any(row):
            continue
        if len(row) == 1 or (row[0] and not any(row[1:])):
            gpu = row[0].strip()
        elif row[0] == "Model":
            models = _spread(row[1:])
        elif row[0] == "Batch":
            batches = row[1:]
        elif row[0] == "NeuSight":
            for name, batch, cell in zip(models, batches, row[1:], strict=False):
                value = _pct(cell)
                if value is not None and name in DISPLAY_TO_STEM and batch:
                    out[(gpu, DISPLAY_TO_STEM[name], mode, int(batch), "plain")] = value
    return out


def _amd(path: Path, mode: str) -> dict[Key, float]:
    rows = [r for r in csv.reader(path.open()) if r and any(r)]
    models, batches = _spread(rows[0][1:]), rows[1][1:]
    out: dict[Key, float] = {}
    for row in rows[2:]:
        gpu = f"AMD_Instinct_{row[0].strip()}"
        for name, batch, cell in zip(models, batches, row[1:], strict=False):
            value = _pct(cell)
            if value is not None and name in DISPLAY_TO_STEM and batch:
                out[(gpu, DISPLAY_TO_STEM[name], mode, int(batch), "plain")] = value
    return out


def _fusion(path: Path) -> dict[Key, float]:
    rows = list(csv.reader(path.open()))
    gpus, variants = _spread(rows[0][3:]), rows[1][3:]
    out: dict[Key, float] = {}
    model, batch = "", 0
    for row in rows[2:]:
        if row and row[0]:
            model, batch = row[0], int(row[1].split("=")[1])
        if len(row) > 2 and row[2].startswith("NeuSight"):
            for gpu, variant, cell in zip(gpus, variants, row[3:], strict=False):
                value = _pct(cell.split("(")[-1]) if "(" in cell else None
                if value is not None and gpu in FUSION_GPUS and model in DISPLAY_TO_STEM:
                    var = "fusion" if variant == "Fused" else "plain"
                    out[(FUSION_GPUS[gpu], DISPLAY_TO_STEM[model], "inference", batch,
                         var)] = value
    return out


# distributed.csv names the 4-GPU systems by GPU; the labels' GPU directories say which.
DISTRIBUTED_GPUS = {"A100": "NVIDIA_A100-SXM4-40GB", "H100": "NVIDIA_H100_80GB_HBM3"}
DISTRIBUTED_VARIANTS = {"DP": "dp{n}", "TP": "tp{n}", "PP": "pp{n}_1"}


def _distributed(path: Path) -> dict[Key, float]:
    """NeuSight's 4-GPU errors: columns "<GPU>x<n>" x DP/TP/PP, rows per model and batch."""
    rows = list(csv.reader(path.open()))
    systems, kinds = _spread(rows[0][3:]), rows[1][3:]
    out: dict[Key, float] = {}
    model, batch = "", 0
    for row in rows[2:]:
        if len(row) < 3:
            continue
        model = row[0] or model
        batch = int(row[1]) if row[1].strip().isdigit() else batch
        if not row[2].startswith("NeuSight"):
            continue
        for system, kind, cell in zip(systems, kinds, row[3:], strict=False):
            gpu, _, n = system.partition("x")
            value = _pct(cell.split("(")[-1]) if "(" in cell else None
            if value is None or gpu not in DISTRIBUTED_GPUS or kind not in DISTRIBUTED_VARIANTS:
                continue
            if model in DISTRIBUTED_STEMS:
                out[(DISTRIBUTED_GPUS[gpu], DISTRIBUTED_STEMS[model], "training", batch,
                     DISTRIBUTED_VARIANTS[kind].format(n=n))] = value
    return out


DISTRIBUTED_STEMS = {"GPT2-Large": "gpt2_large", "GPT3-XL": "gpt3_xl"}


def load_published(folder: Path) -> dict[Key, float]:
    """Every published NeuSight error cell found in ``folder`` (missing files are fine)."""
    out: dict[Key, float] = {}
    readers = (("nvidia_inf.csv", lambda p: _nvidia(p, "inference")),
               ("nvidia_train.csv", lambda p: _nvidia(p, "training")),
               ("amd_inf.csv", lambda p: _amd(p, "inference")),
               ("amd_train.csv", lambda p: _amd(p, "training")),
               ("fusion_inf.csv", _fusion), ("distributed.csv", _distributed))
    for name, reader in readers:
        if (folder / name).is_file():
            # fusion_inf's non-fused cells repeat nvidia_inf's: the first reading wins.
            for key, value in reader(folder / name).items():
                out.setdefault(key, value)
    return out
