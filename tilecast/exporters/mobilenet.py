"""MobileNetV3 in plain torch, without torchvision: depthwise convolutions, squeeze-and-excite,
hard-swish, the op mix of mobile CNNs.

The architecture is Howard et al., "Searching for MobileNetV3" (ICCV 2019): Table 1 (Large)
and Table 2 (Small) give each bottleneck's kernel, expansion, output channels, SE, activation
and stride; the squeeze is a quarter of the expansion rounded to a multiple of 8, and the last
stage is a 1x1 conv, global pooling and a two-layer classifier (1280 or 1024 hidden). Imported
lazily (it imports torch at module level); configured by a zoo JSON with ``model_type:
"tilecast-mobilenetv3"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

MODEL_TYPE = "tilecast-mobilenetv3"
# One bottleneck per row: kernel, expansion channels, output channels, SE, activation
# ("RE" ReLU, "HS" hard-swish), stride. Howard et al. 2019, Table 1 (MobileNetV3-Large).
LARGE_BLOCKS = (
    (3, 16, 16, False, "RE", 1), (3, 64, 24, False, "RE", 2), (3, 72, 24, False, "RE", 1),
    (5, 72, 40, True, "RE", 2), (5, 120, 40, True, "RE", 1), (5, 120, 40, True, "RE", 1),
    (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
    (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
    (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1))
DEFAULTS: dict[str, Any] = {"blocks": [list(b) for b in LARGE_BLOCKS], "stem_channels": 16,
                            "last_channels": 960, "classifier_hidden": 1280,
                            "num_classes": 1000, "image_size": 224, "num_channels": 3}


def make_divisible(value: float, divisor: int = 8) -> int:
    """Channels rounded to the nearest multiple of ``divisor``, never below 90 % of ``value``
    (the rounding of the MobileNet papers' reference code, which fixes the SE widths)."""
    out = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * value else out


def _activation(name: str) -> nn.Module:
    return nn.Hardswish() if name == "HS" else nn.ReLU()


class SqueezeExcite(nn.Module):
    """Global pool, 1x1 conv to a quarter of the channels, ReLU, 1x1 conv back, hard-sigmoid,
    and the input scaled channel by channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        squeeze = make_divisible(channels / 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.relu, self.gate = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.relu(self.fc1(self.pool(x)))))


class Bottleneck(nn.Module):
    """Inverted residual: 1x1 expansion (skipped when it would not widen), depthwise k x k
    carrying the stride, optional SE, linear 1x1 projection; identity shortcut when the shape
    is kept."""

    def __init__(self, in_ch: int, kernel: int, expand: int, out_ch: int, se: bool, act: str,
                 stride: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if expand != in_ch:
            layers += [nn.Conv2d(in_ch, expand, 1, bias=False), nn.BatchNorm2d(expand),
                       _activation(act)]
        layers += [nn.Conv2d(expand, expand, kernel, stride=stride, padding=kernel // 2,
                             groups=expand, bias=False), nn.BatchNorm2d(expand), _activation(act)]
        if se:
            layers.append(SqueezeExcite(expand))
        layers += [nn.Conv2d(expand, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return out + x if self.residual else out


class MobileNetV3(nn.Module):
    """3x3/2 stem (hard-swish), the bottlenecks, 1x1 conv to ``last_channels``, global pool,
    and the classifier (Linear, hard-swish, dropout, Linear)."""

    def __init__(self, blocks: Sequence[Sequence[Any]], stem_channels: int = 16,
                 last_channels: int = 960, classifier_hidden: int = 1280,
                 num_classes: int = 1000, num_channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(num_channels, stem_channels, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(stem_channels), nn.Hardswish()]
        in_ch = stem_channels
        for kernel, expand, out_ch, se, act, stride in blocks:
            layers.append(Bottleneck(in_ch, int(kernel), int(expand), int(out_ch), bool(se),
                                     str(act), int(stride)))
            in_ch = int(out_ch)
        layers += [nn.Conv2d(in_ch, last_channels, 1, bias=False),
                   nn.BatchNorm2d(last_channels), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(last_channels, classifier_hidden),
                                        nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(classifier_hidden, num_classes))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(pixel_values)), 1))


def build(config: Mapping[str, Any], *, dtype: str, batch: int, layers: int | None = None,
          device: str = "meta") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A MobileNetV3 on ``device`` (meta: shapes only) and its pixel_values input (batch,
    channels, size, size). ``layers`` keeps the first that many bottlenecks (the stem and head
    stay)."""
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    blocks = list(cfg["blocks"])[:layers] if layers is not None else list(cfg["blocks"])
    with torch.device(device):
        model = MobileNetV3(blocks, cfg["stem_channels"], cfg["last_channels"],
                            cfg["classifier_hidden"], cfg["num_classes"],
                            cfg["num_channels"]).to(getattr(torch, dtype))
    size, channels = cfg["image_size"], cfg["num_channels"]
    pixels = torch.zeros(batch, channels, size, size, dtype=getattr(torch, dtype),
                         device=device)
    return model.eval(), {"pixel_values": pixels}
