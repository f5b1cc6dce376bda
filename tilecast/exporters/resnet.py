"""ResNet (v1.5 bottleneck, as torchvision's resnet50) in plain torch, without torchvision.

Imported lazily (it imports torch at module level); configured by a zoo JSON with
``model_type: "tilecast-resnet"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

MODEL_TYPE = "tilecast-resnet"
DEFAULTS = {"block_counts": [3, 4, 6, 3], "base_width": 64, "expansion": 4,
            "num_classes": 1000, "image_size": 224, "num_channels": 3}


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride: v1.5), 1x1 expand; projection shortcut if needed."""

    def __init__(self, in_ch: int, width: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride,
                                                      bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """Stem (7x7/2 conv, 3x3/2 max pool), four bottleneck stages, global pool, classifier."""

    def __init__(self, block_counts: list[int], base_width: int = 64, expansion: int = 4,
                 num_classes: int = 1000, num_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(num_channels, base_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_ch = [], base_width
        for i, count in enumerate(block_counts):
            width = base_width * 2 ** i
            blocks = []
            for j in range(count):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(Bottleneck(in_ch, width, width * expansion, stride))
                in_ch = width * expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(pixel_values))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(config: Mapping[str, Any], *, dtype: str, batch: int, layers: int | None = None,
          device: str = "meta") -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A ResNet on ``device`` (meta: shapes only) and its pixel_values input (batch, channels,
    size, size)."""
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}
    if layers is not None:  # depth override: the same number of blocks in every stage
        cfg["block_counts"] = [layers] * len(cfg["block_counts"])
    with torch.device(device):
        model = ResNet(list(cfg["block_counts"]), cfg["base_width"], cfg["expansion"],
                       cfg["num_classes"], cfg["num_channels"]).to(getattr(torch, dtype))
    size, channels = cfg["image_size"], cfg["num_channels"]
    pixels = torch.zeros(batch, channels, size, size, dtype=getattr(torch, dtype),
                         device=device)
    return model.eval(), {"pixel_values": pixels}
