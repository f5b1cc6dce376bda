"""Multi-GPU labels (``-dp4``, ``-tp4``, ``-pp4_1``): the layout each run used and its forecast.

The degrees come from the label's suffix and the Megatron-LM settings from
``models/parallel/{DP,TP,PP}.yaml`` (recomputation, sequence parallelism, distributed
optimizer, gradient clipping). The pipeline microbatch count is the suffix's second number:
the measuring script (NeuSight's ``collect_label_distributed.py``) names its runs
``pp{degree}_{num_microbatch}``. PP.yaml says ``megatron_lm_num_micro_batches: 4``; the
measured pipeline steps (3.3-3.7x the data-parallel ones at the same global batch) match one
microbatch of the whole batch, not four (which would be about 1.75x). Global batch / dp /
microbatches samples form one microbatch, which is the batch the model is exported at; the
export keeps two transformer layers and the forecast repeats the first up to the config's
depth (tilecast.parallel's ``layers``). Megatron-LM fuses bias + GeLU, bias + dropout +
residual add and the masked softmax by default (its ``--bias-gelu-fusion``,
``--bias-dropout-fusion`` and ``--masked-softmax-fusion`` flags, on unless disabled;
megatron/arguments.py), so the forecast uses tilecast.parallel's fused execution
(``fusion=True``: ``parallel.megatron``, whose masked softmax fuses in 16-bit only).
The harness passes ``DDP_impl="torch"`` to Megatron-LM (``other_megatron_args``), so its
data-parallel gradients are all-reduced by PyTorch DDP in 25 MB buckets during the backward:
tilecast's default (``Layout.overlap_grad_reduce``), not Megatron-LM's own default of one
reduction after the backward.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

SUFFIX = re.compile(r"^(?P<kind>dp|tp|pp)(?P<degree>\d+)(?:_(?P<micro>\d+))?$")
YAML_FOR = {"dp": "DP.yaml", "tp": "TP.yaml", "pp": "PP.yaml"}
EXPORT_LAYERS = 2


@dataclass(frozen=True)
class Distributed:
    dp: int
    tp: int
    pp: int
    microbatches: int
    recompute: str  # parallel.layout.RECOMPUTE
    sequence_parallel: bool
    zero: int
    clip_grad: bool
    fusion: bool = True  # Megatron-LM's default kernel fusions (see the module docstring)

    def per_rank_batch(self, global_batch: int) -> int:
        return max(1, global_batch // (self.dp * self.microbatches))


def _megatron(path: Path) -> dict[str, str]:
    """The ``megatron_lm_*`` keys of an accelerate config (flat 'key: value' lines)."""
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and key.startswith("megatron_lm_"):
            out[key] = value.strip().strip("'\"")
    return out


def parse_variant(variant: str, models: Path) -> Distributed:
    m = SUFFIX.match(variant)
    if m is None:
        raise ValueError(f"variant '{variant}' is not dpN, tpN or ppN_M")
    kind, degree = m["kind"], int(m["degree"])
    cfg_path = models / "parallel" / YAML_FOR[kind]
    cfg = _megatron(cfg_path) if cfg_path.is_file() else {}
    if cfg and kind != "dp" and int(cfg.get(f"megatron_lm_{kind}_degree", degree)) != degree:
        raise ConfigError(f"{cfg_path}: {kind} degree disagrees with variant {variant}")
    true = ("true", "1", "yes")
    return Distributed(
        dp=degree if kind == "dp" else 1, tp=degree if kind == "tp" else 1,
        pp=degree if kind == "pp" else 1, microbatches=int(m["micro"] or 1),
        # accelerate's MegatronLMPlugin sets recompute_granularity "selective" for it
        recompute=("selective" if cfg.get("megatron_lm_recompute_activations", "false").lower()
                   in true else "none"),
        sequence_parallel=cfg.get("megatron_lm_sequence_parallelism", "false").lower() in true,
        zero=1 if cfg.get("megatron_lm_use_distributed_optimizer", "false").lower() in true
        else 0,
        clip_grad=float(cfg.get("megatron_lm_gradient_clipping", "0") or 0) > 0)


def config_layers(config: Path) -> int:
    data = json.loads(config.read_text())
    for key in ("n_layer", "num_hidden_layers", "num_layers"):
        if isinstance(data.get(key), int):
            return data[key]
    raise ConfigError(f"{config}: no layer count (n_layer / num_hidden_layers)")
