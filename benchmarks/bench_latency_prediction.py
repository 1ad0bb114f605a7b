"""Issue 10's latency goal, measured: calibrate on one workload, predict another, and compare the
prediction error with how much the engine disagrees with ITSELF on the same workload.

Runs `kvplan bench` (closed loop) on a server: the calibration workload once, `kvplan calibrate
--bench` on it, then the predicted workload ``--repeats`` times. For every load below saturation (no
KV wait, no preemption) it prints the predicted TTFT p50 / p99 and output tokens/s (the simulator
replaying the point's own requests with the calibrated step-time model) next to each repeat's
measurement, the error of each, and the spread between the repeats themselves (max / min - 1 of the
measurements at one load): a prediction cannot be judged closer than the engine repeats itself.

Goal (issue 10): TTFT p50 and output tokens/s within 20% (TTFT p99 within 35%) at every load.

Without --url it launches a CPU engine (the tests' tiny model unless --model; 17 blocks of 32 tokens,
context 512) with kvplan's EngineLauncher and stops it by PID at the end. The tiny model decodes a step in
3-5 ms and answers in 20-45 ms, so the API server's jitter decides its latency; --compute-bound serves the
engine test's compute-bound model (tests/helpers/bench.py: a config-only folder, dummy weights),
whose figures the README quotes:

    python benchmarks/bench_latency_prediction.py [--url URL] [--calibrate 64x64[/lognormal]:1,2,3,4]
        [--predict 128x32[/lognormal][+SHARED]:1,2,3 ...] [--repeats 2] [--per-stream 20] [--model DIR]
        [--load-format dummy] [--compute-bound] [--from DIR] [--probe WORKLOAD] [--prompt-sweep COUNT:MAX|off]

    python benchmarks/bench_latency_prediction.py --compute-bound --calibrate 64x64/lognormal:1,2,3,4 \
        --predict 32x96/lognormal:1,2,3,4 --predict 256x16/lognormal:1,2,3 \
        --predict 256x32/lognormal+75%:1,2,3 --repeats 2

``--predict`` may be given several times (one engine, one calibration, every workload). ``+SHARED`` is
`kvplan bench --shared-prefix` (tokens of a fixed prompt, or a share of each prompt: ``+75%``): a reuse
workload, served with prefix caching (vLLM V1's default, which the launched engine keeps). Loads where the
engine waited for KV blocks or preempted are printed too, marked ``sat`` (the goal of issue 23 covers
them). A load where more than 5% of the requests got their first token in one chunk with later ones gets a note
line under its table: the client or the API server fell behind the engine there (a loaded host), and its TTFT
measures that; so does a load whose slowest TTFT was such a request (`stalled_slowest`: its p99 is that stall).
Under each table, for runs that recorded the engine's own TTFT split (`server_queue_mean_s`,
`server_prefill_mean_s`), the first run's mean TTFT at each load measured as client + API server + queue + prefill
and predicted as request overhead + wait + prefill (`ttft_split`). ``--from DIR`` re-evaluates the runs of an
earlier invocation (its printed folder) offline: the same measurements, calibrated and predicted again with the
current model. Before every run it measures the engine's speed the same way (`speed_probe`, stored in the run
folder) and prints under each table how far each run's engine was from the calibration's: a calibration made in a
slow minute of this shared machine prices every later run too high, which the table alone cannot tell from the
model's error.

Before the tables it prints the engine's own price of a prompt token (at one stream TTFT is a line in the prompt
length; Theil-Sen with Sen's 95% interval over the 1-stream requests of every workload without a shared prefix, and
the prompt sweep) next to what the calibration's requests alone show and what the calibrated model charges: a 64 + 64
calibration's prompts span too little to price a token (three calibrations on the CPU engine: 0.046, 0.055 and 0.202
ms a token against the engine's 0.108-0.136; their own 1-stream requests alone gave -0.133 to +0.284, 95% ranges of
0.03-0.65, -0.52-0.34 and -0.91-0.19), and that price, not the schedule, made the decode-heavy and the reuse misses
(tests/vllm_facing/test_scheduler_parity.py: vLLM's Scheduler gives the simulator's schedule step for step). So the
calibration run is benched with ``--prompt-sweep`` (default 16:510: one stream, 16 prompt lengths up to the context,
recorded in the run folder and fitted by `kvplan calibrate`; ``--prompt-sweep off`` for none). A predicted workload
whose prompts leave the lengths the calibration saw gets one note line. ``--probe WORKLOAD`` adds the 1-stream
requests of that predicted workload's first run to the calibration the way a sweep's are (offline, for runs made
without a sweep); the other workloads stay held out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL = {"ttft_p50": 0.20, "ttft_p99": 0.35, "tok_s": 0.20}


def workload(text: str) -> tuple[list[str], str]:
    """'64x64:1,2,3,4' -> (bench flags, sweep); '128x32/lognormal:1,2,3' draws the lengths (kvplan bench --dist);
    '256x32+192:1,2' or '256x32/lognormal+75%:1,2' shares a prefix (kvplan bench --shared-prefix)."""
    lengths, sweep = text.split(":")
    lengths, _, shared = lengths.partition("+")
    lengths, _, dist = lengths.partition("/")
    prompt, output = lengths.split("x")
    return ["--prompt", prompt, "--output", output, *(["--dist", dist] if dist else []),
            *(["--shared-prefix", shared] if shared else [])], sweep


def warm_up(url: str, max_tokens: int = 510) -> None:
    """One request of every prompt length from 1 to ``max_tokens`` (one output token each, random token ids, so no
    prefix-cache hit shortens a step): the CPU engine's kernels are set up for each new batch shape the first time
    it runs, and a cold engine's first runs of new prompt lengths were ~25% slower at TTFT p50 than a repeat of
    the same run (256 + 16 tokens: 49 ms, then 38 ms), which a calibration on a cold engine then bakes in."""
    import random

    complete = completer(url)
    rng = random.Random(0)
    for n in range(1, max_tokens + 1):
        complete([rng.randrange(10, 1000) for _ in range(n)], 1)


def completer(url: str):
    """``complete(token_ids, max_tokens)``: one completion of the server's first model on ``url``, waited for whole;
    returns its seconds. (Callers send random ids in 10-999, so that no block of one prompt is cached from another.)"""
    import time
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=60) as resp:
        served = json.loads(resp.read())["data"][0]["id"]

    def complete(ids: list[int], max_tokens: int) -> float:
        body = json.dumps({"model": served, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
        start = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
        return time.perf_counter() - start

    return complete


#: The speed probe's prompt lengths (tokens; the launched engine's context is 512) and the output tokens of its
#: decode request: (its time - the 1-token request's) / (SPEED_PROBE_OUTPUT - 1) is one decode step at that context.
SPEED_PROBE_LENGTHS = (32, 128, 256, 448)
SPEED_PROBE_OUTPUT = 17
SPEED_PROBE_FILE = "speed_probe.json"


def speed_probe(url: str, lengths: tuple[int, ...] = SPEED_PROBE_LENGTHS, output: int = SPEED_PROBE_OUTPUT) -> list[dict]:
    """The engine's speed just before a run, measured the same way before every run: per prompt length (``lengths``), a
    1-token request sent twice (the second timed: a CPU engine runs a new batch shape slower the first time) and an
    ``output``-token one, each on fresh random token ids (no prefix-cache hit). Why:
    this 2-core machine's speed drifts by 20-30% from minute to minute, and a calibration measured in a slow minute
    prices every later run too high; the probe tells that drift apart from the model's error (`speed_drift`).
    The run's own warm-up comes after it, so the prefix cache the run's points see is the one they would without."""
    import random

    complete = completer(url)
    rng = random.Random()  # (fresh ids each probe: no block of one is cached from another)

    def timed(n: int, max_tokens: int) -> float:
        return complete([rng.randrange(10, 1000) for _ in range(n)], max_tokens)

    rows = []
    for n in lengths:
        timed(n, 1)
        one = timed(n, 1)
        rows.append({"prompt_tokens": n, "one_token_request_s": one,
                     "decode_step_s": (timed(n, output) - one) / (output - 1)})
    return rows


def probe_drift(calib: list[dict], this: list[dict]) -> tuple[float, float] | None:
    """(1-token request, decode step) time of the probe ``this`` relative to the calibration's ``calib`` (`speed_probe`'s
    rows), each the median over the probe's lengths of this / calibration - 1 (negative: the engine ran faster than when
    calibrated). None when the two probed different lengths."""
    from statistics import median

    by_length = [{row["prompt_tokens"]: row for row in rows} for rows in (calib, this)]
    if not calib or set(by_length[0]) != set(by_length[1]):
        return None
    return tuple(median(by_length[1][n][k] / by_length[0][n][k] - 1 for n in by_length[0])
                 for k in ("one_token_request_s", "decode_step_s"))


def speed_drift(calib_run: Path, run: Path) -> tuple[float, float] | None:
    """`probe_drift` of ``run``'s stored speed probe against the calibration run's; None when either run has no probe
    (runs made before it)."""
    files = [r / SPEED_PROBE_FILE for r in (calib_run, run)]
    if not all(f.is_file() for f in files):
        return None
    return probe_drift(*(json.loads(f.read_text()) for f in files))


def bench(url: str, out: Path, flags: list[str], sweep: str, per_stream: int) -> Path:
    probe = speed_probe(url)
    proc = subprocess.run([sys.executable, "-m", "kvplan", "bench", "--url", url, "--out", str(out), "--json",
                           "--sweep", sweep, "--requests-per-stream", str(per_stream), *flags],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"kvplan bench failed: {proc.stderr[-2000:]}")
    run = Path(json.loads(proc.stdout)["run_dir"])
    (run / SPEED_PROBE_FILE).write_text(json.dumps(probe, indent=1) + "\n")
    return run


def measured_vs_predicted(run: Path, model, per_stream: int) -> dict[int, dict]:
    """Per load of ``run``: (predicted, measured) TTFT p50 / p99 and tokens/s, and whether the engine or the
    simulation waited for KV blocks or preempted (``saturated``: measured, ``predicted_saturated``)."""
    from kvplan.bench.latency import warm_up_pool
    from kvplan.bench.steptime_io import run_inputs
    from kvplan.plan.simulate import closed_loop
    from kvplan.plan.steptime import predict_latency

    cfg, points, lengths, sched, _, _, _ = run_inputs(run)
    shared = float((cfg.get("workload") or {}).get("shared_prefix") or 0.0)
    rows = {}
    # Each point on the pool bench's warm-up and the earlier points left, as the engine's (kvplan.bench.latency).
    pool = warm_up_pool(sched, lengths, points[0]["first_index"], shared) if points and sched.prefix_caching else None
    for p in points:
        if p["status"] != "ok":
            continue
        pred = predict_latency(sched, closed_loop(p["concurrency"], lengths, per_stream, p["first_index"],
                                                  shared_prefix=shared), model, start=pool, mean=True)
        pool = pred.pool_after if pool is not None else None
        rows[p["concurrency"]] = {"ttft_p50": (pred.ttft["p50"], p["ttft"]["p50"]),
                                  "ttft_p99": (pred.ttft["p99"], p["ttft"]["p99"]),
                                  "tok_s": (pred.output_tokens_per_s, p["throughput_tok_s"]),
                                  "saturated": bool(p["waited_for_kv"] or p["preempted"]),
                                  "predicted_saturated": bool(pred.waited_for_kv or pred.preemptions),
                                  "split": ttft_split(p, pred)}
    return rows


def ttft_split(point: dict, pred) -> dict[str, float | None] | None:
    """Where a load's mean TTFT went (seconds), measured and predicted. Measured, from the engine's own histograms
    (`server_queue_mean_s`, `server_prefill_mean_s`; None on runs made before they were recorded): the client's
    share (its TTFT less the server's), the API server's and the trip to the engine core (which holds the wait for
    the step in progress: vLLM queues a request as its next step is scheduled), the scheduler's queue (KV waits),
    and first scheduled to first token. Predicted: the request overhead, the wait before the first scheduled step
    (the step in progress, KV), and the steps to the first token."""
    srv = point.get("server") or {}
    server, queue, prefill = (srv.get(k) for k in ("server_ttft_mean_s", "server_queue_mean_s", "server_prefill_mean_s"))
    if server is None or queue is None or prefill is None:
        return None
    wait = pred.queueing.get("mean") or 0.0
    return {"client": point["ttft"]["mean"] - server, "api": server - queue - prefill, "queue": queue,
            "prefill": prefill, "pred_overhead": pred.request_overhead_s, "pred_wait": wait,
            "pred_prefill": pred.ttft["mean"] - pred.request_overhead_s - wait}


#: A load whose requests more often than this got their first token in one chunk with later ones: the client or the
#: API server fell behind the engine (2 cores shared with other work), and its TTFT measures their delay.
LATE_SHARE = 0.05


def late_first_tokens(run: Path) -> dict[int, tuple[int, int]]:
    """Per load of ``run``: (requests whose first streamed chunk carried more than one token, requests). On an idle
    machine 0-1 of 20-80 requests a load did; on a loaded one 9-31 of 20-60 (a reuse workload's six loads), and the
    TTFT p50 of that 256 + 32 reuse workload at 1 stream read 244 ms where an idle repeat read 44."""
    from kvplan.bench.store import RunStore

    out: dict[int, tuple[int, int]] = {}
    for r in RunStore.open_existing(run).read_requests():
        if r.get("ok") and isinstance(r.get("concurrency"), int):
            late, total = out.get(r["concurrency"], (0, 0))
            out[r["concurrency"]] = (late + ((r.get("chunk_tokens") or [1])[0] > 1), total + 1)
    return out


def stalled_slowest(run: Path) -> dict[int, tuple[float, int]]:
    """Per load of ``run`` whose slowest TTFT came with more than one token in its first streamed chunk: (that TTFT
    in seconds, those tokens). With 60 requests a stream a load's p99 is its slowest request or two, so such a load's
    p99 measures a delivery stall (the client or the API server behind the engine), not the engine's steps: one
    request of 60 at 1 stream (kvplan-latency-7ha_5t70, the reuse workload) came at 205 ms with 20 tokens, where the
    others took 25-75 ms, and a load's share of such requests (`late_first_tokens`) stayed under LATE_SHARE."""
    from kvplan.bench.store import RunStore

    slowest: dict[int, tuple[float, int]] = {}
    for r in RunStore.open_existing(run).read_requests():
        if r.get("ok") and isinstance(r.get("concurrency"), int) and r.get("first_token_s") is not None:
            ttft = r["first_token_s"] - r["scheduled_s"]
            if ttft > slowest.get(r["concurrency"], (-1.0, 0))[0]:
                slowest[r["concurrency"]] = (ttft, (r.get("chunk_tokens") or [1])[0])
    return {c: v for c, v in slowest.items() if v[1] > 1}


def one_stream_requests(run: Path) -> list[tuple[int, float]]:
    """(prompt tokens, TTFT s) of the requests of ``run``'s 1-stream points: each met an idle engine."""
    from kvplan.bench.store import RunStore

    store = RunStore.open_existing(run)
    seqs = {p["seq"] for p in store.read_points() if p["concurrency"] == 1 and p["status"] == "ok"}
    return [(r["prompt_tokens"], r["first_token_s"] - r["scheduled_s"]) for r in store.read_requests()
            if r.get("ok") and r.get("seq") in seqs and r.get("first_token_s") is not None]


def calibrate_with_probe(calib_run: Path, probe_run: Path, per_stream: int):
    """(model, single requests): `calibrate_bench` on the calibration run (its own --prompt-sweep too, when it has
    one) plus the 1-stream requests of ``probe_run`` (a workload of other prompt lengths) as single requests, the
    rows a prompt sweep gives: they price a prompt token, which a calibration's own narrow spread of lengths leaves
    uncertain by a factor of two or more."""
    from kvplan.bench.prompt_sweep import read_prompt_sweep
    from kvplan.bench.steptime_io import request_ttfts, run_inputs
    from kvplan.plan.steptime import calibrate_bench

    _, points, lengths, sched, base, _, _ = run_inputs(calib_run)
    sweep = read_prompt_sweep(calib_run)
    singles = (sweep.points() if sweep is not None else []) + one_stream_requests(probe_run)
    return calibrate_bench(points, lengths, sched, base, per_stream, 0.0, request_ttfts(calib_run), singles,
                           sweep.decode_steps() if sweep is not None else ()), singles


def prompt_token_price(runs: list[Path], model, chunk_tokens: int) -> str:
    """The engine's own price of a prompt token next to the calibration's: at one stream the engine is idle when a
    request comes, so its TTFT is its time outside the steps plus one prefill step of its prompt, a line in the prompt
    length. Fitted (kvplan.plan.steptime.prompt_token_price: Theil-Sen, Sen's 95% interval) over the 1-stream
    requests of the given runs (every workload without a shared prefix: their whole prompt is computed) and their
    prompt sweeps, and of the calibration's alone."""
    from kvplan.bench.prompt_sweep import read_prompt_sweep
    from kvplan.plan.steptime import prompt_token_price as price_of

    def requests(run: Path) -> list[tuple[int, float]]:
        sweep = read_prompt_sweep(run)
        return one_stream_requests(run) + (sweep.points() if sweep is not None else [])

    every = price_of([pt for run in runs for pt in requests(run)], model, chunk_tokens)
    calib = price_of(requests(runs[0]), model, chunk_tokens)
    if every is None or calib is None:
        return "one stream: too few prompt lengths to price a prompt token"

    def shown(p) -> str:
        return (f"{p.intercept_ms:.1f} ms + {p.data_ms:.3f} ms a token (95% {p.data_low_ms:.3f}-{p.data_high_ms:.3f}) "
                f"over {p.requests} requests of {p.prompt_min}-{p.prompt_max} tokens")

    return (f"one stream, TTFT against prompt tokens (Theil-Sen, Sen's interval): the engine {shown(every)}; the "
            f"calibration's own requests alone {shown(calib)}; the calibrated model {every.model_ms:.3f} ms a token "
            f"over {every.prompt_min}-{every.prompt_max}")


def prompt_note(name: str, runs: list[Path], seen: tuple[int, int] | None) -> str | None:
    """The calibration's note when ``runs`` (one predicted workload) sent prompts outside the lengths it saw."""
    from kvplan.bench.steptime_io import run_inputs, workload_prompt_range
    from kvplan.plan.steptime import prompt_range_note

    ranges = []
    for run in runs:
        _, points, lengths, _, _, _, _ = run_inputs(run)
        ranges += [workload_prompt_range(lengths, p["first_index"], p["requests"]) for p in points
                   if p["status"] == "ok" and p["requests"]]
    if not ranges:
        return None
    note = prompt_range_note(seen, (min(lo for lo, _ in ranges), max(hi for _, hi in ranges)))
    return None if note is None else f"note ({name}): {note}"


def report(name: str, repeats: list[dict[int, dict]], per_stream: int, where: Path,
           late: list[dict[int, tuple[int, int]]] = (), drift: list[tuple[float, float] | None] = (),
           stalls: list[dict[int, tuple[float, int]]] = ()) -> bool:
    """Print one predicted workload's table; True when it meets the goal at every load and run. ``late``: each run's
    `late_first_tokens`, a note line under the table for a load where delivery fell behind; ``stalls``: each run's
    `stalled_slowest`, a note line for a load whose slowest TTFT was such a request. ``drift``: each run's
    `speed_drift` (the verdict does not use it: it says how far the engine itself moved from its calibration)."""
    print(f"\npredicted {name}, {len(repeats)} runs, {per_stream} requests per stream (runs in {where})")
    print(f"{'c':>3} {'sat':<5} {'metric':<9} {'predicted':>10} {'measured (each run)':<28} {'errors':<22} "
          f"{'run spread':>10}")
    met = True
    for c in sorted(set().union(*repeats)):
        rows = [r[c] for r in repeats if c in r]
        # sat: M measured (any run), P predicted: the engine / the simulation waited for KV or preempted
        sat = ("M" if any(r["saturated"] for r in rows) else "") + ("P" if rows[0]["predicted_saturated"] else "")
        for metric, scale in (("ttft_p50", 1000), ("ttft_p99", 1000), ("tok_s", 1)):
            runs = [r[metric] for r in rows]
            predicted = runs[0][0]
            measured = [m for _, m in runs]
            errors = [predicted / m - 1 for m in measured]
            spread = max(measured) / min(measured) - 1
            met &= all(abs(e) <= GOAL[metric] for e in errors)
            print(f"{c:>3} {sat or '-':<5} {metric:<9} {predicted * scale:>10.1f} "
                  f"{' '.join(f'{m * scale:.1f}' for m in measured):<28} "
                  f"{' '.join(f'{e:+.0%}' for e in errors):<22} {spread:>10.0%}")
    split = repeats[0]
    if all(r.get("split") for r in split.values()):
        print("  where the mean TTFT went, run 1 (ms): measured client + API server + queue + prefill | predicted "
              "request overhead + wait + prefill")
        for c in sorted(split):
            m = {k: v * 1000 for k, v in split[c]["split"].items()}
            print(f"  {c:>3}  {m['client']:5.1f} + {m['api']:5.1f} + {m['queue']:6.1f} + {m['prefill']:6.1f}  |  "
                  f"{m['pred_overhead']:5.1f} + {m['pred_wait']:6.1f} + {m['pred_prefill']:6.1f}")
    for k, run in enumerate(late, 1):
        behind = [f"{c} stream{'s' * (c > 1)} {n}/{total}" for c, (n, total) in sorted(run.items()) if n > LATE_SHARE * total]
        if behind:
            print(f"  run {k}: first token in one chunk with later ones ({', '.join(behind)}): the client or the API "
                  f"server fell behind the engine there; its TTFT measures that")
    for k, run in enumerate(stalls, 1):
        for c, (ttft, tokens) in sorted(run.items()):
            print(f"  run {k}, {c} stream{'s' * (c > 1)}: its slowest TTFT ({ttft * 1000:.0f} ms) came with {tokens} tokens "
                  f"in its first delivery: that load's TTFT p99 measures a stall behind the engine, not its steps")
    if drift and all(drift):
        print("  the engine's speed before each run against its calibration's (speed probe, median over "
              f"{len(SPEED_PROBE_LENGTHS)} lengths; +: slower): 1-token request (mostly prefill) "
              + " ".join(f"{d[0]:+.0%}" for d in drift) + ", decode step " + " ".join(f"{d[1]:+.0%}" for d in drift))
    print(f"goal (TTFT p50 and tok/s within 20%, p99 within 35%, every load, every run): {'met' if met else 'NOT met'}")
    return met


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="attach to this server (default: launch the tests' tiny CPU engine)")
    ap.add_argument("--calibrate", default="64x64:1,2,3,4", help="PROMPTxOUTPUT:SWEEP of the calibration run")
    ap.add_argument("--predict", action="append",
                    help="PROMPTxOUTPUT[/DIST][+SHARED]:SWEEP of a predicted workload (repeatable; default 128x32:1,2,3)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each predicted workload")
    ap.add_argument("--per-stream", type=int, default=20, help="requests per stream per point")
    ap.add_argument("--model", type=Path, default=ROOT / "tests" / "fixtures" / "tiny-llama",
                    help="local model folder the launched engine serves (default: the tests' tiny model)")
    ap.add_argument("--load-format", default=None,
                    help="vLLM --load-format of the launched engine ('dummy': random weights, a config-only folder)")
    ap.add_argument("--compute-bound", action="store_true",
                    help="serve the engine test's compute-bound model (dummy weights) instead of --model")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="measure on the engine as it is (default: one request of each prompt length 1-510 first)")
    ap.add_argument("--probe", metavar="WORKLOAD",
                    help="also calibrate on the 1-stream point of this --predict workload's first run (one without a "
                         "shared prefix): prompts of other lengths price a prompt token; its own table is then no "
                         "held-out prediction")
    ap.add_argument("--prompt-sweep", default="16:510", metavar="COUNT:MAX_TOKENS",
                    help="kvplan bench --prompt-sweep of the calibration run (1-stream TTFTs of COUNT prompt lengths up "
                         "to MAX_TOKENS, fitted by kvplan calibrate); 'off': none")
    ap.add_argument("--from", dest="from_dir", type=Path,
                    help="re-evaluate an earlier invocation's runs (its folder) offline, with the current model")
    args = ap.parse_args()
    args.predict = args.predict or ["128x32:1,2,3"]

    from kvplan.bench.steptime_io import calibrate_run

    if args.from_dir:
        out = args.from_dir
        plan = json.loads((out / "plan.json").read_text())
        args.calibrate, args.predict, args.repeats = plan["calibrate"], plan["predict"], plan["repeats"]
        args.per_stream = plan["per_stream"]
        calibration = calibrate_run(Path(plan["runs"]["calibrate"]), write=False)
        runs = {name: [Path(r) for r in plan["runs"]["predict"][name]] for name in args.predict}
    else:
        out = Path(tempfile.mkdtemp(prefix="kvplan-latency-"))
        calibration, runs = measure(args, out)
    model, seen = calibration.model, calibration.prompt_range
    print(f"calibration: {calibration.prompt_sweep_requests} prompt-sweep requests; prompts of "
          f"{'-'.join(map(str, seen)) if seen else '?'} tokens")
    if args.probe:
        if args.probe not in runs or "+" in args.probe:
            sys.exit(f"--probe {args.probe}: not a --predict workload without a shared prefix of this invocation")
        model, singles = calibrate_with_probe(Path(calibration.run_dir), runs[args.probe][0], args.per_stream)
        if seen and singles:
            seen = (min(seen[0], *(n for n, _ in singles)), max(seen[1], *(n for n, _ in singles)))
        print(f"probe: the 1-stream requests of {runs[args.probe][0]} added to the calibration as single requests")
    print(f"calibrated on {args.calibrate}: {model.overhead_s * 1000:.2f} ms a step + the roofline terms, "
          f"{'the longer one' if model.overlap else 'summed'} "
          f"(efficiencies: memory {model.mem_efficiency:.4g}, compute {model.compute_efficiency:.4g}); "
          f"request overhead {model.request_overhead_s * 1000:.1f} ms + "
          f"{model.request_overhead_per_rps_s2 * 1000:.2f} ms per request/s")
    unshared = [Path(r) for name in args.predict if "+" not in name for r in runs[name]]
    print(prompt_token_price([Path(calibration.run_dir), *unshared], model, calibration.scheduler["max_num_batched_tokens"]))
    met = True
    for name in args.predict:
        note = prompt_note(name, runs[name], seen)
        if note:
            print(note)
        repeats = [measured_vs_predicted(run, model, args.per_stream) for run in runs[name]]
        met &= report(name, repeats, args.per_stream, out, [late_first_tokens(run) for run in runs[name]],
                      [speed_drift(Path(calibration.run_dir), run) for run in runs[name]],
                      [stalled_slowest(run) for run in runs[name]])
    print(f"\nevery workload: goal {'met' if met else 'NOT met'}")


