"""``tilecast devices`` and ``tilecast clusters``: the GPU database and the cluster presets."""

from __future__ import annotations

import click

from .cli_options import output_options, write_output


@click.group(invoke_without_command=True)
@output_options(("table", "json"))
@click.pass_context
def devices(ctx: click.Context, fmt: str, output: str | None) -> None:
    """List the GPUs in the device database.

    \b
    Example:
      tilecast devices
      tilecast devices show l4
    """
    if ctx.invoked_subcommand is None:
        from .device_db.report import render_devices

        write_output(render_devices(fmt), output)


@devices.command("show")
@click.argument("name")
@output_options(("table", "json"))
def devices_show(name: str, fmt: str, output: str | None) -> None:
    """Print one GPU's description with its sources.

    \b
    Example:
      tilecast devices show "NVIDIA H100 80GB HBM3"
    """
    from .device_db.report import render_device

    write_output(render_device(name, fmt), output)


@click.group(invoke_without_command=True)
@output_options(("table", "json"))
@click.pass_context
def clusters(ctx: click.Context, fmt: str, output: str | None) -> None:
    """List the cluster presets for --parallel (GPUs per node, links, NCCL bus bandwidth).

    \b
    Example:
      tilecast clusters
      tilecast clusters show dgx-h100 --format json
    """
    if ctx.invoked_subcommand is None:
        from .parallel.cluster_report import render_clusters

        write_output(render_clusters(fmt), output)


@clusters.command("show")
@click.argument("name")
@output_options(("table", "json"))
def clusters_show(name: str, fmt: str, output: str | None) -> None:
    """Print one cluster preset (or cluster JSON) with its sources.

    \b
    Example:
      tilecast clusters show dgx-a100
    """
    from .parallel.cluster_report import render_cluster

    write_output(render_cluster(name, fmt), output)
