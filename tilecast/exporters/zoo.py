"""The model zoo: configs shipped under ``exporters/zoo/*.json`` (no torch needed to list).

Each file is a Hugging Face ``config.json`` (or a tilecast-native one, e.g. ResNet) plus a
``_tilecast`` block: a one-line description, the default task, batch and seq, and a source.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ExportError

ZOO_DIR = Path(__file__).resolve().parent / "zoo"


@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: its name, description and export defaults."""

    name: str
    description: str
    task: str
    batch: int
    seq: int | None  # None: an image model (the input size is in the config)
    path: Path

    def config(self) -> dict[str, Any]:
        """The config dict without the ``_tilecast`` block."""
        data = json.loads(self.path.read_text())
        data.pop("_tilecast", None)
        return data


def list_zoo() -> tuple[ZooEntry, ...]:
    """Every zoo entry, sorted by name."""
    return tuple(_entry(p) for p in sorted(ZOO_DIR.glob("*.json")))


def zoo_entry(name: str) -> ZooEntry:
    """The entry called ``name`` (case and ``_``/``-`` insensitive) or ExportError."""
    wanted = _normal(name)
    entries = list_zoo()
    for entry in entries:
        if _normal(entry.name) == wanted:
            return entry
    names = [e.name for e in entries]
    close = difflib.get_close_matches(wanted, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ExportError(f"unknown zoo model {name!r}{hint} (`tilecast export --list` shows "
                      f"all; a config.json path works too)")


def render_zoo() -> str:
    """The zoo as a text table: name, default task, batch, seq and description."""
    entries = list_zoo()
    width = max(len(e.name) for e in entries)
    lines = [f"{'name':<{width}}  {'task':<20} {'batch':>5} {'seq':>5}  description"]
    for e in entries:
        seq = "-" if e.seq is None else str(e.seq)
        lines.append(f"{e.name:<{width}}  {e.task:<20} {e.batch:>5} {seq:>5}  {e.description}")
    return "\n".join(lines) + "\n"


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _entry(path: Path) -> ZooEntry:
    meta = json.loads(path.read_text()).get("_tilecast", {})
    try:
        return ZooEntry(path.stem, meta["description"], meta["task"], int(meta["batch"]),
                        None if meta.get("seq") is None else int(meta["seq"]), path)
    except (KeyError, TypeError, ValueError) as exc:  # a packaging bug, not user input
        raise ExportError(f"zoo file {path.name}: bad _tilecast block ({exc!r})") from None
