"""``tilecast collect-labels``: end-to-end labels measured on the user's own GPU."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("collect-labels")
@click.argument("model")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output folder: labels-<dtype>[-<math>]-<runtime>/<GPU>/*.json and models/.")
@click.option("-b", "--batch", type=click.IntRange(min=1),
              help="Batch size (a zoo model's default when omitted).")
@click.option("-s", "--seq", type=click.IntRange(min=1),
              help="Sequence length (text models; a zoo model's default when omitted).")
@click.option("--dtype", default="bf16", show_default=True,
              type=click.Choice(["fp32", "fp16", "bf16"]), help="What the model is built in.")
@click.option("--mode", default="inference", show_default=True,
              type=click.Choice(["inference", "training"]),
              help="A forward pass, or a forward and backward (no optimizer).")
@click.option("--runtime", default="eager", show_default=True,
              type=click.Choice(["eager", "cudagraph"]),
              help="eager PyTorch, or one CUDA graph of the forward (inference; scored by "
                   "tilecast's cudagraph runtime).")
@click.option("--math", "math_mode", default="graph", show_default=True,
              type=click.Choice(["graph", "tf32", "tf32-conv", "amp-fp16", "amp-bf16"]),
              help="How an fp32 model's math runs (--dtype fp32): graph (fp32, TF32 off), "
                   "tf32, tf32-conv (cuDNN TF32 only: PyTorch 1.12+'s default), or amp-bf16 / "
                   "amp-fp16 (torch.autocast), as `tilecast analyze --math` forecasts it.")
@click.option("--attn", default="eager", show_default=True, type=click.Choice(["eager", "sdpa"]),
              help="Attention: eager (matmul, softmax, matmul) or PyTorch's fused SDPA.")
@click.option("--layers", type=click.IntRange(min=1),
              help="Keep this many transformer layers (the label records the cut depth).")
@click.option("--repeats", default=20, show_default=True, type=click.IntRange(min=1),
              help="Timed runs after warm-up; the label is their median.")
@click.option("--device", "device_spec", default="cuda:0", show_default=True,
              help="torch device: cuda:N, or cpu to test the collection without a GPU.")
def collect_labels(model: str, out_dir: Path, batch: int | None, seq: int | None, dtype: str,
                   mode: str, runtime: str, math_mode: str, attn: str, layers: int | None,
                   repeats: int, device_spec: str) -> None:
    """Time a whole model on your GPU and write its end-to-end label.

    MODEL is a zoo name (`tilecast export --list`) or a Hugging Face config.json. The model
    is built as `tilecast export` builds it (random weights, token ids 0), timed with CUDA
    events (median of --repeats runs after warm-up), and written in the shared labels'
    format with its dtype, runtime, task, versions and SM clock, so that `tilecast evaluate
    OUT/labels-<dtype>-<runtime>` scores the forecasts against it.

    \b
    Example:
      tilecast collect-labels bert-large -b 8 -s 512 --dtype bf16 --out my-h100
      tilecast collect-labels llama-3-8b -b 1 -s 2048 --layers 4 --runtime cudagraph --out my-h100
      tilecast collect-labels bert-large -b 8 -s 512 --dtype fp32 --math amp-bf16 \\
          --mode training --out my-h100
      tilecast evaluate my-h100/labels-bfloat16-eager
    """
    from .collect.labels import collect_label

    result = collect_label(model, out_dir, batch=batch, seq=seq, dtype=dtype, mode=mode,
                           runtime=runtime, attn=attn, layers=layers,
                           device_spec=device_spec, repeats=repeats, math=math_mode)
    click.echo(result.summary())
