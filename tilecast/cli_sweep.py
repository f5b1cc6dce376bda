"""``tilecast sweep``: one model on several GPUs, math modes, runtimes and input sizes."""

from __future__ import annotations

from pathlib import Path

import click

from .cli_options import grid_model_options, output_options, write_output


def _is_file(value: str) -> bool:
    try:
        return Path(value).is_file()
    except (OSError, ValueError):  # too long for a path, or a NUL byte: a list of names
        return False


def _devices(values: tuple[str, ...]) -> list[str]:
    """``-d l4,h100 -d t4`` -> [l4, h100, t4]: no GPU name holds a comma; a device JSON path
    that does is taken whole."""
    names = [n.strip() for v in values for n in ([v] if _is_file(v) else v.split(","))]
    if not names or not all(names):
        raise click.BadParameter("expected GPU names or aliases, e.g. -d t4,l4,h100",
                                 param_hint="'-d' / '--device'")
    return names


@click.command("sweep")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-d", "--device", "devices", multiple=True, required=True,
              help="GPUs (names, aliases or device JSON paths), comma-separated or repeated; "
                   "the first, with the first --math and --runtime, is the speedup baseline.")
@grid_model_options
@click.option("--optimizer", type=click.Choice(("none", "sgd", "adam")), default="none",
              show_default=True, help="Training mode: add the optimizer step.")
@output_options(("table", "json", "csv", "markdown", "svg"))
def sweep(model: str, devices: tuple[str, ...], dims: dict[str, tuple[int, ...]], mode: str,
          fusion: bool, predictor: str, math: tuple[str, ...] | None,
          runtime: tuple[str, ...] | None, memory_format: str | None, optimizer: str, fmt: str,
          output: str | None) -> None:
    """Forecast MODEL on several GPUs, math modes, runtimes and input sizes, a row each: total
    time, speedup over the first row at the same sizes, samples/s (with a dim named like
    batch) and where the time goes.

    \b
    Example:
      tilecast sweep model.onnx -d t4,l4,a100-80gb,h100
      tilecast sweep model.onnx -d l4,h100 --dim batch=1,8,32,128 --runtime graph
      tilecast sweep resnet50-fp32.onnx -d t4,a100-sxm4-40gb --math graph,tf32,amp-fp16
      tilecast sweep resnet50-fp32.onnx -d t4,a100-sxm4-40gb --math amp-fp16 \
        --memory-format channels-last
      tilecast sweep llama.onnx -d h100,mi300x --runtime eager,cudagraph --format markdown
      tilecast sweep model.onnx -d l4 -d h100 --mode training --optimizer adam --format csv
      tilecast sweep model.onnx -d t4,l4,h100 --dim batch=1,8,32,128 --format svg -o s.svg
    """
    from .sweep import render_sweep
    from .sweep import sweep as run

    result = run(model, _devices(devices), dims, mode=mode, fusion=fusion, predictor=predictor,
                 optimizer=optimizer, math=math or ("graph",), runtime=runtime or ("eager",),
                 memory_format=memory_format or "nchw")
    write_output(render_sweep(result, fmt), output)
