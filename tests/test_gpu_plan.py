"""The plan a lent GPU runs (scripts/gpu_collect.py): never fp32 or tf32 (on Hopper those are
tilecast's blind test), and shapes every phase can build."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_collect.py"


def test_no_phase_measures_fp32_or_tf32() -> None:
    # every dtype tuple handed to a phase, read from the source (no torch, no GPU needed)
    tree = ast.parse(SCRIPT.read_text())
    dtypes = {elt.value for node in ast.walk(tree) if isinstance(node, ast.Tuple)
              for elt in node.elts if isinstance(elt, ast.Constant)
              and elt.value in ("fp32", "tf32", "bf16", "fp16", "fp8")}
    assert dtypes and not dtypes & {"fp32", "tf32"}


def test_plans_hold_valid_shapes() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_collect as plan

    from tilecast.collect.shapes import OP_DIMS, bad_dim

    shapes = [*plan.matmul_plan(), *plan.conv_plan(), *plan.rows_plan(),
              *plan.decode_linears(), *plan.alignment_plan(), *plan.training_plan(),
              *plan.llama_rows_plan(), *plan.bn_training_plan(), *plan.loops_plan(),
              *plan.conv_gemm_plan(ROOT / "datasets" / "h100-sxm5-80gb")]
    assert all(len(s.dims) == len(OP_DIMS[s.op]) for s in shapes)
    assert [s for s in shapes if bad_dim(s.named)] == []  # the shapes file's own check
    heads = {s.dims[3] for s in plan.alignment_plan() if s.op == "linear"}  # K: out features
    assert {50257, 50264, 30522, 30528} <= heads  # unaligned vocabularies and their twins
