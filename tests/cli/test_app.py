"""The `kvplan` entry point: the bare command's help, and what a plain `kvplan size` imports."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from helpers.harness import invoke  # noqa: E402


def test_kvplan_alone_prints_the_help_once():
    result = invoke()
    assert result.code == 0 and result.stderr == ""
    assert result.stdout.count("Usage: kvplan") == 1 and "size" in result.stdout


def test_plain_size_through_the_entry_point_stays_light():
    """The console script's path (`run`, with the collector paused for start-up): the table, exit 0, and
    none of the engine, HTTP or validation libraries imported (kvplan's pydantic only serializes --json;
    typer 0.29 and later import it themselves to coerce every option, typer/_adapters.py)."""
    typer_needs_pydantic = importlib.util.find_spec("typer._adapters") is not None
    heavy = ("torch", "vllm", "transformers", "aiohttp") + (() if typer_needs_pydantic else ("pydantic",))
    code = ("import sys; sys.argv = ['kvplan', 'size', 'meta-llama/Llama-3.1-8B', '--gpu', '4090', '--ctx', '32k', "
            "'--vllm-version', '0.33.0']\n"
            "import atexit, gc\n"
            f"heavy = {heavy!r}\n"
            "atexit.register(lambda: print(gc.isenabled(), sorted(m for m in heavy if m in sys.modules), file=sys.stderr))\n"
            "from kvplan.cli.app import run; run()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "FITS" in out.stdout and "vllm serve meta-llama/Llama-3.1-8B" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "True []"  # the collector runs again once start-up is over


def test_help_at_80_columns_cuts_no_option_name():
    """Typer's help would print `--kv-cache-dtype…` at 80 columns (11 names cut in `size --help`, 19 in
    `bench --help`): no name is cut, and every option's name is found whole in the option column (a long
    one folds onto the next row)."""
    import typer.main

    from kvplan.cli.app import COMMANDS, build_app

    for name in COMMANDS:
        r = invoke(name, "--help", env={"COLUMNS": "80"})
        assert r.code == 0, (name, r.stderr[-1000:])
        assert "…" not in r.stdout, (name, [line for line in r.stdout.splitlines() if "…" in line])
        rows = [line.split("│")[1].split() for line in r.stdout.splitlines() if line.count("│") >= 2]
        rows = [cells[1:] if cells[:1] == ["*"] else cells for cells in rows]  # the "required" mark
        column = "".join(cells[0] for cells in rows if cells)  # the first cell of each row, folds rejoined
        command = typer.main.get_command(build_app(name)).commands[name]
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in column, (name, opt)
