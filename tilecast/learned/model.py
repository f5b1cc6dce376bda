"""The latency model (torch; training only). One class for every family, parameterized by its
feature names; normalization and the physical form are part of the module so the export
(``export.py``) carries them.

A small MLP maps the size-independent features ``x`` (``features.py``) to five bounded
coefficients; the latency is a fixed form in the non-negative, size-monotone work terms:

    u_max     = floor + (1 - floor) * sigmoid(h)      compute / memory utilization at large size
    u_c, u_m  = max(floor, u_max * exp(-beta * softplus(knee - log work)))
                beta = sigmoid(h) < 1: utilization grows with the kernel's own work up to a
                knee, but more slowly than the work, so work / u still never decreases
                (u_c's work: compute_ms; u_m's: dram_ms + r_cache * cached_ms, the same sum
                it divides, so the memory term is monotone in DRAM and in L2 bytes alike)
    r_cache   = sigmoid(h)                             cost of an L2-resident byte vs a DRAM byte
    setup_ms  = launch_ms * SETUP_MAX * sigmoid(h)     per-wave prologue / epilogue of the blocks
    fixed_ms  = launch_ms * (1 + FIXED_MAX * sigmoid(h))   launch and one block's latency
    q_wave    = sigmoid(h)                             a lone wave's bandwidth share vs full
    busy_c    = compute_ms / u_c + waves * setup_ms
    busy_m    = smooth max((dram_ms + r_cache * cached_ms) / u_m, q_wave * wave_ms)
    gpu_ms    = fixed_ms + (busy_c^P + busy_m^P)^(1/P)     (a smooth max: compute and memory
                                                            overlap in a pipelined kernel)
    latency_ms = (host_ms^Q + gpu_ms^Q)^(1/Q)          host_ms: the eager per-op dispatch time

Why this form: every coefficient is positive and independent of size, so ``gpu_ms`` never
decreases as any work term grows (monotone in batch, rows, elements and M/N/K by
construction), it is never below the roofline (u <= 1) and never above the envelope
``fixed_max + busy at the utilization floor`` (u >= floor, the floor justified per family by the
training data's percentiles). ``host_ms`` is one learned scalar per family and vendor, not a
function of the GPU: the training data's smallest kernels take 24-60 us on every GPU alike
(PyTorch's eager per-op dispatch on the measuring hosts), which a GPU feature cannot explain.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .features import FIXED_EXCLUDED, SETUP_EXCLUDED
from .form import (  # noqa: F401  (re-exported: the constants of the form)
    FIXED_MAX,
    HEADS,
    KNEE_SCALE,
    P_BUSY,
    Q_HOST,
    SETUP_HIDDEN,
    SETUP_MAX,
    VENDORS,
)

Z_LIMIT = 30.0  # logit clip, as in export.py
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU}



class LatencyMLP(nn.Module):
    def __init__(self, feature_names: Sequence[str], hidden: Sequence[int] = (64, 64),
                 activation: str = "silu", mean: np.ndarray | None = None,
                 std: np.ndarray | None = None, lo: np.ndarray | None = None,
                 hi: np.ndarray | None = None, u_floor: float = 0.02,
                 host_ms: float = 0.03) -> None:
        super().__init__()
        self.feature_names = tuple(feature_names)
        self.activation = activation
        self.u_floor = float(u_floor)
        f = len(self.feature_names)

        def buf(name: str, value: np.ndarray | None, default: float) -> None:
            v = np.full(f, default) if value is None else value
            self.register_buffer(name, torch.as_tensor(v, dtype=torch.float32))

        buf("mean", mean, 0.0)
        buf("std", std, 1.0)
        # The training range of each feature: inputs are clamped to it, so an unseen GPU or
        # dtype slightly outside it extrapolates flat instead of along the MLP's last slope.
        buf("lo", lo, -np.inf)
        buf("hi", hi, np.inf)
        # log host dispatch ms per vendor (index: the "amd" feature).
        self.log_host_ms = nn.Parameter(torch.full((len(VENDORS),), float(np.log(host_ms))))
        layers: list[nn.Module] = []
        width = f
        for h in hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
            width = h
        layers.append(nn.Linear(width, len(HEADS)))
        self.net = nn.Sequential(*layers)
        # The fixed and per-wave setup costs see neither the GPU nor the tile: a linear head on
        # the kernel's kind only, so tiny kernels rank GPUs alike and a tile switch cannot
        # turn a larger kernel's fixed costs below a smaller one's (features.py).
        self.register_buffer("setup_mask", torch.tensor(
            [0.0 if n in SETUP_EXCLUDED else 1.0 for n in self.feature_names]))
        self.register_buffer("fixed_mask", torch.tensor(
            [0.0 if n in FIXED_EXCLUDED else 1.0 for n in self.feature_names]))
        self.setup_net = nn.Sequential(nn.Linear(f, SETUP_HIDDEN), ACTIVATIONS[activation](),
                                       nn.Linear(SETUP_HIDDEN, 1))
        self.fixed_head = nn.Linear(f, 1)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.minimum(torch.maximum(x, self.lo), self.hi)
        xn = (x - self.mean) / self.std
        h = self.net(xn)
        h_setup = self.setup_net(xn * self.setup_mask)
        h_fixed = self.fixed_head(xn * self.fixed_mask)
        return torch.cat([h[:, :3], h_setup, h_fixed, h[:, 5:]], dim=1).clamp(-Z_LIMIT, Z_LIMIT)

    def side_heads_numpy(self) -> dict:
        """The setup MLP and fixed linear head, with their input masks, for the export."""
        layers = [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy())
                  for m in self.setup_net if isinstance(m, nn.Linear)]
        return {"setup_layers": layers, "setup_mask": self.setup_mask.numpy().copy(),
                "fixed_w": self.fixed_head.weight.detach().numpy()[0] * self.fixed_mask.numpy(),
                "fixed_b": float(self.fixed_head.bias.detach().numpy()[0])}

    def vendor_index(self, x: torch.Tensor) -> torch.Tensor:
        if "amd" not in self.feature_names:
            return torch.zeros(len(x), dtype=torch.long)
        return (x[:, self.feature_names.index("amd")] > 0.5).long()

    def log_latency(self, x: torch.Tensor, t: dict[str, torch.Tensor],
                    with_host: bool = True) -> torch.Tensor:
        """log(latency ms) from features ``x`` and log work terms ``t`` (log of compute_ms,
        dram_ms, cached_ms, wave_ms, waves, launch_ms), computed stably in log space."""
        h = self.heads(x)
        log_sig = nn.functional.logsigmoid
        fl = self.u_floor
        # the memory work u_m grows with is the byte cost itself, L2-served bytes weighted by
        # r_cache: with the plain byte sum, u_m could gain more from cheap cached bytes than
        # they cost, and the memory term fell as cached bytes grew (sanity.py, stop 43: A10)
        log_mem = torch.logaddexp(t["dram_ms"], log_sig(h[:, 2]) + t["cached_ms"])
        log_uc = _utilization(h[:, 0], h[:, 6], h[:, 7], t["compute_ms"], fl)
        log_um = _utilization(h[:, 1], h[:, 8], h[:, 9], log_mem, fl)
        log_setup = t["launch_ms"] + np.log(SETUP_MAX) + log_sig(h[:, 3])
        log_fixed = t["launch_ms"] + torch.log1p(FIXED_MAX * torch.sigmoid(h[:, 4]))
        log_bc = torch.logaddexp(t["compute_ms"] - log_uc, t["waves"] + log_setup)
        log_stream = log_mem - log_um
        log_wave = log_sig(h[:, 5]) + t["wave_ms"]
        log_bm = torch.logaddexp(P_BUSY * log_stream, P_BUSY * log_wave) / P_BUSY
        log_busy = torch.logaddexp(P_BUSY * log_bc, P_BUSY * log_bm) / P_BUSY
        log_gpu = torch.logaddexp(log_fixed, log_busy)
        if not with_host:
            return log_gpu
        log_host = self.log_host_ms[self.vendor_index(x)]
        return torch.logaddexp(Q_HOST * log_host, Q_HOST * log_gpu) / Q_HOST

    def layers_numpy(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight (out, in), bias) of each Linear layer, for the ONNX export."""
        return [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy())
                for m in self.net if isinstance(m, nn.Linear)]

    def host_ms(self) -> np.ndarray:
        return np.exp(self.log_host_ms.detach().numpy().astype(np.float64))


