"""The ``tilecast`` command line: a thin layer over the library.

Library errors (``TilecastError``) become one ``Error:`` line and exit status 2 here, and only
here (``cli_options.TilecastGroup``, with the option sets several commands share). Every
command's docstring is its ``--help``, with an example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from . import __version__
from .analyzer.runtime import RUNTIMES
from .cli_catalog import clusters, devices
from .cli_collect import collect_labels
from .cli_options import (
    TilecastGroup,
    fail,
    model_options,
    output_options,
    parallel_options,
    parse_dims,
    write_output,
)
from .cli_sweep import sweep
from .learned.commands import MAX_REPEATS


@click.group(cls=TilecastGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tilecast")
def main() -> None:
    """Forecast deep learning latency on GPUs from an ONNX graph, without the GPU.

    \b
    Example:
      tilecast analyze model.onnx --device l4
      tilecast sweep model.onnx --device t4,l4,h100
      tilecast devices
    """


main.add_command(devices)
main.add_command(clusters)
main.add_command(collect_labels)
main.add_command(sweep)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-d", "--device", help="GPU name/alias, or a device JSON path (with --parallel: "
              "overrides the cluster's GPU).")
@model_options
@click.option("--optimizer", type=click.Choice(("none", "sgd", "adam")), default="none",
              show_default=True, help="Training mode: add the optimizer step.")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many of the slowest kernels to list.")
@parallel_options
@click.option("--strict", is_flag=True,
              help="Exit 2 when the forecast is incomplete (unsupported or unshaped ops).")
@output_options(("table", "json", "csv", "markdown", "svg"))
def analyze(model: str, device: str | None, dims: dict[str, int], mode: str, fusion: bool,
            predictor: str, math: str | None, runtime: str | None, memory_format: str | None,
            optimizer: str, top: int, strict: bool, fmt: str, output: str | None,
            **parallel: Any) -> None:
    """Forecast one inference pass (or training step) of MODEL, an ONNX file, on a GPU,
    or one training step on a cluster with --parallel.

    \b
    Example:
      tilecast analyze model.onnx --device l4 --dim batch=8 --top 5
      tilecast analyze model.onnx --device a100-80gb --mode training --optimizer adam
      tilecast analyze model.onnx --device "NVIDIA A100 80GB PCIe" --format json -o f.json
      tilecast analyze resnet50-fp32.onnx -d a100-sxm4-40gb --math tf32 --runtime graph
      tilecast analyze model-fp32.onnx -d h100-sxm --math amp-bf16
      tilecast analyze resnet50-fp32.onnx -d a100-sxm4-40gb --math amp-fp16 \
        --memory-format channels-last
      tilecast analyze gpt.onnx --mode training --parallel dp=2,tp=4,pp=1 --cluster dgx-a100
      tilecast analyze gpt-fp32.onnx --mode training --parallel dp=8 --cluster dgx-h100 \
        --math amp-bf16
      tilecast analyze gpt.onnx --mode training --parallel auto --gpus 8 --cluster dgx-a100 \
        --train-tokens 300B
      tilecast analyze switch.onnx --mode training --parallel dp=8,ep=4 --cluster dgx-h100
      tilecast analyze llama.onnx --mode training --parallel dp=2,tp=2,cp=2 --cluster dgx-h100
      tilecast analyze model.onnx --device h100 --dim batch=1 --dim sequence=128 --strict
      tilecast analyze model.onnx -d l4 --format svg -o where-the-time-goes.svg
    """
    if parallel["parallel"] and fmt == "svg":
        raise click.UsageError("--format svg charts one GPU's forecast; with --parallel "
                               "choose table, json, csv or markdown.")
    if parallel["parallel"]:
        from .parallel.cli import run_parallel

        write_output(run_parallel(model, device=device, dims=dims, mode=mode,
                                  predictor=predictor, optimizer=optimizer, fmt=fmt,
                                  runtime=runtime or "eager", fusion=fusion,
                                  math=math or "graph", memory_format=memory_format or "nchw",
                                  **parallel),
                     output)
        return
    if not device:
        raise click.UsageError("Missing option '-d' / '--device' (or use --parallel).")
    from .analyzer.pipeline import analyze as run
    from .report import render

    forecast = run(model, device, mode=mode, fusion=fusion, dims=dims, predictor=predictor,
                   optimizer=optimizer, math=math or "graph", runtime=runtime or "eager",
                   memory_format=memory_format or "nchw")
    write_output(render(forecast, fmt, top), output)
    if strict and forecast.incomplete:
        fail(f"--strict: the forecast is incomplete: {sum(forecast.unsupported.values())} "
              f"unsupported and {sum(forecast.unshaped.values())} unshaped node(s)"
              + (f" (shapes stop at {forecast.unshaped_from})" if forecast.unshaped_from else ""))


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-d", "--device", required=True, help="GPU name/alias, or a device JSON path.")
@click.option("--generate", type=click.IntRange(min=1), required=True,
              help="Tokens each request generates (the first comes from the prefill).")
@click.option("--dim", "dims", multiple=True, callback=parse_dims, metavar="NAME=N",
              help="Bind a graph input dim (repeatable): the batch and the prompt length.")
@click.option("--fusion/--no-fusion", default=False, show_default=True,
              help="Forecast fused execution (torch.compile-style fusion groups).")
@click.option("--predictor", default="default", show_default=True,
              help="default (learned if shipped), learned, roofline, or a .onnx path.")
@click.option("--runtime", type=click.Choice(RUNTIMES), default="eager", show_default=True,
              help="eager (per-kernel host dispatch, as Hugging Face generate), cudagraph "
                   "(CUDA graphs, as serving engines run decode) or graph (compiled, "
                   "TensorRT-style).")
@click.option("--batch", "batches", help="Sequences per batch instead of the graph's; several "
              "(e.g. 1,8,32,128) print one row each: latency against throughput.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Split the model over this many GPUs (tensor parallel, as vLLM and "
                   "TensorRT-LLM do); times, weights and KV cache are then per GPU.")
@click.option("--cluster", help="Cluster preset or JSON for --tp (default: the first preset "
              "with the device).")
@click.option("--layers", type=click.IntRange(min=1), help="Forecast this many transformer "
              "layers from a graph exported with fewer identical ones (export --layers 2).")
@output_options(("table", "json", "markdown", "svg"))
def serve(model: str, device: str, generate: int, dims: dict[str, int], fusion: bool,
          predictor: str, runtime: str, batches: str | None, tp: int, cluster: str | None,
          layers: int | None, fmt: str, output: str | None) -> None:
    """Forecast serving MODEL, a decoder-only LLM's forward pass over its batch of prompts:
    time to first token, time per output token with a KV cache, throughput and KV-cache memory.

    \b
    Example:
      tilecast export llama-3-8b --batch 8 --seq 1024 --dtype bfloat16 -o llama.onnx
      tilecast serve llama.onnx -d h100 --generate 256 --runtime graph
      tilecast serve llama.onnx -d h100 --generate 256 --runtime graph --batch 1,8,32,128,512
      tilecast serve llama.onnx -d h100 --generate 256 --runtime graph --tp 4
      tilecast export llama-3-8b --batch 8 --seq 1024 --dtype bfloat16 --layers 2 -o l2.onnx
      tilecast serve l2.onnx -d h100 --generate 256 --layers 32
      tilecast serve examples/gpt2-small.onnx -d l4 --generate 64 --format json
      tilecast serve llama.onnx -d h100 --generate 256 --batch 1,8,32,128 --format svg -o c.svg
    """
    from .serving import analyze_serving, parse_batches
    from .serving.report import render_serving, render_sweep

    sizes = parse_batches(batches) if batches is not None else (None,)
    runs = [analyze_serving(model, device, generate=generate, dims=dims, predictor=predictor,
                            runtime=runtime, fusion=fusion, batch=b, tp=tp, cluster=cluster,
                            layers=layers) for b in sizes]
    text = render_serving(runs[0], fmt) if len(runs) == 1 else render_sweep(runs, fmt)
    write_output(text, output)


@main.command()
@click.argument("labels_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--models", "models_dir", type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="Model configs (default: models/ beside LABELS_DIR).")
@click.option("--published", "published_dir", type=click.Path(exists=True, file_okay=False,
              path_type=Path), help="The paper's published/ tables, for its error per cell.")
@click.option("--gpu", "gpus", multiple=True, help="Only these GPUs (repeatable).")
@click.option("--predictor", default="default", show_default=True,
              help="default, learned, roofline, or a predictor .onnx path.")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Export cache (default: $TILECAST_CACHE or ~/.cache/tilecast).")
@click.option("--by-family", is_flag=True, help="Measured (per-node CSVs) vs forecast ms "
              "per kernel family and phase, per run.")
@output_options(("table", "json", "markdown", "svg"))
def evaluate(labels_dir: Path, models_dir: Path | None, published_dir: Path | None,
             gpus: tuple[str, ...], predictor: str, cache_dir: Path | None, by_family: bool,
             fmt: str, output: str | None) -> None:
    """Compare forecasts with measured end-to-end latencies, beside the paper's errors.

    LABELS_DIR holds <GPU_DIR>/<model>-<inf|train>-<seq>-<batch>[-fusion].json files:
    e2e_latency (ms), and optionally the dtype (float32, float16, bfloat16) and runtime
    (eager, graph) the run was measured in; the forecast uses them.

    \b
    Example:
      tilecast evaluate ../shared/datasets/neusight-asplos25/labels \\
          --published ../shared/datasets/neusight-asplos25/published --gpu NVIDIA_L4
      tilecast evaluate ../shared/datasets/neusight-asplos25/labels --by-family --gpu l4
      tilecast evaluate datasets/h100-sxm5-80gb/labels-bfloat16-eager --format svg -o p.svg
    """
    from .evaluation import evaluate as run_eval
    from .evaluation import evaluate_by_family
    from .evaluation.family_report import render_by_family
    from .evaluation.report import render_table

    progress = lambda msg: click.echo(msg, err=True)  # noqa: E731
    if by_family and fmt == "svg":
        raise click.UsageError("--format svg draws forecast against measured per run; with "
                               "--by-family choose table, json or markdown.")
    if by_family:
        res = evaluate_by_family(labels_dir, models_dir=models_dir, gpus=gpus,
                                 predictor=predictor, cache_dir=cache_dir, progress=progress)
        write_output(res.to_json() if fmt == "json" else render_by_family(res, fmt == "markdown"),
                     output)
        return
    result = run_eval(labels_dir, models_dir=models_dir, published_dir=published_dir,
                      gpus=gpus, predictor=predictor, cache_dir=cache_dir,
                      progress=lambda msg: click.echo(msg, err=True))
    if fmt == "svg":
        from .plots import evaluation_svg

        text = evaluation_svg(result)
    else:
        text = result.to_json() if fmt == "json" else render_table(result, fmt == "markdown")
    write_output(text, output)


def _export_choice(name: str) -> click.Choice:
    from .exporters import hf  # light: exporters import torch only when exporting

    return click.Choice(getattr(hf, name))


@main.command("export")
@click.argument("model", required=False)
@click.option("--list", "show_list", is_flag=True, help="List the zoo models and exit.")
@click.option("--batch", type=int, help="Batch size (default: the zoo entry's).")
@click.option("--seq", type=int, help="Sequence length (default: the zoo entry's).")
@click.option("--task", type=_export_choice("TASKS"), default="auto", show_default=True,
              help="Model head; auto follows the zoo entry or the config's architectures.")
@click.option("--dtype", type=_export_choice("DTYPES"), default="float32", show_default=True)
@click.option("--attn", type=_export_choice("ATTNS"), default="eager", show_default=True,
              help="eager: MatMul + Softmax nodes; sdpa: one fused Attention node.")
@click.option("--layers", type=int, help="Override the number of layers.")
@click.option("--train-mode", is_flag=True,
              help="Trace in training mode (keeps Dropout) for --mode training forecasts.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="ONNX file to write (default: MODEL.onnx here).")
def export(model: str | None, show_list: bool, batch: int | None, seq: int | None, task: str,
           dtype: str, attn: str, layers: int | None, train_mode: bool,
           output: str | None) -> None:
    """Export MODEL, a zoo name or a Hugging Face config.json, to a weightless ONNX graph.

    The model is built on the meta device (no weights, no download) and traced with
    torch.onnx's dynamo exporter; every value has a static shape and every weight is an
    external-data placeholder, so the file stays small. Needs: pip install "tilecast[export]".

    \b
    Example:
      tilecast export --list
      tilecast export gpt3-2.7b --batch 2 --seq 2048 -o gpt3.onnx
      tilecast export config.json --batch 8 --seq 512 --dtype bfloat16 --attn sdpa -o m.onnx
      tilecast export bert-large --task pretraining --train-mode -o bert-train.onnx
    """
    from .exporters import export_model, render_zoo, timed_progress

    if show_list:
        click.echo(render_zoo(), nl=False)
        return
    if not model:
        raise click.UsageError("give a zoo name or a config.json path (or --list)")
    result = export_model(model, batch=batch, seq=seq, task=task, dtype=dtype, attn=attn,
                          layers=layers, output=output, train_mode=train_mode,
                          progress=timed_progress(lambda m: click.echo(m, err=True)))
    click.echo(result.summary(), err=True)


@main.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output folder (laid out like the shared dataset; resumable).")
@click.option("--ops", default="matmul,linear,elementwise,softmax,layernorm,conv,batchnorm,"
              "attention",
              show_default=True, help="Op families or CSV op names, comma-separated.")
@click.option("--dtype", "dtypes", default="fp32", show_default=True,
              help="Comma-separated: fp32, tf32, fp16, bf16, fp8.")
@click.option("--shapes", default="default", show_default=True,
              help="default (sampled grid + zoo model shapes) or a CSV file of op,d1,d2,... "
                   "in the shared CSVs' dims (linear,1,M,N,K is Linear(N -> K) on M rows).")
@click.option("--per-op", default=200, show_default=True, type=click.IntRange(min=1),
              help="Default grid: shapes sampled per op.")
@click.option("--repeats", default=25, show_default=True, type=click.IntRange(min=1))
@click.option("--device", "device_spec", default="cuda:0", show_default=True,
              help="torch device: cuda:N, or cpu to test the collection without a GPU.")
@click.option("--device-info", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSON of device fields to record (peaks, bandwidth, clock) with sources.")
@click.option("--budget-s", type=click.FloatRange(min=0), default=None,
              help="Stop after this many seconds (a leased GPU's time box); rerun to resume.")
def collect(out_dir: Path, ops: str, dtypes: str, shapes: str, per_op: int, repeats: int,
            device_spec: str, device_info: Path | None, budget_s: float | None) -> None:
    """Measure kernels on your own device, to train or calibrate the predictor.

    Times each op with CUDA events after warm-up (median and mean of the fastest runs),
    records kernel names and grids with the torch profiler, and appends rows to CSVs in the
    shared dataset's schema plus dtype and SM clock columns. Beyond the shared ops it
    measures attention's Q K^T as eager PyTorch runs it (bmmt), broadcast masks (addb,
    whereb, maxt), bool and, casts, RMS norm (rms), SiLU, and a training step's gradients:
    a linear's dY^T X (mmtn), a conv's dX / dW (convdx, convdw; family convbackward), and
    batch norm's training forward and backward (bnfw, bnbw; family batchnormtraining).
    Interrupt and rerun: done rows are skipped.

    \b
    Example:
      tilecast collect --out my-h100 --dtype bf16,fp16 --ops matmul,linear
      tilecast collect --out /tmp/cpu-test --device cpu --shapes shapes.csv --repeats 3
      tilecast collect --out my-h100 --dtype bf16 --ops conv --budget-s 300
    """
    from .collect.cli import collect_command

    summary = collect_command(out_dir, ops, dtypes, shapes, per_op, repeats, device_spec,
                              device_info, echo=lambda m: click.echo(m, err=True),
                              budget_s=budget_s)
    click.echo(summary)


@main.command()
@click.argument("base", type=click.Path(dir_okay=False))
@click.argument("new", type=click.Path(dir_okay=False))
@click.option("-d", "--device", "devices", multiple=True,
              help="GPU name/alias or device JSON (repeatable; default: the saved JSON's).")
@model_options
@click.option("--optimizer", type=click.Choice(("none", "sgd", "adam")), default="none",
              show_default=True, help="Training mode: add the optimizer step.")
@click.option("--threshold", default="5%", show_default=True,
              help="Allowed slow-down: a percentage (5%) or a time (2ms, 500us).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=0),
              help="How many changed kernels to list per device.")
@output_options(("table", "json", "markdown", "svg"))
@click.pass_context
def compare(ctx: click.Context, base: str, new: str, devices: tuple[str, ...],
            dims: dict[str, int], mode: str, fusion: bool, predictor: str, math: str | None,
            runtime: str | None, memory_format: str | None, optimizer: str, threshold: str,
            top: int, fmt: str, output: str | None) -> None:
    """Compare the forecasts of BASE and NEW; exit 1 when a device slows down by more than
    --threshold, 2 for bad input.

    BASE and NEW are ONNX files or saved forecasts (`tilecast analyze --format json`, or a
    `tilecast gate` baseline). With a saved side, --predictor default follows its predictor
    when it is roofline, and --dim, --math, --runtime and --memory-format default to its own;
    forecasts made under different ones are not compared (exit 2).

    \b
    Example:
      tilecast compare old.onnx new.onnx --device l4 --device a100-80gb
      tilecast analyze model.onnx -d l4 --format json -o baseline.json
      tilecast compare baseline.json model.onnx --threshold 2ms --format markdown
      tilecast compare old.onnx new.onnx -d l4 --format svg -o what-changed.svg
    """
    from .gate import compare as run_compare
    from .gate.report import render

    result = run_compare(base, new, devices or None, mode=mode, threshold=threshold,
                         fusion=fusion, dims=dims, optimizer=optimizer, top=top,
                         predictor=None if predictor == "default" else predictor,
                         math=math, runtime=runtime, memory_format=memory_format)
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    write_output(render([(None, result)], fmt), output)
    if result.regressed:
        ctx.exit(1)


@main.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="tilecast.toml or pyproject.toml (default: ./tilecast.toml, else "
                   "./pyproject.toml with [tool.tilecast]).")
@click.option("--update-baseline", is_flag=True,
              help="Forecast every model and rewrite its baseline file, then exit 0.")
@output_options(("table", "json", "markdown", "svg"))
@click.pass_context
def gate(ctx: click.Context, config_path: Path | None, update_baseline: bool, fmt: str,
         output: str | None) -> None:
    """Check the models of a repository's tilecast.toml against their committed baselines;
    exit 1 on a latency regression, 2 for bad input. See docs/ci-gate.md.

    \b
    Example:
      tilecast gate --update-baseline          # once, then commit .tilecast/
      tilecast gate --format markdown -o tilecast-report.md
      tilecast gate --format svg -o tilecast-report.svg
    """
    from .gate.config import load_config
    from .gate.report import render
    from .gate.runner import run_gate, update_baselines

    config = load_config(config_path)
    progress = lambda msg: click.echo(msg, err=True)  # noqa: E731
    if update_baseline:
        for path in update_baselines(config, progress):
            click.echo(f"wrote {path}")
        return
    result = run_gate(config, progress)
    for warning in result.warnings:
        click.echo(f"Warning: {warning}", err=True)
    write_output(render(result.entries, fmt, title="tilecast latency gate"), output)
    if result.regressed:
        ctx.exit(1)


@main.command()
@click.option("--data", "data_dirs", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Kernel data laid out like the shared dataset (repeatable).")
@click.option("-o", "--out", "out", required=True, type=click.Path(path_type=Path),
              help="Folder (or its tilecast_predictor.onnx) to write the predictor to.")
@click.option("--epochs", type=click.IntRange(min=1), help="Epochs per family (default: recipe).")
def train(data_dirs: tuple[Path, ...], out: Path, epochs: int | None) -> None:
    """Train the learned predictor (needs torch: pip install 'tilecast[train]').

    \b
    Example:
      tilecast train --data ../shared/datasets/neusight-asplos25 -o tilecast/learned/artifacts
    """
    from .learned.commands import train_command

    click.echo(train_command(data_dirs, out, epochs, echo=lambda m: click.echo(m, err=True)),
               nl=False)


@main.command("kernels-eval")
@click.option("--data", "data_dirs", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Kernel data with an eval split, laid out like the shared dataset.")
@click.option("--predictor", "predictor_path", type=click.Path(exists=True, path_type=Path),
              help="Predictor .onnx (or its folder); default: the shipped one.")
@click.option("--cv", type=click.Choice(("none", "logo")), default="none", show_default=True,
              help="logo: leave-one-GPU-out over the training GPUs (retrains per fold).")
@click.option("--repeats", type=click.IntRange(1, MAX_REPEATS), default=1, show_default=True,
              help="With --cv logo: run the folds this many times from disjoint training "
                   "seeds; the table is their mean, and the spread shows what a change must "
                   "beat.")
@click.option("--family", "families", multiple=True, metavar="FAMILY",
              help="With --cv logo: retrain and score only this family (repeatable: matmul, "
                   "elementwise, softmax, layernorm, conv), with the full run's figures for it "
                   "(two cores: matmul 2 min, elementwise 2.3, softmax and layernorm together "
                   "1, conv 0.3).")
@click.option("--write-bands", "bands", type=click.Path(dir_okay=False, path_type=Path),
              help="With --cv logo: write the folds' error bands (measured / forecast per "
                   "family) to this JSON; beside a predictor as error_bands.json, forecasts "
                   "show them.")
@output_options(("table", "json"))
def kernels_eval(data_dirs: tuple[Path, ...], predictor_path: Path | None, cv: str,
                 repeats: int, families: tuple[str, ...], bands: Path | None, fmt: str,
                 output: str | None) -> None:
    """Kernel-level MAPE per GPU and op family: tilecast vs roofline vs a direct regressor,
    and how often the predicted matmul tile is the one cuBLAS ran.

    \b
    Example:
      tilecast kernels-eval --data ../shared/datasets/neusight-asplos25 --format json
      tilecast kernels-eval --data ../shared/datasets/neusight-asplos25 --cv logo
      tilecast kernels-eval --data ../shared/datasets/neusight-asplos25 --cv logo --repeats 3
      tilecast kernels-eval --data ../shared/datasets/neusight-asplos25 --cv logo \
          --family softmax --family layernorm
      tilecast kernels-eval --data ../shared/datasets/neusight-asplos25 --cv logo \
          --write-bands tilecast/learned/artifacts/error_bands.json
    """
    from .learned.commands import kernels_eval_command

    write_output(kernels_eval_command(data_dirs, predictor_path, fmt,
                                      echo=lambda m: click.echo(m, err=True), cv=cv,
                                      repeats=repeats, families=families, bands=bands), output)
