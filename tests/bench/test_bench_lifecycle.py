"""`kvplan bench MODEL` launching its own engine: a full automatic run of the real vLLM CPU engine and
its run folder, and a bad engine flag; Ctrl-C in the middle of a sweep and the engine killed in the
middle of a point with the stand-in engine (failure paths: kvplan's handling is under test, and each
real start costs ~35 s of CI). After each, no process of the engine's process group may be left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.bench import (
    ENGINE_FLAGS,
    TINY_MODEL,
    bench_env,
    engine_required,
    group_alive,
    kill_group,
    kvplan_cmd,
    wait_for,
)

from kvplan.plan.blocks import BlockRule

pytestmark = [pytest.mark.engine, engine_required]

STARTUP_S = 600


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = {**bench_env(), "KVPLAN_NO_PLOT": ""}  # a launched run's folder, plot.png included
    return subprocess.Popen(kvplan_cmd(str(TINY_MODEL), *ENGINE_FLAGS, "--out", str(tmp_path), *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


FAKE_ENGINE = Path(__file__).resolve().parents[1] / "helpers" / "fake_server.py"


def _start_fake(tmp_path: Path, *args: str) -> subprocess.Popen:
    """The same launch with the stand-in engine (helpers.fake_server.main): for the failure paths, where
    what is under test is kvplan's handling (the real engine's start and stop: the first test)."""
    engine_cmd = f"{sys.executable} {FAKE_ENGINE} --token-gap 0.01"
    return subprocess.Popen(kvplan_cmd("some/model", "--engine-cmd", engine_cmd, "--no-warmup", "--out", str(tmp_path),
                                       "--startup-timeout", "60", *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=bench_env())


def _run_dir(tmp_path: Path) -> Path:
    wait_for(lambda: any(tmp_path.iterdir()), 30)
    return next(tmp_path.iterdir())


def _engine_pid(run: Path) -> int:
    def pid():
        try:
            return json.loads((run / "run.json").read_text())["engine"]["pid"]
        except (OSError, ValueError, KeyError):
            return None

    assert wait_for(lambda: pid() is not None, 60), "run.json never named the engine"
    return pid()


def _points(run: Path) -> list[dict]:
    path = run / "points.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _finish(proc: subprocess.Popen, timeout: float = STARTUP_S) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_launch_sweep_run_folder_and_nothing_left(tmp_path):
    # 8 requests a stream: each wave another chance to overlap as the rule assumes (test_bench_engine.py's
    # ONSET_REQUESTS_PER_STREAM; with 3, CI once measured the onset at 8 instead of 5). The levels around the onset
    # only: tests/bench/test_bench_engine.py sweeps this workload on this pool from 1 (the launch adds nothing below 4).
    proc = _start(tmp_path, "--prompt", "64", "--output", "64", "--json", "--requests-per-stream", "8",
                  "--scrape-interval", "0.05", "--sweep", "4,5")
    run = _run_dir(tmp_path)
    pgid = _engine_pid(run)
    try:
        out, err = _finish(proc)
    finally:
        kill_group(pgid)
    assert proc.returncode == 0, err[-3000:]
    s = json.loads(out)
    # Capacity read back from the engine: the log line and vllm:cache_config_info (17 x 32 = 544).
    assert (s["capacity"]["num_blocks"], s["capacity"]["block_size"], s["capacity"]["kv_cache_tokens"]) == (17, 32, 544)
    assert set(s["capacity"]["source"].split("+")) == {"metrics", "log"}
    rule = BlockRule(s["capacity"]["num_blocks"], s["capacity"]["block_size"], 64, 64, max_num_seqs=1 << 30)
    assert s["measured_first_kv_wait"] == rule.first_kv_wait == 5  # 16 usable // 4 peak blocks + 1
    assert s["measured_first_preemption"] == rule.first_preemption == 5
    assert s["status"] == "complete" and s["mode"] == "launch"
    # The engine's EngineCore and worker yielded the CPU to its API server and the load generator.
    assert json.loads((run / "run.json").read_text())["engine"]["reniced_processes"] >= 2
    # The run folder.
    names = {p.name for p in run.iterdir()}
    assert {"run.json", "points.jsonl", "requests.jsonl", "engine.log", "summary.json", "report.md", "plot.png"} <= names
    points = _points(run)
    assert sorted(p["concurrency"] for p in points) == [p["concurrency"] for p in s["points"]]
    requests = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    assert len(requests) == sum(p["requests"] for p in points)
    assert all(r["ok"] and r["output_tokens"] == 64 and r["prompt_tokens"] == 64 for r in requests)
    assert "CPU KV cache size: 544 tokens" in (run / "engine.log").read_text()
    assert json.loads((run / "summary.json").read_text()) == s
    report = (run / "report.md").read_text()
    assert "| first concurrency with preemptions | 5 | 5 (agrees) |" in report
    assert (run / "plot.png").read_bytes()[:4] == b"\x89PNG"
    # Nothing of the engine is left.
    assert not group_alive(pgid)


def test_ctrl_c_mid_sweep_keeps_finished_points_and_stops_the_engine(tmp_path):
    proc = _start_fake(tmp_path, "--sweep", "1,2,3,4,5,6,7,8", "--prompt", "64", "--output", "64",
                  "--requests-per-stream", "4")
    run = _run_dir(tmp_path)
    pgid = _engine_pid(run)
    try:
        assert wait_for(lambda: len(_points(run)) >= 1, STARTUP_S, 0.05), "no point finished"
        time.sleep(0.3)  # inside the next point
        proc.send_signal(signal.SIGINT)
        _, err = _finish(proc, 120)
    finally:
        kill_group(pgid)
    assert proc.returncode == 130, err[-3000:]
    (line,) = _error_lines(err)
    assert line == f"error: interrupted; finished points kept in {run} (continue with --resume {run})"
    points = _points(run)
    assert points and all(p["status"] == "ok" for p in points)
    assert len(points) < 8
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and len(summary["points"]) == len(points)
    assert wait_for(lambda: not group_alive(pgid), 5)


def test_engine_killed_mid_point(tmp_path):
    proc = _start_fake(tmp_path, "--sweep", "1,4,8", "--prompt", "64", "--output", "64", "--requests-per-stream", "6")
    run = _run_dir(tmp_path)
    pgid = _engine_pid(run)
    try:
        assert wait_for(lambda: len(_points(run)) >= 1, STARTUP_S, 0.05), "no point finished"
        time.sleep(0.3)
        os.killpg(pgid, signal.SIGKILL)  # the engine dies: API server, engine core and worker
        _, err = _finish(proc, 120)
    finally:
        kill_group(pgid)
    assert proc.returncode == 4, err[-3000:]
    (line,) = _error_lines(err)
    points = _points(run)
    ok, failed = points[:-1], points[-1]
    assert ok and all(p["status"] == "ok" for p in ok)
    assert failed["status"] == "failed" and "the engine exited (code -9)" in failed["error"]
    assert line.startswith(f"error: the point at concurrency {failed['concurrency']} failed: the engine exited (code -9)")
    assert f"{len(ok)} finished point" in line
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"
    assert not group_alive(pgid)


def test_engine_that_cannot_start_shows_its_log(tmp_path):
    proc = _start(tmp_path, "--engine-arg=--no-such-flag")
    out, err = _finish(proc)
    assert proc.returncode == 2
    (line,) = _error_lines(err)
    assert line.startswith("error: the engine exited with code 2 before it was ready (log: ")
    assert "last log lines:" in line
    assert "unrecognized arguments: --no-such-flag" in err  # the tail of the engine's log
    assert out == ""
    run = next(tmp_path.iterdir())
    assert not group_alive(_engine_pid(run))