class Ensemble(nn.Module):
    """Members trained alike from different seeds; the forecast is the median of their
    latencies (the lower median for an even count). Each member keeps the form's guarantees,
    and a median of monotone, bounded forecasts is monotone and bounded too (an order
    statistic keeps every member's order). The median, not the geometric mean: on a GPU
    outside the training range one member can extrapolate far from the others (the elementwise
    member of seed 2 forecast our H100's and H200's streaming kernels 1.27-1.36x their time,
    its siblings 0.98-1.05x), and a mean moves with it (docs/predictor.md, "The median
    member"). Over the latencies, not the heads: members may explain a kernel through
    different heads (compute-bound in one, memory-bound in another), and a mean of such heads
    fit held-out layer norms worse than any member (12.5 % against 9.9-11.7 %; the latency
    mean: 9.7 %)."""

    def __init__(self, members: Sequence[LatencyMLP]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        first = members[0]
        self.feature_names, self.u_floor = first.feature_names, first.u_floor

    def log_latency(self, x: torch.Tensor, t: dict[str, torch.Tensor],
                    with_host: bool = True) -> torch.Tensor:
        return torch.stack([m.log_latency(x, t, with_host) for m in self.members]).median(
            dim=0).values

    def host_ms(self) -> np.ndarray:
        return np.exp(np.mean([np.log(m.host_ms()) for m in self.members], axis=0))


def _utilization(h_max: torch.Tensor, h_knee: torch.Tensor, h_slope: torch.Tensor,
                 log_work: torch.Tensor, floor: float) -> torch.Tensor:
    """log u: u_max, lowered below the knee by a power of the work less than 1, >= floor."""
    log_max = torch.log(floor + (1 - floor) * torch.sigmoid(h_max))
    lift = torch.clamp(log_work, min=-40.0)  # log(0) = -inf: the floor holds there
    drop = torch.sigmoid(h_slope) * nn.functional.softplus(KNEE_SCALE * h_knee - lift)
    return torch.clamp(log_max - drop, min=float(np.log(floor)))


def log_terms(f, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """The log work terms of ``features.Features`` as tensors (log 0 = -inf is fine: the
    logaddexp terms then vanish)."""
    with np.errstate(divide="ignore"):
        return {k: torch.from_numpy(np.log(np.asarray(getattr(f, k), np.float64)).astype(
                np.float32)) for k in ("compute_ms", "dram_ms", "cached_ms", "wave_ms",
                                       "waves", "launch_ms")}
