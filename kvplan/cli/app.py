"""The `kvplan` command line. Each command lives in its own module; heavy imports
(vLLM, torch, HTTP clients) happen inside the commands that need them, never here."""

from __future__ import annotations

import typer

from kvplan import __version__
from kvplan.cli import bench_cmd, catalog_cmd, check_cmd, size_cmd, validate_cmd

app = typer.Typer(
    name="kvplan",
    help="KV-cache capacity planner and benchmark harness for vLLM deployments.\n\n"
    "Will this model, at this context and concurrency, fit on these GPUs without preemption?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kvplan {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """kvplan: plan, check and benchmark vLLM KV-cache capacity."""


app.command("size", epilog=size_cmd.EXAMPLES)(size_cmd.size)
app.command("gpus")(catalog_cmd.gpus)
app.command("models")(catalog_cmd.models)
app.command("schema")(catalog_cmd.schema)
app.command("validate", epilog=validate_cmd.VALIDATE_EXAMPLES)(validate_cmd.validate)
app.command("calibrate", epilog=validate_cmd.CALIBRATE_EXAMPLES)(validate_cmd.calibrate)
app.command("check", epilog=check_cmd.CHECK_EXAMPLES)(check_cmd.check)
app.command("check-log", epilog=check_cmd.CHECK_LOG_EXAMPLES)(check_cmd.check_log)
app.command("bench", epilog=bench_cmd.EXAMPLES)(bench_cmd.bench)


def run() -> None:
    """Console-script entry point: usage errors (a bad option value) are one line and exit 2,
    like every other input error, instead of click's multi-line box."""
    import sys

    from typer._click import exceptions as click_exceptions

    from kvplan.cli.common import error_line

    try:
        code = app(standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:  # `kvplan` alone: the help, as usual
        typer.echo(exc.ctx.get_help())
        sys.exit(0)
    except click_exceptions.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "kvplan"
        error_line(f"{exc.format_message()} (see `{command} --help`)")
        sys.exit(2)
    except typer.Abort:
        error_line("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
