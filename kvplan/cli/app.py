"""The `kvplan` command line. Each command lives in its own module; heavy imports
(vLLM, torch, HTTP clients) happen inside the commands that need them, never here. Even typer is
imported only once `run` has paused the cyclic garbage collector for start-up (see `run`)."""

from __future__ import annotations

import gc
import importlib
from typing import TYPE_CHECKING

from kvplan import __version__

if TYPE_CHECKING:
    import typer

# name -> (module in kvplan.cli, function, its examples epilog). A command's module is imported
# only when that command runs (or for the full help): `kvplan size` does not pay for `bench`.
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "size": ("size_cmd", "size", "EXAMPLES"),
    "gpus": ("catalog_cmd", "gpus", None),
    "models": ("catalog_cmd", "models", None),
    "schema": ("catalog_cmd", "schema", None),
    "validate": ("validate_cmd", "validate", "VALIDATE_EXAMPLES"),
    "calibrate": ("validate_cmd", "calibrate", "CALIBRATE_EXAMPLES"),
    "check": ("check_cmd", "check", "CHECK_EXAMPLES"),
    "check-log": ("check_cmd", "check_log", "CHECK_LOG_EXAMPLES"),
    "bench": ("bench_cmd", "bench", "EXAMPLES"),
    "report": ("report_cmd", "report", "EXAMPLES"),
    "fit": ("fit_cmd", "fit", "FIT_EXAMPLES"),
}


def _version(value: bool) -> None:
    if value:
        import typer

        typer.echo(f"kvplan {__version__}")
        raise typer.Exit()


def _debug(value: bool) -> None:
    if value:
        from kvplan.cli import common

        common.DEBUG = True


def _help_folds_option_names() -> None:
    """Typer's help table cuts long option names to fit 80 columns (``--kv-cache-dtype…``): a user then
    cannot copy the flag. Its highlighters make each name's Text; ours make it fold onto the next line."""
    from typer import rich_utils

    def folding(highlighter):
        class Folding(type(highlighter)):
            def __call__(self, text):
                out = super().__call__(text)
                out.overflow = "fold"
                return out

        return Folding()

    rich_utils.highlighter = folding(rich_utils.highlighter)
    rich_utils.negative_highlighter = folding(rich_utils.negative_highlighter)


def build_app(only: str | None = None) -> typer.Typer:
    """The `kvplan` app with every command, or with ``only`` that one (what a run needs)."""
    import typer

    def main(
        version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
        debug: bool = typer.Option(False, "--debug", callback=_debug, is_eager=True,
                                   help="On an internal error, print the traceback (also KVPLAN_DEBUG=1)."),
    ) -> None:
        """kvplan: plan, check and benchmark vLLM KV-cache capacity."""

    app = typer.Typer(
        name="kvplan",
        help="KV-cache capacity planner and benchmark harness for vLLM deployments.\n\n"
        "Will this model, at this context and concurrency, fit on these GPUs without preemption?",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(main)
    for name, (module_name, function, epilog) in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"kvplan.cli.{module_name}")
        app.command(name, epilog=getattr(module, epilog) if epilog else None)(getattr(module, function))
    return app


def _command_in(args: list[str]) -> str | None:
    """The command a command line runs, when the options before it cannot change that."""
    first = next((arg for arg in args if arg != "--debug"), None)
    return first if first in COMMANDS else None


def __getattr__(name: str):
    if name == "app":  # the full app, for tests and tools that import it (built once)
        globals()["app"] = full = build_app()
        return full
    raise AttributeError(name)


def main_exit_code(argv: list[str] | None = None, *, gc_paused: bool = False) -> int:
    """Run the CLI on ``argv`` (default: sys.argv[1:]) and return the exit status instead of exiting.

    The one edge every command goes through: usage errors (a bad option value) are one line and
    exit 2, like every other input error, instead of click's multi-line box; any exception a
    command did not turn into a KvplanError is an internal error: one line, exit 3, and the
    traceback only with ``--debug`` or KVPLAN_DEBUG=1. ``gc_paused``: `run` paused the cyclic
    garbage collector for start-up; it runs again once the app is built."""
    import os
    import sys

    import typer

    from kvplan.cli import common
    from kvplan.cli.common import error_line
    from kvplan.errors import ExitCode, KvplanError

    args = list(sys.argv[1:] if argv is None else argv)
    common.DEBUG = common.debug_from_env() or "--debug" in args[: args.index("--") if "--" in args else len(args)]
    if not args or "-h" in args or "--help" in args:
        _help_folds_option_names()
    try:
        completing = any(key.endswith("_COMPLETE") for key in os.environ)  # shell completion asks for everything
        app = build_app(None if completing else _command_in(args))
        if gc_paused:  # start-up is over: what it built lives as long as the process; never scan it again
            gc.freeze()
            gc.enable()
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
        import typer

        help_text = exc.format_message()  # the help; empty when typer's rich formatter already printed it
        if help_text:
            typer.echo(help_text)
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
    """Console-script entry point (``kvplan``).

    Start-up (typer and click, the command's module) builds tens of thousands of objects that live as
    long as the process. The cyclic collector would scan them again and again and free nothing (a
    `kvplan size` run spent ~5% of its time in ~50 collections), so it is paused until the app is
    built (`main_exit_code`'s ``gc_paused``); the command itself runs with it on, as usual (about
    half of those collections remain)."""
    import contextlib
    import sys

    gc.disable()
    code = main_exit_code(gc_paused=True)
    with contextlib.suppress(OSError, ValueError):  # stdout closed or a broken pipe (`kvplan ... | head`)
        sys.stdout.flush()
    sys.exit(code)