def measure(args, out: Path):
    """Launch (or attach to) the engine, run the calibration and every predicted workload; write plan.json."""
    from kvplan.bench.steptime_io import calibrate_run

    if args.compute_bound:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.bench import compute_bound_model

        args.model, args.load_format = compute_bound_model(out / "compute-bound-llama"), "dummy"
    launcher = None
    url = args.url
    runs: dict[str, list[Path]] = {}
    try:
        if not url:
            from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port
            from kvplan.vllm.args import EngineArgs

            cfg = EngineConfig(model=str(args.model), port=free_port(),
                               args=EngineArgs(block_size=32, num_gpu_blocks_override=17, kv_cache_memory_bytes=64 * 2**20,
                                               max_model_len=512, enforce_eager=True),
                               env=(("HF_HUB_OFFLINE", "1"),),
                               extra_args=("--load-format", args.load_format) if args.load_format else ())
            launcher = EngineLauncher(cfg, out / "engine.log", startup_timeout_s=900)
            launcher.start()
            launcher.wait_ready()
            url = cfg.base_url
        if not args.no_warm_up:
            warm_up(url)
        flags, sweep = workload(args.calibrate)
        if args.prompt_sweep != "off":
            flags += ["--prompt-sweep", args.prompt_sweep]
        calib_run = bench(url, out / "calibrate", flags, sweep, args.per_stream)
        calibration = calibrate_run(calib_run)
        for w, name in enumerate(args.predict):
            runs[name] = [bench(url, out / f"predict{w}-{i}", *workload(name), args.per_stream)
                          for i in range(args.repeats)]
    finally:
        if launcher is not None:
            launcher.stop()
    (out / "plan.json").write_text(json.dumps({
        "calibrate": args.calibrate, "predict": args.predict, "repeats": args.repeats, "per_stream": args.per_stream,
        "runs": {"calibrate": str(calib_run), "predict": {k: [str(r) for r in v] for k, v in runs.items()}}},
        indent=2))
    return calibration, runs

if __name__ == "__main__":
    main()
