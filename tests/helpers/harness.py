"""Run kvplan in-process (fast) or in a capped subprocess (bombs), and check the error promise."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def one_line_error(self) -> str:
        """The promise for bad input: exit 2, exactly one line on stderr, no traceback."""
        lines = self.stderr.splitlines()
        assert "Traceback" not in self.stdout + self.stderr, self.stderr[-3000:]
        assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{self.stderr[-3000:]}"
        assert lines[0].startswith("error: "), lines[0]
        return lines[0]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return False


def invoke(*argv: str, env: dict[str, str] | None = None, stdin: str = "") -> Result:
    """``kvplan ARGV`` in this process (stdout/stderr captured, env patched for the call)."""
    from kvplan.cli.app import main_exit_code

    out, err = _Tty(), _Tty()
    saved_env = dict(os.environ)
    saved_in = sys.stdin
    try:
        if env:
            os.environ.update(env)
        sys.stdin = io.StringIO(stdin)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main_exit_code(list(argv))
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.stdin = saved_in
    return Result(int(code), out.getvalue(), err.getvalue())


def invoke_capped(*argv: str, timeout: float = 30, memory_mb: int = 1500, env: dict[str, str] | None = None,
                  cwd: str | Path | None = None) -> Result:
    """``python -m kvplan ARGV`` in a subprocess with an address-space cap and a timeout."""

    def limit() -> None:
        cap = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    full_env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}))
    full_env.setdefault("PYTHONPATH", str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "kvplan", *argv], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def not_a_file(path: Path, target: str) -> str:
    """Make ``path`` the ``target`` a test names and return the argument to pass: "fifo" (a FIFO there),
    "folder" (an empty folder there), "missing" (nothing there), "dev-symlink" (a link to /dev/zero),
    or a device such as "/dev/zero" (passed as it is; nothing is made)."""
    if target.startswith("/dev/"):
        return target
    if target == "fifo":
        os.mkfifo(path)
    elif target == "folder":
        path.mkdir()
    elif target == "dev-symlink":
        path.symlink_to("/dev/zero")
    return str(path)
