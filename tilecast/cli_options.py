"""Shared pieces of the ``tilecast`` command line: the group that turns library errors into
one ``Error:`` line, output writing, and the option sets several commands take."""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .analyzer.mathmode import MATH_MODES
from .analyzer.runtime import MEMORY_FORMATS, RUNTIMES
from .errors import TilecastError

# Exit statuses (docs/reliability.md): 0 ok, 1 a regression (compare, gate), 2 bad input or
# an environment problem, 3 an internal error (a tilecast bug: never a pass, never "regressed").
BAD_INPUT_EXIT = 2
INTERNAL_ERROR_EXIT = 3
_CLICK_FLOW = (click.ClickException, click.exceptions.Exit, click.exceptions.Abort)


class TilecastGroup(click.Group):
    """Turns library errors into one ``Error:`` line instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TilecastError as exc:
            fail(str(exc))
        except OSError as exc:  # unwritable -o path, disk full, ...
            fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        except KeyboardInterrupt:
            fail("interrupted")
        except _CLICK_FLOW:
            raise
        except Exception as exc:  # a bug: fail closed with its own status, not as exit 1
            if os.environ.get("TILECAST_DEBUG"):
                traceback.print_exc()
            fail(f"internal error ({type(exc).__name__}: {exc}); this is a tilecast bug, "
                  "please report it (TILECAST_DEBUG=1 prints the traceback)",
                  INTERNAL_ERROR_EXIT)


def fail(message: str, status: int = BAD_INPUT_EXIT) -> None:
    exc = click.ClickException(message.splitlines()[0] if message else "failed")
    exc.exit_code = status
    raise exc


def write_output(text: str, output: str | None) -> None:
    """Print, or write ``output`` atomically so a failure never leaves a half-written file."""
    if not output or output == "-":
        click.echo(text, nl=False)
        return
    path = Path(output)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".",
                               prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    click.echo(f"wrote {path}", err=True)


def parse_dims(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...],
                ) -> dict[str, int]:
    dims: dict[str, int] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) <= 0:
            raise click.BadParameter(f"{item!r}: expected NAME=POSITIVE_INT, e.g. batch=8")
        dims[name.strip()] = int(value)
    return dims


# Shared options: one definition each, reused by every command that takes them.
def output_options(formats: tuple[str, ...]) -> Callable:
    def deco(fn: Callable) -> Callable:
        fn = click.option("-o", "--output", type=click.Path(dir_okay=False),
                          help="Write to FILE instead of stdout.")(fn)
        return click.option("--format", "fmt", type=click.Choice(formats), default=formats[0],
                            show_default=True, help="Output format.")(fn)
    return deco


def parse_dim_grid(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...],
                   ) -> dict[str, tuple[int, ...]]:
    """``--dim batch=1,8,32`` (repeatable): each dim's values, in order, duplicates dropped."""
    dims: dict[str, tuple[int, ...]] = {}
    for item in values:
        name, sep, value = item.partition("=")
        parts = [v.strip() for v in value.split(",")]
        if not sep or not name.strip() or not all(v.isdigit() and int(v) > 0 for v in parts):
            raise click.BadParameter(f"{item!r}: expected NAME=N[,N...] with positive "
                                     "integers, e.g. batch=1,8,32")
        dims[name.strip()] = tuple(dict.fromkeys(int(v) for v in parts))
    return dims


def _model_options(*options: Callable) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for opt in reversed(options):
            fn = opt(fn)
        return fn
    return deco


def parse_choices(choices: tuple[str, ...]) -> Callable:
    """A callback for a comma-separated list of ``choices`` (``--math graph,amp-bf16``)."""
    def parse(_ctx: click.Context, _param: click.Parameter, value: str | None,
              ) -> tuple[str, ...] | None:
        if value is None:
            return None
        names = tuple(dict.fromkeys(v.strip() for v in value.split(",")))
        bad = [n for n in names if n not in choices]
        if bad:
            raise click.BadParameter(f"{', '.join(map(repr, bad))}: choose from "
                                     f"{', '.join(choices)} (comma-separated)")
        return names
    return parse


_MODE_OPTIONS = (
    click.option("--mode", type=click.Choice(("inference", "training")),
                 default="inference", show_default=True),
    click.option("--fusion/--no-fusion", default=False, show_default=True,
                 help="Forecast fused execution (torch.compile-style fusion groups; with "
                      "--parallel, Megatron-LM's fused kernels)."),
    click.option("--predictor", default="default", show_default=True,
                 help="default (learned if shipped), learned, roofline, or a .onnx path."),
)
_MATH_HELP = ("Arithmetic: graph (the graph's dtypes; default), tf32 (fp32 matmul/conv on TF32 "
              "tensor cores), tf32-conv (convs on TF32, matmuls fp32: PyTorch 1.12+'s "
              "default), amp-fp16 / amp-bf16 (an fp32 graph under torch.autocast, casts "
              "costed).")
