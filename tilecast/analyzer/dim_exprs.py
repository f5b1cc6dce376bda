"""Graph input dims named by an arithmetic expression of other dims, evaluated once those bind.

Exporters name a dim that is the sum of two others by the expression itself: optimum's with-past
decoders give ``attention_mask`` the dim ``past_sequence_length + sequence_length`` (and
``past_sequence_length + 1``). Such a name is derived, not an input dim to bind: the user binds
the plain names in it and the expression's value follows.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv}


def _tree(name: str) -> ast.expr | None:
    """The parsed expression of a dim name with an operator in it, else None (a plain name,
    or text that is no expression of names, integers, ``+ - * //`` and parentheses)."""
    try:
        tree = ast.parse(name, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # NUL bytes, deep nesting
        return None
    allowed = (ast.BinOp, ast.Name, ast.Constant, ast.Load, *_OPS)
    if not isinstance(tree, ast.BinOp) or not all(
            isinstance(n, allowed) for n in ast.walk(tree)):
        return None
    if any(isinstance(n, ast.Constant) and type(n.value) is not int for n in ast.walk(tree)):
        return None
    return tree


def is_expression(name: str) -> bool:
    return _tree(name) is not None


def names_in(name: str) -> tuple[str, ...]:
    """The plain dim names an expression is made of (the name itself when it is plain)."""
    tree = _tree(name)
    if tree is None:
        return (name,)
    return tuple(dict.fromkeys(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)))


def _eval(node: ast.expr, dims: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant):
        return int(node.value)
    if isinstance(node, ast.Name):
        return int(dims[node.id])
    assert isinstance(node, ast.BinOp)  # _tree admits nothing else
    return _OPS[type(node.op)](_eval(node.left, dims), _eval(node.right, dims))


def evaluate(names: tuple[str, ...], dims: Mapping[str, int]) -> dict[str, int]:
    """``dims`` plus the value of every expression in ``names`` whose names are all bound. An
    expression with no size as its value (negative, a division by zero) stays unbound, so the
    values it sizes are reported unshaped."""
    out = dict(dims)
    for name in names:
        tree = _tree(name)
        if tree is None or name in out or not all(n in dims for n in names_in(name)):
            continue
        try:
            value = _eval(tree, dims)
        except (ZeroDivisionError, RecursionError):
            continue
        if value >= 0:
            out[name] = value
    return out
