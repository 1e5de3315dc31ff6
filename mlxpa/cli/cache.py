"""``mlxpa cache``: the disk KV tier's folder (``--kv-cache-dir``): list what it holds, clear
it (as ``pip cache`` and ``huggingface-cli delete-cache`` do)."""

from __future__ import annotations

from typing import Annotated

import typer

CACHE_EXAMPLES = """\b
Examples:
  mlxpa cache list                      # the auto folder (~/.cache/mlxpa/kv)
  mlxpa cache list --kv-cache-dir /data/kv
  mlxpa cache clear --yes
  mlxpa cache clear --namespace 3f2a9c01d4e5b6a7 --yes
"""

DirOpt = Annotated[str, typer.Option(
    "--kv-cache-dir", metavar="DIR", help="The folder (auto: ~/.cache/mlxpa/kv).")]

cache_app = typer.Typer(add_completion=False, rich_markup_mode=None,
                        pretty_exceptions_enable=False, no_args_is_help=True,
                        help="List or clear the disk KV cache (--kv-cache-dir).")


@cache_app.command("list")
def list_(kv_cache_dir: DirOpt = "auto") -> None:
    """List the folder's namespaces (one per model and KV layout): files, size, last use."""
    import time

    from mlxpa.core.disk_folder import summarize_folder
    from mlxpa.engine.disk_tier import kv_cache_folder

    folder = kv_cache_folder(kv_cache_dir)
    spaces = summarize_folder(folder)
    if not spaces:
        typer.echo(f"{folder}: empty")
        return
    typer.echo(f"{'namespace':<18}{'model':<32}{'files':>8}{'MiB':>10}  last used")
    for s in spaces:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.last_used)) if s.last_used \
            else "-"
        typer.echo(f"{s.namespace:<18}{s.model[:31]:<32}{s.num_files:>8}"
                   f"{s.nbytes / 2**20:>10,.1f}  {used}")
    total = sum(s.nbytes for s in spaces)
    typer.echo(f"{folder}: {sum(s.num_files for s in spaces)} files, "
               f"{total / 2**20:,.1f} MiB")


@cache_app.command("clear")
def clear(kv_cache_dir: DirOpt = "auto",
          namespace: Annotated[str | None, typer.Option(
              help="Only this namespace (as `mlxpa cache list` shows it).")] = None,
          yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
          ) -> None:
    """Remove the folder's block files (every namespace, or one)."""
    from mlxpa.core.disk_folder import clear_folder, is_namespace_folder
    from mlxpa.engine.disk_tier import kv_cache_folder

    folder = kv_cache_folder(kv_cache_dir)
    if namespace is not None and not is_namespace_folder(namespace):
        typer.echo(f"error: --namespace must be a namespace as `mlxpa cache list` shows it "
                   f"(16 hex digits), got {namespace!r}", err=True)
        raise typer.Exit(2)
    what = f"namespace {namespace} of {folder}" if namespace else str(folder)
    if not yes and not typer.confirm(f"remove the KV cache files under {what}?"):
        raise typer.Exit(1)
    files, nbytes = clear_folder(folder, namespace)
    typer.echo(f"removed {files} files ({nbytes / 2**20:,.1f} MiB) from {what}")