_RUNTIME_HELP = ("eager (per-kernel host dispatch; default), cudagraph (torch.cuda.graphs "
                 "replay: no dispatch floor) or graph (XLA / TensorRT-style: no dispatch floor, "
                 "BN folded into Conv, adds and ReLU / GELU in Conv and GEMM epilogues, eager "
                 "attention as one fused attention kernel; add --fusion for their fusion of "
                 "the other elementwise chains).")
_LAYOUT_OPTION = click.option(
    "--memory-format", type=click.Choice(MEMORY_FORMATS), default=None,
    help="The layout PyTorch keeps activations in: nchw (default; an ONNX Conv's) or "
         "channels-last (model.to(memory_format=torch.channels_last), TensorFlow's NHWC): "
         "tensor-core convs then run without cuDNN's layout transposes. The graph runtime "
         "picks NHWC itself.")
_DIM_HELP = "Bind a graph input dim (repeatable), e.g. --dim batch=8; every other dim is derived."
model_options = _model_options(
    click.option("--dim", "dims", multiple=True, callback=parse_dims, metavar="NAME=N",
                 help=_DIM_HELP),
    *_MODE_OPTIONS,
    click.option("--math", type=click.Choice(MATH_MODES), default=None, help=_MATH_HELP),
    click.option("--runtime", type=click.Choice(RUNTIMES), default=None, help=_RUNTIME_HELP),
    _LAYOUT_OPTION)
# tilecast sweep: lists of dim values, math modes and runtimes
grid_model_options = _model_options(
    click.option("--dim", "dims", multiple=True, callback=parse_dim_grid,
                 metavar="NAME=N[,N...]", help="Bind a graph input dim to each of these "
                 "values (repeatable), e.g. --dim batch=1,8,32; with several dims, every "
                 "combination."),
    *_MODE_OPTIONS,
    click.option("--math", callback=parse_choices(MATH_MODES), metavar="MODE[,MODE...]",
                 help=_MATH_HELP + " Several: a row each."),
    click.option("--runtime", callback=parse_choices(RUNTIMES), metavar="RUNTIME[,...]",
                 help=_RUNTIME_HELP + " Several: a row each."),
    _LAYOUT_OPTION)


def parallel_options(fn: Callable) -> Callable:
    for opt in reversed((
        click.option("--parallel", help="dp=D,tp=T,pp=P[,cp=C][,ep=E] (training on a "
                     "cluster; cp: the sequence split over C ranks; ep: experts of MoE layers "
                     "spread over E data-parallel ranks), or auto to rank every layout of "
                     "--gpus GPUs."),
        click.option("--microbatches", type=click.IntRange(min=1), default=1,
                     show_default=True, help="Microbatches per step and data-parallel rank "
                     "(the graph's batch is one); auto derives it from --global-batch."),
        click.option("--cluster", help="Cluster preset (dgx-a100, dgx-h100, hgx-b200, "
                     "l4-pcie-8, mi250-oam, ...) or a cluster JSON path."),
        click.option("--gpus", type=click.IntRange(min=1), help="GPU count for --parallel auto."),
        click.option("--global-batch", type=click.IntRange(min=1),
                     help="--parallel auto: samples per step (default: gpus x graph batch)."),
        click.option("--layers", type=click.IntRange(min=1), help="Repeat the graph's first "
                     "transformer layer up to this many layers."),
        click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True,
                     help="ZeRO stage (3 = FSDP full shard)."),
        click.option("--sequence-parallel/--no-sequence-parallel", default=False),
        click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=True,
                     show_default=True, help="Reduce gradients during the backward (DDP) "
                     "or after it (Megatron-LM's default: --no-overlap-grad-reduce)."),
        click.option("--recompute", type=click.Choice(("none", "selective", "full")),
                     is_flag=False, flag_value="full",
                     help="Activation recomputation: selective reruns the attention core "
                     "in the backward, full (also bare --recompute) the whole layer. "
                     "Default: none; --parallel auto takes the least that fits."),
        click.option("--cp-comm", type=click.Choice(("ring", "a2a")),
                     help="Context parallelism's exchange: ring (K/V round a ring, under the "
                     "attention; default) or a2a (all-to-alls of heads, DeepSpeed-Ulysses); "
                     "--parallel auto tries both unless given."),
        click.option("--virtual-stages", type=click.IntRange(min=1), default=1,
                     show_default=True, help="Interleaved 1F1B: model chunks per GPU."),
        click.option("--train-tokens", help="Also forecast a whole run of this many tokens "
                     "(e.g. 300B, 1.5T, 3e11): steps, days and GPU-hours at the step time."),
    )):
        fn = opt(fn)
    return fn
