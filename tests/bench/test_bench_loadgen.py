"""The load generator against a local streaming server with known delays, and the CLI's failure
paths that need no engine: --url at nothing, a port taken, a server that dies mid-stream."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import subprocess

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer, KeepAliveDropServer

from kvplan.bench.loadgen import run_closed_loop, run_sessions
from kvplan.bench.replay import request_specs, session_sends
from kvplan.bench.workload import Workload
from kvplan.traffic.model import Segment, Traffic, Turn


def _run(url: str, concurrency: int, per_stream: int, output: int = 4, keep_alive: bool = True):
    w = Workload(prompt_tokens=8, output_tokens=output, nonce="t")
    return asyncio.run(run_closed_loop(url, "fake", "completions", concurrency, per_stream, w.request,
                                       keep_alive=keep_alive))


def test_timestamps_count_from_the_scheduled_time():
    # First token after >= 50 ms, then 4 more tokens 20 ms apart: TTFT >= 0.05, E2E >= 0.05 + 4 x 0.02.
    with FakeServer(FakeBehaviour(first_token_delay_s=0.05, token_gap_s=0.02)) as srv:
        result = _run(srv.url, concurrency=2, per_stream=2, output=5)
        bodies = srv.behaviour.bodies
    assert result.aborted is None and len(result.records) == 4 and all(r.ok for r in result.records)
    for r in result.records:
        # Five tokens in five deliveries, or fewer when the client read two at once (a stalled 2-core machine: a CI
        # run once got this request's five tokens in two reads); an ITL for every token after the first delivery.
        assert r.output_tokens == 5 and sum(r.chunk_tokens) == 5 and len(r.chunk_tokens) == len(r.chunk_times_s)
        assert len(r.itl_s) == 5 - r.chunk_tokens[0]
        assert r.ttft_s >= 0.05
        # Each gap is the server's asyncio.sleep(0.02) less timer slack, unless two chunks arrived in one read (a
        # busy 2-core machine: the client ran late, and one delivery's tokens share its timestamp): most gaps, when
        # every token came in its own read (a read of several shows their mean gap since the previous read).
        if len(r.chunk_tokens) == 5:
            assert sorted(r.itl_s)[len(r.itl_s) // 2] >= 0.015, r.itl_s
        assert r.e2e_s >= 0.05 + 4 * 0.02
        assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)
        assert r.sent_s >= r.scheduled_s
    # A stream's second request is scheduled when its first one ended (closed loop), not on a clock: each
    # request takes >= 0.13 s, so 30 ms of slack (a busy 2-core CI machine's scheduler) tells them apart.
    by_stream = {}
    for r in result.records:
        by_stream.setdefault(r.stream, []).append(r)
    for first, second in by_stream.values():
        assert first.end_s <= second.scheduled_s <= first.end_s + 0.03
    # What was sent: token ids, ignore_eos, fixed max_tokens, streaming with usage.
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 5 and b["stream"] is True for b in bodies)
    assert all(isinstance(b["prompt"], list) and len(b["prompt"]) == 8 for b in bodies)
    assert len({tuple(b["prompt"]) for b in bodies}) == 4  # unique prompts


def test_connections_are_limited_to_the_concurrency():
    with FakeServer(FakeBehaviour(first_token_delay_s=0.05)) as srv:
        result = _run(srv.url, concurrency=6, per_stream=3)
        assert srv.behaviour.max_in_flight == 6 and srv.behaviour.requests == 18
    assert sum(r.ok for r in result.records) == 18


def test_connections_are_reused_unless_keep_alive_is_off():
    # serve=100: no connection is dropped whichever request the pool hands it (the order in which
    # aiohttp reuses pooled connections differs between releases).
    for keep_alive, connections in ((True, 2), (False, 6)):
        with KeepAliveDropServer(serve=100) as srv:
            result = _run(srv.url, concurrency=2, per_stream=3, keep_alive=keep_alive)
            assert (srv.connections, srv.answered, srv.dropped) == (connections, 6, 0)
        assert all(r.ok and r.retries == 0 for r in result.records)


def test_the_body_is_read_to_its_end_after_done_so_the_connection_is_reused():
    # The server ends the chunked body 20 ms after [DONE]: released before that, the connection
    # would be closed by aiohttp and each request would open a new one.
    with FakeServer(FakeBehaviour(end_delay_s=0.02)) as srv:
        result = _run(srv.url, concurrency=2, per_stream=3)
        assert len(srv.behaviour.peers) == 2
    assert all(r.ok for r in result.records)


def test_a_request_a_reused_connection_dropped_unread_is_resent_once_on_a_fresh_one():
    # The server closes a reused connection 50 ms after the request arrived, without answering: the
    # request goes again on a new connection, keeps its scheduled time, and the 50 ms are in its TTFT.
    with KeepAliveDropServer(drop_delay_s=0.05) as srv:
        result = _run(srv.url, concurrency=1, per_stream=3)
        assert (srv.answered, srv.dropped) == (3, 1)
    first, second, third = result.records
    assert result.aborted is None and all(r.ok for r in result.records)
    assert [r.retries for r in result.records] == [0, 1, 0] and result.retries == 1
    assert second.scheduled_s == pytest.approx(first.end_s, abs=0.005)  # the closed loop's time, not the retry's
    assert second.sent_s < second.scheduled_s + 0.01
    # The 50 ms are in its TTFT (timed from its scheduled time, not from the resend): above the drop's 50 ms, and
    # 40 ms or more above the faster of the two requests sent once (not `first.ttft_s < 0.05`: on a loaded 2-core
    # CI machine the first request alone once took 56 ms).
    assert second.ttft_s >= 0.05 and second.ttft_s >= min(first.ttft_s, third.ttft_s) + 0.04
    assert second.to_json()["retries"] == 1 and "retries" not in first.to_json()


def test_a_request_dropped_on_a_fresh_connection_is_not_resent():
    with KeepAliveDropServer(serve=0) as srv:
        result = _run(srv.url, concurrency=1, per_stream=3)
        assert srv.dropped == 1
    assert result.aborted and "the server went away" in result.aborted
    assert len(result.records) == 1 and result.retries == 0


def test_a_one_mebibyte_sse_line_is_read():
    # aiohttp's default 64 KiB buffer would fail on such a line (vllm#39963).
    with FakeServer(FakeBehaviour(chunk_padding=1 << 20)) as srv:
        result = _run(srv.url, concurrency=1, per_stream=1, output=2)
    assert result.records[0].ok, result.records[0].error


def test_a_server_dying_mid_stream_stops_the_point():
    with FakeServer(FakeBehaviour(die_after_chunks=2, token_gap_s=0.01)) as srv:
        result = _run(srv.url, concurrency=2, per_stream=5, output=8)
    assert result.aborted and "the server went away" in result.aborted
    failed = [r for r in result.records if not r.ok]
    assert failed and all(r.error for r in failed)
    assert len(result.records) < 10  # no new requests after the server went away


# ------------------------------------------------------------------------ CLI failure paths


def _cli(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(kvplan_cmd(*args), capture_output=True, text=True, timeout=timeout, env=bench_env())


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_url_pointing_at_nothing(tmp_path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = _cli(["--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert _one_line_error(proc) == f"error: nothing answers at http://127.0.0.1:{port} " \
                                    "(start vLLM there, or check --url (scheme, host, port))"
    assert list(tmp_path.iterdir()) == []  # no run folder for a run that never started


def test_port_taken(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        proc = _cli(["some/model", "--port", str(port), "--out", str(tmp_path)])
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is taken" in _one_line_error(proc)


def test_server_dies_mid_stream(tmp_path):
    with FakeServer(FakeBehaviour(die_after_chunks=2, token_gap_s=0.01)) as srv:
        proc = _cli(["--url", srv.url, "--sweep", "1,2",
            "--requests-per-stream", "3", "--prompt", "8", "--output", "8", "--out", str(tmp_path),
                     "--no-warmup", "--json"])
    assert proc.returncode == 4, proc.stderr
    line = _one_line_error(proc)
    assert line.startswith("error: the point at concurrency 1 failed: the server went away")
    # The failed point is in the run folder; the summary says why.
    run = next(tmp_path.iterdir())
    points = [json.loads(x) for x in (run / "points.jsonl").read_text().splitlines()]
    assert [(p["concurrency"], p["status"]) for p in points] == [(1, "failed")]
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


def test_attach_without_metrics_still_measures_latency(tmp_path):
    with FakeServer(FakeBehaviour(metrics=False, first_token_delay_s=0.01)) as srv:
        proc = _cli(["--url", srv.url, "--sweep", "1,2", "--prompt", "8", "--output", "3", "--out", str(tmp_path),
                     "--json"])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["metrics_error"] and summary["model"] == "fake"
    assert [p["requests_ok"] for p in summary["points"]] == [100, 100]  # the default: 100 requests a point
    assert all(p["ttft"]["n"] == 100 and not any("TTFT" in w for w in p["warnings"]) for p in summary["points"])
    assert all(p["ttft"]["p50"] >= 0.01 for p in summary["points"])


def test_no_model_and_no_spec_file(tmp_path):
    proc = subprocess.run(kvplan_cmd(), capture_output=True, text=True, timeout=120, env=bench_env(), cwd=tmp_path)
    assert proc.returncode == 2
    assert _one_line_error(proc) == ("error: no MODEL given and no ./kvplan.yaml here "
                                     "(pass a model, --url, or --resume RUN_DIR)")


def test_spec_deployments_become_engine_settings(tmp_path):
    from kvplan.cli.bench_cmd import _spec_deployments

    spec = tmp_path / "kvplan.yaml"
    spec.write_text(
        "deployments:\n"
        "  - name: tiny\n"
        "    model: tests/fixtures/tiny-llama\n"
        "    gpu: H100\n"
        "    context: 512\n"
        "    concurrency: 6\n"
        "    prompt: 64\n"
        "    output: 64\n"
        "    block_size: 32\n"
        "    kv_cache_memory: 64MiB\n"
        "    max_num_seqs: 16\n"
        "    enforce_eager: true\n"
    )
    ((name, engine, workload, gpu, level),) = _spec_deployments(spec)
    assert (name, gpu, level) == ("tiny", "H100", 6)
    assert engine["model"] == "tests/fixtures/tiny-llama" and engine["max_model_len"] == 512
    assert engine["kv_cache_memory_bytes"] == 64 * 2**20 and engine["block_size"] == 32
    assert engine["max_num_seqs"] == 16 and engine["enforce_eager"] is True
    assert workload == {"prompt_tokens": 64, "output_tokens": 64}


def test_check_fails_when_a_measured_onset_differs(tmp_path):
    # A server that reports a 17-block pool of 32 but never preempts nor queues (the fake one):
    # the rule predicts both onsets at 5 (16 usable // cdiv(64 + 64 - 1, 32) = 4 blocks + 1), the
    # sweep measures none, and --check turns the difference into exit code 1.
    behaviour = FakeBehaviour(cache_info='block_size="32",num_gpu_blocks="17"')
    with FakeServer(behaviour) as srv:
        proc = _cli(["--url", srv.url, "--sweep", "4,5", "--prompt", "64", "--output", "64", "--out", str(tmp_path),
                     "--requests-per-stream", "1", "--no-warmup", "--check", "--json"])
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["predicted_first_preemption"] == 5 and summary["measured_first_preemption"] is None
    assert summary["measured"]["agrees_with_prediction"] == {"first_kv_wait": False, "first_preemption": False}


def test_a_replay_sends_each_request_at_its_time_with_only_young_collections_meanwhile():
    """Each session's first turn is dispatched just before its timestamp and sent by its own task at it (never
    before, and within 50 ms); while the load runs, the collector's older generations never come due, and its
    thresholds are as they were after. The 50 ms is a bound on this machine's scheduling, not the replay's: a CI
    machine running another test suite beside this one once held the event loop past it, so the replay is run again
    (at most three times) until one run's sends all fall within it; every other check holds on every run."""
    at = [0.05 + 0.01 * i for i in range(12)]
    traffic = Traffic(tuple(Turn(f"s{i}", 0, (Segment("sys", 16), Segment(f"u{i}", 8)), 2, arrival_s=t)
                            for i, t in enumerate(at)), "twelve sessions 10 ms apart")
    lateness = []
    for _ in range(3):
        thresholds_seen: list[tuple[int, ...]] = []
        before = gc.get_threshold()
        with FakeServer(FakeBehaviour(first_token_delay_s=0.005, token_gap_s=0.001)) as srv:
            result = asyncio.run(run_sessions(srv.url, "fake", "completions", session_sends(traffic),
                                              request_specs(traffic, "t"),
                                              on_request_done=lambda rec, seen=thresholds_seen: seen.append(gc.get_threshold())))
        assert result.aborted is None and all(r.ok for r in result.records) and len(result.records) == 12
        assert sorted(r.scheduled_s for r in result.records) == pytest.approx(at)
        assert all(r.scheduled_s <= r.sent_s for r in result.records)
        assert thresholds_seen == [(before[0], 1 << 30, 1 << 30)] * 12
        assert gc.get_threshold() == before
        lateness.append(max(r.sent_s - r.scheduled_s for r in result.records))
        if lateness[-1] < 0.05:
            break
    assert lateness[-1] < 0.05, lateness
