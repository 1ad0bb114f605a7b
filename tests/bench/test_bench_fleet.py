"""`kvplan bench --url A --url B` (several replicas of one model) against two stand-in replicas on loopback
(tests/helpers/fleet.py: real HTTP servers streaming completions, each serving vLLM 0.32's recorded /metrics text
moved by its own requests through its own pool). The real CPU engine beside a stand-in: test_bench_fleet_engine.py.

Every expected number is hand arithmetic on the pools the stand-ins are given: prompt 64 + output 64 in blocks of 32
peak at ceil(127 / 32) = 4 blocks and are admitted with ceil(64 / 32) = 2; 17 blocks (16 usable) hold 16 // 4 = 4
requests, so that replica alone waits and preempts from 5 requests; 13 blocks (12 usable) hold 3, so from 4."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fleet import PoolReplica
from helpers.llmd import assert_valid_llmd_reports

from kvplan.bench.config import BenchConfig, FleetConfig
from kvplan.bench.fleet import FleetRule, fleet_config, resumed_fleet
from kvplan.bench.route import Router, share
from kvplan.errors import KvplanError
from kvplan.plan.blocks import BlockRule

WORKLOAD = ("--prompt", "64", "--output", "64", "--scrape-interval", "0.05")


def _bench(out: Path, *args: str, code: int = 0, timeout: float = 180) -> subprocess.CompletedProcess:
    proc = subprocess.run(kvplan_cmd(*args, "--out", str(out)), capture_output=True, text=True, timeout=timeout,
                          env=bench_env())
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc


def _run_dir(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def _rule(num_blocks: int) -> BlockRule:
    return BlockRule(num_blocks=num_blocks, block_size=32, prompt_tokens=64, output_tokens=64, max_num_seqs=1 << 30)


# ---------------------------------------------------------------- the prediction, by hand


def test_the_fleet_rule_by_hand():
    assert [share(9, i, 2) for i in range(2)] == [5, 4]  # 9 requests one to each in turn: 5 and 4
    assert [share(7, i, 3) for i in range(3)] == [3, 2, 2]
    # Two equal pools (onset 5 each): replica 0 reaches 5 at 2 x 4 + 1 = 9 streams, replica 1 at 2 x 4 + 2 = 10.
    equal = FleetRule([_rule(17), _rule(17)], ["a", "b"])
    assert equal.first("first_preemption") == (9, 0) and equal.first("first_kv_wait") == (9, 0)
    assert not equal.preempts(8) and equal.preempts(9)
    # Onsets 5, 4, 5 over three replicas: 3 x 4 + 1 = 13, 3 x 3 + 2 = 11, 3 x 4 + 3 = 15: the second, at 11.
    three = FleetRule([_rule(17), _rule(13), _rule(17)], ["a", "b", "c"])
    assert three.first("first_preemption") == (11, 1)
    assert three.share(11, 1) == 4 and three.label(10) == "neither" and three.label(11) == "KV-limited"
    # A pool that never preempts (max_num_seqs 3 < its onset 5) leaves the other one's onset.
    capped = BlockRule(num_blocks=17, block_size=32, prompt_tokens=64, output_tokens=64, max_num_seqs=3)
    assert FleetRule([capped, _rule(13)], ["a", "b"]).first("first_preemption") == (2 * 3 + 2, 1)


def test_routers_by_hand():
    rr = Router(["u0", "u1"], ["a", "b"], "round-robin")
    assert [rr.pick() for _ in range(5)] == [0, 1, 0, 1, 0]  # whatever each holds
    lo = Router(["u0", "u1"], ["a", "b"], "least-outstanding")
    assert [lo.pick() for _ in range(3)] == [0, 1, 0]  # a tie goes to the first listed
    lo.release(1)
    assert lo.pick() == 1 and lo.outstanding == [2, 1]


# ---------------------------------------------------------------- two stand-in replicas


def test_least_outstanding_names_the_first_replica_to_preempt(tmp_path):
    with PoolReplica(17) as a, PoolReplica(13) as b:
        proc = _bench(tmp_path, "--url", a.url, "--url", b.url, "--route", "least-outstanding", "--sweep", "6,7,8",
                      "--requests-per-stream", "3", *WORKLOAD)
        fake_preemptions = (a.preemptions, b.preemptions)
    run = _run_dir(tmp_path)
    s = json.loads((run / "summary.json").read_text())
    fleet = s["fleet"]
    # Alone, a preempts from 5 requests and b from 4 (docstring). c streams give a ceil(c / 2) and b floor(c / 2):
    # a would reach 5 at 9 streams, b reaches 4 at 8: b first, at 8, with 4 of them.
    assert [r["prediction"]["first_preemption"] for r in fleet["replicas"]] == [5, 4]
    assert fleet["first_preemption"] == {"predicted": 8, "predicted_replica": b.url, "predicted_share": 4,
                                         "measured": 8, "measured_replica": b.url, "measured_in_flight": 4,
                                         "agrees": True}
    assert fleet["first_kv_wait"]["measured"] == 8 and fleet["first_kv_wait"]["measured_replica"] == b.url
    assert (s["predicted_first_preemption"], s["measured_first_preemption"]) == (8, 8)
    assert s["measured"]["agrees_with_prediction"] == {"first_kv_wait": True, "first_preemption": True}
    by_c = {p["concurrency"]: p for p in s["points"]}
    # least outstanding: the client never holds more than ceil(c / 2) at one replica, the first listed the extra one
    assert {c: [r["peak_in_flight"] for r in p["replicas"]] for c, p in by_c.items()} == \
        {6: [3, 3], 7: [4, 3], 8: [4, 4]}
    assert [by_c[c]["preempted"] for c in (6, 7, 8)] == [False, False, True]
    assert by_c[8]["wait_evidence"] == [f"preemptions ({b.url})", f"waiting gauge ({b.url})"]
    for p in s["points"]:
        mine = [r["server"] for r in p["replicas"]]
        # each replica's figures are its own /metrics': 64 prompt tokens a request the client sent it
        assert [m["prompt_tokens"] for m in mine] == [64 * r["requests"] for r in p["replicas"]]
        assert sum(r["requests"] for r in p["replicas"]) == p["requests"] == 3 * p["concurrency"]
        assert p["server"]["prompt_tokens"] == 64 * p["requests"]  # the fleet's: summed
    # what each stand-in counted itself (the warm-up's 7 streams, 4 on a and 3 on b, preempt nowhere)
    assert fake_preemptions == (0, sum(p["replicas"][1]["server"]["preemptions"] for p in s["points"]))
    assert fake_preemptions[1] > 0
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert {r["replica"] for r in rows} == {0, 1}
    points = [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]
    assert [len(p["replicas"]) for p in points] == [2, 2, 2]
    # the terminal and report.md show each replica
    assert f"replica 2: {b.url} (13 blocks of 32; alone it waits for KV at 4, preempts at 4)" in proc.stdout
    assert f"first preemption: predicted 8 streams, replica {b.url} first (4 of them on it); measured 8, replica " \
           f"{b.url} (4 in flight on it); agrees" in proc.stdout
    report = (run / "report.md").read_text()
    assert "## Replicas" in report and f"| 2 | {b.url} | {b.url} | 13 blocks of 32;" in report
    assert "| 8 | 2 | 12 | 4 | KV (KV) |" in report  # load 8, replica 2: 12 requests, 4 at once
    # llm-d-benchmark's report: still valid, the engine's replicas counted, each replica's figures kept
    reports = assert_valid_llmd_reports(run)
    last = reports[max(reports)]
    assert last["scenario"]["stack"][0]["standardized"]["replicas"] == 2
    assert [r["name"] for r in last["results"]["observability"]["kvplan"]["replicas"]] == [a.url, b.url]


def test_round_robin_sends_each_replica_every_other_request(tmp_path):
    with PoolReplica(17) as a, PoolReplica(17) as b:
        _bench(tmp_path, "--url", a.url, "--url", b.url, "--sweep", "3,4", "--requests-per-stream", "3",
               "--no-warmup", *WORKLOAD)
        served = (a.behaviour.requests, b.behaviour.requests)
    s = json.loads((_run_dir(tmp_path) / "summary.json").read_text())
    assert s["fleet"]["route"] == "round-robin"
    # 9 requests at c=3: 5 and 4; 12 at c=4: 6 and 6; whatever each replica held meanwhile
    assert [[r["requests"] for r in p["replicas"]] for p in s["points"]] == [[5, 4], [6, 6]]
    assert served == (11, 10)
    # equal pools: the first listed is predicted to preempt first, at 2 x (5 - 1) + 1 = 9 streams
    assert (s["fleet"]["first_preemption"]["predicted"], s["fleet"]["first_preemption"]["predicted_replica"]) == (9, a.url)
    assert "round robin sends each replica every N-th request" in s["fleet"]["prediction_basis"]


def test_behind_a_gateway_each_replica_is_read_where_metrics_url_says(tmp_path):
    """The stand-in ``a`` plays the gateway too (every request goes to it); b gets none: its figures say so."""
    with PoolReplica(17) as a, PoolReplica(13) as b:
        _bench(tmp_path, "--url", a.url, "--metrics-url", a.url + "/metrics", "--metrics-url", b.url, "--sweep", "2",
               "--requests-per-stream", "2", "--no-warmup", *WORKLOAD)
    s = json.loads((_run_dir(tmp_path) / "summary.json").read_text())
    assert s["fleet"]["route"] == "gateway" and s["fleet"]["gateway"] == a.url
    (p,) = s["points"]
    assert [r["requests"] for r in p["replicas"]] == [None, None]  # the gateway's split: not the client's to know
    assert [r["server"]["prompt_tokens"] for r in p["replicas"]] == [64 * 4, 0]
    assert "as if the gateway split the load that way" in s["fleet"]["prediction_basis"]


def test_a_replica_that_dies_mid_point_fails_the_point_naming_it(tmp_path):
    """The second replica is a stand-in engine process (tests/helpers/fake_server.py), SIGKILLed by its PID once its
    /metrics show a request running: its streams break and nothing listens there any more."""
    import os
    import signal
    import sys
    import urllib.request

    from helpers.bench import wait_for

    from kvplan.bench.engine import free_port

    port = free_port()
    helper = Path(__file__).resolve().parents[1] / "helpers" / "fake_server.py"
    victim = subprocess.Popen([sys.executable, str(helper), "--model", "fake", "--port", str(port), "--token-gap",
                               "0.02"], stdout=subprocess.PIPE, text=True)
    url_b = f"http://127.0.0.1:{port}"

    def running() -> bool:
        try:
            text = urllib.request.urlopen(url_b + "/metrics", timeout=2).read().decode()
        except OSError:
            return False
        return any(line.startswith("vllm:num_requests_running") and not line.endswith(" 0.0")
                   for line in text.splitlines())

    try:
        assert any("listening" in victim.stdout.readline() for _ in range(2))  # its args, then its URL
        with PoolReplica(17, token_gap_s=0.02) as a:
            kvplan = subprocess.Popen(kvplan_cmd("--url", a.url, "--url", url_b, "--sweep", "2", "--requests-per-stream",
                                                 "2", "--no-warmup", *WORKLOAD, "--out", str(tmp_path)),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=bench_env())
            assert wait_for(running, 60, step_s=0.02)
            os.kill(victim.pid, signal.SIGKILL)
            out, err = kvplan.communicate(timeout=120)
    finally:
        victim.kill()
        victim.wait(10)
    assert kvplan.returncode == 4 and "Traceback" not in err, err
    assert f"replica {url_b} went away" in err
    (point,) = [json.loads(line) for line in (_run_dir(tmp_path) / "points.jsonl").read_text().splitlines()]
    assert point["status"] == "failed" and f"replica {url_b} went away" in point["error"]
    dead = point["replicas"][1]
    assert dead["label"] == "failed" and dead["server"].get("incomplete") is True  # up to its last scrape


def test_credentials_in_replica_urls_go_to_their_replica_and_never_to_disk(tmp_path):
    with PoolReplica(17) as a, PoolReplica(17) as b:
        url_a = a.url.replace("http://", "http://alice:s3cret-aaa@")
        url_b = b.url.replace("http://", "http://bob:s3cret-bbb@")
        proc = _bench(tmp_path, "--url", url_a, "--url", url_b, "--sweep", "1", "--requests-per-stream", "2",
                      "--no-warmup", *WORKLOAD, "--json")
        basic = {srv: {h.get("Authorization") for path, h in srv.behaviour.seen if path == "/v1/completions"}
                 for srv in (a, b)}
    assert basic[a] == {"Basic " + base64.b64encode(b"alice:s3cret-aaa").decode()}
    assert basic[b] == {"Basic " + base64.b64encode(b"bob:s3cret-bbb").decode()}
    assert "s3cret" not in proc.stdout + proc.stderr
    for f in _run_dir(tmp_path).rglob("*"):
        if f.is_file():
            assert b"s3cret" not in f.read_bytes(), f


@pytest.mark.parametrize(("urls", "metrics", "route", "says"), [
    (["http://127.0.0.1:9", "http://127.0.0.1:9/"], [], None, "the same server as"),
    (["http://127.0.0.1:9", "http://LOCALHOST:80", "http://localhost/"], [], None, "the same server as"),
    (["http://127.0.0.1:9", "http://127.0.0.1:10"], [], "random", "invalid --route"),
    (["http://127.0.0.1:9"], [], "round-robin", "--route spreads requests over several --url"),
    (["http://127.0.0.1:9"], ["http://127.0.0.1:11"], "least-outstanding", "behind a gateway, the gateway chooses"),
    (["http://127.0.0.1:9", "http://127.0.0.1:10"], ["http://127.0.0.1:11"], None, "2 --url and 1 --metrics-url"),
    ([], ["http://127.0.0.1:11"], None, "give the gateway's --url too"),
    (["http://127.0.0.1:9"], ["http://127.0.0.1:11/metrics", "http://127.0.0.1:11"], None, "the same server as"),
    (["http://127.0.0.1:9", "ftp://127.0.0.1:10"], [], None, "invalid --url"),
    ([f"http://127.0.0.1:{port}" for port in range(1000, 1065)], [], None, "at most 64 replicas"),
])
def test_refused_fleet_options(urls, metrics, route, says):
    with pytest.raises(KvplanError, match=re.escape(says)):
        fleet_config(urls, metrics, route)


def test_a_refused_fleet_is_one_line_before_any_run_folder(tmp_path):
    proc = _bench(tmp_path, "--url", "http://u:hunter2-pw@127.0.0.1:9", "--url", "http://127.0.0.1:9", code=2,
                  timeout=30)
    assert "the same server as" in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
    assert "hunter2" not in proc.stderr  # shown as http://***@127.0.0.1:9
    assert not list(tmp_path.iterdir())


def test_traffic_replay_is_refused_over_several_replicas(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_tokens": 8, "output_tokens": 2}\n')
    with PoolReplica(17) as a, PoolReplica(17) as b:
        proc = _bench(tmp_path / "out", "--url", a.url, "--url", b.url, "--traffic", str(trace), code=2)
    assert "--traffic replays sessions on one server" in proc.stderr


def test_a_replica_serving_another_model_is_refused(tmp_path):
    with PoolReplica(17) as a, PoolReplica(17, model_id="other-model") as b:
        proc = _bench(tmp_path, "--url", a.url, "--url", b.url, "--sweep", "1", "--no-warmup", *WORKLOAD, code=2)
        assert f"replica {b.url} serves other-model, not 'fake'" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2
        assert b.behaviour.requests == 0 and a.behaviour.requests == 0  # refused before any load
    # behind a gateway: the replica's /metrics name the model it serves
    with PoolReplica(17) as gw, PoolReplica(17, model_id="other-model") as b:
        proc = _bench(tmp_path, "--url", gw.url, "--metrics-url", b.url, "--sweep", "1", "--no-warmup", *WORKLOAD,
                      code=2)
        assert f"replica {b.url}'s /metrics are for other-model, not 'fake'" in proc.stderr


def test_resuming_a_fleet_run_whose_urls_held_credentials_asks_for_them():
    cfg = BenchConfig(url="http://***@h:1", fleet=FleetConfig(urls=["http://***@h:1", "http://h:2"]))
    with pytest.raises(KvplanError, match="restate every replica"):
        resumed_fleet(cfg, [], [], None, "RUN")
    with pytest.raises(KvplanError, match="it measured 2 replicas"):
        resumed_fleet(cfg, ["http://h:1", "http://h:2", "http://h:3"], [], None, "RUN")
    again = resumed_fleet(cfg, ["http://u:p@h:1", "http://h:2"], [], None, "RUN")
    assert again.fleet.urls == ["http://u:p@h:1", "http://h:2"] and again.url == "http://u:p@h:1"
    one = BenchConfig(url="http://h:1")
    with pytest.raises(KvplanError, match="it measured one server"):
        resumed_fleet(one, ["http://h:1", "http://h:2"], [], None, "RUN")
    assert "fleet" not in one.model_dump(mode="json")  # a run of one server stores the config it always stored


def test_prometheus_and_several_replicas_are_refused_together():
    from kvplan.bench.config import PrometheusConfig

    fleet = FleetConfig(urls=["http://h:1", "http://h:2"])
    with pytest.raises(KvplanError, match="--prometheus reads one server's figures"):
        BenchConfig(url="http://h:1", fleet=fleet, prometheus=PrometheusConfig(url="http://prom:9090"))
