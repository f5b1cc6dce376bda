"""PyTorch / Hugging Face models to weightless, shape-complete ONNX graphs (extra ``[export]``).

Importing this package never imports torch or transformers; each export call does, and raises
``ExportError`` with the install hint when they are missing. See docs/exporters.md.
"""

from __future__ import annotations

from .api import BuiltModel, ExportResult, build_module, export_model, timed_progress
from .hf import ATTNS, DTYPES, TASKS, from_hf_config, register_attention
from .torch_export import from_torch
from .zoo import ZooEntry, list_zoo, render_zoo, zoo_entry

__all__ = ["ATTNS", "DTYPES", "TASKS", "BuiltModel", "ExportResult", "ZooEntry", "build_module",
           "export_model", "from_hf_config", "from_torch", "list_zoo", "register_attention",
           "render_zoo", "timed_progress", "zoo_entry"]
