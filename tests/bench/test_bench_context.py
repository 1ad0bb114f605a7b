"""A point whose requests ask for more tokens than the engine's context is refused before it sends anything: vLLM
0.32 refuses a prompt longer than max_model_len and cuts the output of a request that does not fit
(vllm/entrypoints/serve/utils/api_utils.py@0.32.0 ``get_max_tokens``), so the point would fail half-way, or measure
shorter outputs than asked. Seen on the CPU engine (context 512): a lognormal 256 + 16 workload drew a 543-token
prompt at its third point and the run died there on an HTTP 400."""

from __future__ import annotations

import json
import subprocess

from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer


def _trace(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": m}) + "\n" for p, m in rows))
    return path


def _bench(url, tmp_path, trace):
    return subprocess.run(kvplan_cmd("--url", url, "--sweep", "1,2", "--requests-per-stream", "1", "--trace",
                                     str(trace), "--no-warmup", "--out", str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=120, env=bench_env())


def test_a_point_over_the_context_is_refused_before_it_sends(tmp_path):
    # Requests 0 (point 1), 1 and 2 (point 2): 100 + 10, 120 + 10, 290 + 20 tokens; the server serves 300.
    trace = _trace(tmp_path, [(100, 10), (120, 10), (290, 20)])
    behaviour = FakeBehaviour(tokens=4, max_model_len=300)
    with FakeServer(behaviour) as srv:
        proc = _bench(srv.url, tmp_path, trace)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert ("the point at concurrency 2: request 2 asks for 290 prompt + 20 output tokens, more than the engine's "
            "max_model_len 300") in lines[0]
    assert behaviour.requests == 1  # point 1's only request; none of point 2's was sent
    run = next((tmp_path / "runs").iterdir())
    points = [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]
    assert [(p["concurrency"], p["status"]) for p in points] == [(1, "ok")]  # the finished point kept


def test_requests_that_fit_the_context_run(tmp_path):
    # The same requests on a 310-token context (290 + 20 fits exactly), and on a server that does not say its context.
    trace = _trace(tmp_path, [(100, 10), (120, 10), (290, 20)])
    for said in (310, None):
        behaviour = FakeBehaviour(tokens=4, max_model_len=said)
        with FakeServer(behaviour) as srv:
            proc = _bench(srv.url, tmp_path / str(said), trace)
        assert proc.returncode == 0, (said, proc.stderr[-2000:])
        assert behaviour.requests == 3


def test_a_replay_turn_over_the_context_is_refused_before_its_point_sends(tmp_path):
    # A lengths-only traffic file: two sessions of one turn, 100 + 10 and 290 + 20 tokens; the server serves 300.
    traffic = _trace(tmp_path, [(100, 10), (290, 20)])
    behaviour = FakeBehaviour(tokens=4, max_model_len=300)
    with FakeServer(behaviour) as srv:
        proc = subprocess.run(kvplan_cmd("--url", srv.url, "--traffic", str(traffic), "--traffic-kind", "lengths",
                                         "--sessions", "1,2", "--no-warmup", "--out", str(tmp_path / "runs")),
                              capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "the point at 2 sessions: session" in line and "turn 0 asks for 290 prompt + 20 output tokens" in line, line
    assert behaviour.requests == 1  # the first point's turn only
