"""Two replicas on loopback (`kvplan bench --url A --url B`): ONE real vLLM CPU engine (the session's
``pinned_cpu_engine``: the tiny model, 17 blocks of 32) and one stand-in replica (tests/helpers/fleet.py: a loopback
HTTP server streaming completions, serving vLLM 0.32's recorded /metrics text moved by its own requests through a
33-block pool). The issue asks for two replicas; CI's time holds one CPU engine, not two, so the second is the stand-in.

By hand: prompt 64 + output 64 in blocks of 32 peak at ceil(127 / 32) = 4 blocks. The engine's 16 usable blocks hold
4 such requests, so alone it waits for KV and preempts from 5 (tests/bench/test_bench_engine.py measures that); the
stand-in's 32 usable blocks hold 8, so it would from 9. Least outstanding gives the first --url ceil(c / 2) of c
streams: the engine reaches 5 at 2 x (5 - 1) + 1 = 9 streams, the stand-in 9 at 2 x (9 - 1) + 2 = 18. So at 8 streams
(4 + 4) neither replica waits, and at 9 (5 + 4) the engine preempts, first, while the stand-in does not."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.bench import TINY_MODEL, bench_env, engine_required, kvplan_cmd
from helpers.fleet import PoolReplica

pytestmark = [pytest.mark.engine, engine_required]


def test_the_engine_replica_is_the_first_to_preempt_at_the_predicted_load(cpu_engine, tmp_path):
    engine = cpu_engine.cfg.base_url
    with PoolReplica(33, model_id=str(TINY_MODEL), token_gap_s=0.01) as stand_in:
        proc = subprocess.run(kvplan_cmd("--url", engine, "--url", stand_in.url, "--route", "least-outstanding",
                                         "--sweep", "8,9", "--duration", "6s", "--prompt", "64", "--output", "64",
                                         "--scrape-interval", "0.05", "--out", str(tmp_path), "--json"),
                              capture_output=True, text=True, timeout=300, env=bench_env())
        stand_in_preemptions = stand_in.preemptions
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    fleet = s["fleet"]
    # each replica's pool, read back from its own /metrics
    assert [(r["capacity"]["num_blocks"], r["capacity"]["block_size"]) for r in fleet["replicas"]] == [(17, 32), (33, 32)]
    assert [r["prediction"]["first_preemption"] for r in fleet["replicas"]] == [5, 9]
    assert fleet["first_preemption"] == {"predicted": 9, "predicted_replica": engine, "predicted_share": 5,
                                         "measured": 9, "measured_replica": engine, "measured_in_flight": 5,
                                         "agrees": True}
    assert fleet["first_kv_wait"]["measured"] == 9 and fleet["first_kv_wait"]["measured_replica"] == engine
    assert s["measured"]["agrees_with_prediction"] == {"first_kv_wait": True, "first_preemption": True}
    by_c = {p["concurrency"]: p for p in s["points"]}
    assert all(p["status"] == "ok" for p in s["points"])
    assert {c: [r["peak_in_flight"] for r in p["replicas"]] for c, p in by_c.items()} == {8: [4, 4], 9: [5, 4]}
    eng8, eng9 = by_c[8]["replicas"][0], by_c[9]["replicas"][0]
    assert eng8["server"]["preemptions"] == 0 and eng9["server"]["preemptions"] > 0  # the engine's own counter
    assert [r["preempted"] for r in by_c[9]["replicas"]] == [True, False] and stand_in_preemptions == 0
    for p in s["points"]:  # each replica's figures from its own /metrics: 64 prompt tokens a request sent to it
        assert [r["server"]["prompt_tokens"] for r in p["replicas"]] == [64 * r["requests"] for r in p["replicas"]]
