"""The `kvplan` command line. Each command lives in its own module; heavy imports
(vLLM, torch, HTTP clients) happen inside the commands that need them, never here."""

from __future__ import annotations

import typer

from kvplan import __version__
from kvplan.cli import bench_cmd, catalog_cmd, check_cmd, fit_cmd, report_cmd, size_cmd, validate_cmd

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


def _debug(value: bool) -> None:
    if value:
        from kvplan.cli import common

        common.DEBUG = True


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    debug: bool = typer.Option(False, "--debug", callback=_debug, is_eager=True,
                               help="On an internal error, print the traceback (also KVPLAN_DEBUG=1)."),
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
app.command("report", epilog=report_cmd.EXAMPLES)(report_cmd.report)
app.command("fit", epilog=fit_cmd.FIT_EXAMPLES)(fit_cmd.fit)


def main_exit_code(argv: list[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default: sys.argv[1:]) and return the exit status instead of exiting.

    The one edge every command goes through: usage errors (a bad option value) are one line and
    exit 2, like every other input error, instead of click's multi-line box; any exception a
    command did not turn into a KvplanError is an internal error: one line, exit 3, and the
    traceback only with ``--debug`` or KVPLAN_DEBUG=1."""
    import sys

    from kvplan.cli import common
    from kvplan.cli.common import error_line
    from kvplan.errors import ExitCode, KvplanError

    args = list(sys.argv[1:] if argv is None else argv)
    common.DEBUG = common.debug_from_env() or "--debug" in args[: args.index("--") if "--" in args else len(args)]
    try:
        code = app(args=args, prog_name="kvplan", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        error_line("interrupted")
        return ExitCode.INTERRUPTED
    except KvplanError as exc:  # raised outside a command's own guard (a callback, a parser)
        common.report_error(exc)
        return exc.exit_code
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:  # noqa: BLE001 - click's own errors, by their public interface
        handled = _click_error(exc)
        if handled is not None:
            return handled
        common.report_internal_error(exc)
        return ExitCode.INTERNAL
    except BaseException as exc:  # noqa: BLE001 - the last guard: never a traceback by default
        common.report_internal_error(exc)
        return ExitCode.INTERNAL
    if code is None:
        return ExitCode.OK
    if isinstance(code, int):
        return code
    error_line(str(code))
    return ExitCode.BAD_INPUT


def _click_error(exc: Exception) -> int | None:
    """Click's exceptions (typer vendors its own click, whose module is private): recognized by
    click's public exception interface (``format_message``, ``exit_code``, ``ctx``) instead of an
    import. ``kvplan`` alone prints the help; a usage error is one line, exit 2."""
    from kvplan.cli.common import error_line
    from kvplan.errors import ExitCode

    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())
        return ExitCode.OK
    if not (callable(getattr(exc, "format_message", None)) and hasattr(exc, "exit_code")):
        return None
    if any(cls.__name__ == "UsageError" for cls in type(exc).__mro__):
        command = ctx.command_path if ctx is not None else "kvplan"
        error_line(f"{exc.format_message()} (see `{command} --help`)")
    else:  # e.g. a file option click could not open
        error_line(exc.format_message())
    return ExitCode.BAD_INPUT


def run() -> None:
    """Console-script entry point (``kvplan``)."""
    import contextlib
    import sys

    code = main_exit_code()
    with contextlib.suppress(OSError, ValueError):  # stdout closed or a broken pipe (`kvplan ... | head`)
        sys.stdout.flush()
    sys.exit(code)
