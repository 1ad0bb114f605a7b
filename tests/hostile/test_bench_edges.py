"""Bench inputs that fail before any engine starts: one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "tiny-llama"


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "kvplan", "bench", str(TINY), "--prompt", "8", "--output", "8",
                           "--sweep", "1", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def test_out_on_a_file_is_one_line_and_exit_2(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    out = bench("--out", str(target), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot create a run folder" in out.stderr and "Traceback" not in out.stderr


def test_an_unresolvable_host_is_one_line_and_exit_2(tmp_path):
    out = bench("--host", "no-such-host.invalid", "--out", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "cannot listen on host" in out.stderr and "Traceback" not in out.stderr
