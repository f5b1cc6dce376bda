"""The utilization MLP (torch; training only). One class for every family, parameterized by
its feature names; normalization is part of the module so the export carries it.

Two outputs of one trunk, both bounded by construction:

    u_work = sigmoid(z_work)                      in (0, 1): utilization of the roofline work
    fixed_ms = launch_ms * (1 + softplus(z_fixed)) >= one launch overhead
    latency_ms = fixed_ms + work_ms / u_work
    utilization = (work_ms + launch_ms) / latency_ms   in (0, 1]

Size enters the features only through bounded ratios (waves, fill, L2 fit), so a kernel far
larger than any training shape keeps the asymptotic ``u_work`` of large training kernels and
the fixed cost fades: the form the measurements follow (time = a + bytes / achieved rate).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

Z_LIMIT = 30.0  # logit clip, as in export.py: float32 sigmoid never reaches 0
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU}


class UtilizationMLP(nn.Module):
    def __init__(self, feature_names: Sequence[str], hidden: Sequence[int] = (64, 64),
                 activation: str = "silu", mean: np.ndarray | None = None,
                 std: np.ndarray | None = None, lo: np.ndarray | None = None,
                 hi: np.ndarray | None = None) -> None:
        super().__init__()
        self.feature_names = tuple(feature_names)
        self.activation = activation
        f = len(self.feature_names)

        def buf(name: str, value: np.ndarray | None, default: float) -> None:
            v = np.full(f, default) if value is None else value
            self.register_buffer(name, torch.as_tensor(v, dtype=torch.float32))

        buf("mean", mean, 0.0)
        buf("std", std, 1.0)
        # The training range of each feature: inputs are clamped to it, so an unseen GPU or
        # shape slightly outside it extrapolates flat instead of along the MLP's last slope.
        buf("lo", lo, -np.inf)
        buf("hi", hi, np.inf)
        layers: list[nn.Module] = []
        width = f
        for h in hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
            width = h
        layers.append(nn.Linear(width, 2))  # (z_work, z_fixed)
        self.net = nn.Sequential(*layers)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.minimum(torch.maximum(x, self.lo), self.hi)
        z = self.net((x - self.mean) / self.std).clamp(-Z_LIMIT, Z_LIMIT)
        return z[:, 0], z[:, 1]

    def forward(self, x: torch.Tensor, work_ms: torch.Tensor,
                launch_ms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(latency_ms, utilization)."""
        z_work, z_fixed = self.heads(x)
        latency = (launch_ms * (1 + nn.functional.softplus(z_fixed))
                   + work_ms * (1 + torch.exp(-z_work)))  # = work / sigmoid(z_work)
        return latency, (work_ms + launch_ms) / latency

    def log_latency(self, x: torch.Tensor, log_work: torch.Tensor,
                    log_launch: torch.Tensor) -> torch.Tensor:
        """log(latency), computed stably in log space (the training loss needs it)."""
        z_work, z_fixed = self.heads(x)
        log_fixed = log_launch + torch.log1p(nn.functional.softplus(z_fixed))
        log_busy = log_work + nn.functional.softplus(-z_work)  # log(work / sigmoid(z))
        return torch.logaddexp(log_fixed, log_busy)

    def layers_numpy(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(weight (out, in), bias) of each Linear layer, for the ONNX export."""
        return [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy())
                for m in self.net if isinstance(m, nn.Linear)]
