"""`kvplan fit`: the deployments (GPU x count x TP/PP/DP x KV dtype x context cap) that start and fit."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvplan.cli.common import print_json, user_errors
from kvplan.cli.tables import Column, OutputFormat, chosen_format, emit_rows, format_option
from kvplan.errors import ExitCode
from kvplan.term import esc, printable
from kvplan.units import cdiv, check_positive, format_ms, parse_tokens

FIT_EXAMPLES = """
Examples:

  kvplan fit meta-llama/Llama-3.1-70B --ctx 128k -c 16 --gpus H100

  kvplan fit Qwen/Qwen3-32B --ctx 32k -c 64 --prompt 4k --output 512 --gpus H100,H200,L40S

  kvplan fit meta-llama/Llama-3.1-8B --ctx 32k -c 64 --price H100=2.5 --price L40S=0.9 --json

  kvplan fit meta-llama/Llama-3.1-8B --ctx 8k -c 32 --prompt 2k --output 256 --slo ttft_p99=500ms,itl_p99=50ms

  kvplan fit Qwen/Qwen3-32B --ctx 32k -c 64 --gpus H100,H200 --format csv > deployments.csv

  kvplan fit meta-llama/Llama-3.1-70B --ctx 128k -c 16 --format markdown   # a table for a PR or a wiki

  kvplan fit meta-llama/Llama-3.1-8B --ctx 8k --rate 200 --prompt 2k --output 256 --slo ttft_p99=1s --gpus H100,L40S
                                                                           # replicas for 200 requests/s
  kvplan fit meta-llama/Llama-3.1-8B --ctx 8k --rate 40 --prompt 2k --output 128 --slo ttft_p99=800ms,tpot_p99=40ms --gpus H100 --pd
                                                                           # ... and as prefill/decode pairs
  kvplan fit ./my-model --ctx 512 --rate 5 --prompt 64 --output 64 --slo ttft_p99=2s --steptime runs/cpu-engine
                                                                           # replicas of the engine a bench run measured
"""

#: Deployment shapes whose replica count a --rate search finds at most (each takes a few simulations).
MAX_FLEET_SHAPES = 12

#: Deployments simulated at most while looking for ones that meet the SLOs (each takes ~0.1-0.5 s).
MAX_SLO_SIMULATIONS = 100


#: A price per GPU-hour above this is a typo (or an attack on the cost columns: 1e308 x GPUs x hours is inf).
MAX_PRICE_PER_GPU_HOUR = 1_000_000


def _prices(pairs: list[str] | None) -> dict[str, float]:
    from kvplan.errors import KvplanError
    from kvplan.hardware.catalog import find_device

    out: dict[str, float] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        try:
            price = float(value)
            if not sep or not 0 <= price <= MAX_PRICE_PER_GPU_HOUR:  # NaN fails this too
                raise ValueError
        except ValueError:
            raise KvplanError(f"invalid --price {pair!r}", "use GPU=USD per GPU-hour, 0 to "
                              f"{MAX_PRICE_PER_GPU_HOUR:,}: --price H100=2.5") from None
        out[find_device(name).name] = price
    return out


@user_errors
def fit(
    model: str = typer.Argument(..., metavar="MODEL", help="Hub id (org/name), local folder/config.json, or bundled profile."),
    ctx: str = typer.Option(..., "--ctx", "--max-model-len", help="Context length (max_model_len): 32k, 131072.", metavar="TOKENS"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", help="Requests served at once (over all replicas).", metavar="N"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="Prompt tokens per request (default: requests fill the context).", metavar="TOKENS"),
    output: Optional[str] = typer.Option(None, "--output", help="Output tokens per request.", metavar="TOKENS"),
    shared_prefix: Optional[str] = typer.Option(None, "--shared-prefix", help="Prefix tokens all requests share.", metavar="TOKENS"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU types to consider, in order of preference: H100,H200,L40S (default: the whole catalog).", metavar="LIST"),
    max_gpus: int = typer.Option(8, "--max-gpus", help="Most GPUs in one deployment.", metavar="N"),
    price: Optional[list[str]] = typer.Option(None, "--price", help="USD per GPU-hour (repeatable): --price H100=2.5; ranks by price.", metavar="GPU=USD"),
    kv_dtypes: str = typer.Option("auto,fp8", "--kv-dtypes", help="KV cache dtypes to try.", metavar="LIST"),
    no_pp: bool = typer.Option(False, "--no-pp", help="Do not propose pipeline parallel."),
    speculative_config: Optional[str] = typer.Option(None, "--speculative-config", help="vLLM's --speculative-config JSON, as kvplan size takes it.", metavar="JSON"),
    top: int = typer.Option(5, "--top", help="How many deployments to show.", metavar="N"),
    slo: Optional[str] = typer.Option(None, "--slo", help="Keep deployments whose predicted latency meets these (as kvplan bench --slo): ttft_p99=500ms,itl_p99=50ms.", metavar="KEY=VALUE,..."),
    rate: Optional[str] = typer.Option(None, "--rate", help="Size a fleet instead: requests per second over all replicas (Poisson arrivals; needs --slo). Each deployment shape gets the fewest replicas whose simulated replica meets the SLOs at its share of the rate.", metavar="REQ/S"),
    max_replicas: int = typer.Option(256, "--max-replicas", help="With --rate: the largest fleet searched.", metavar="N"),
    pd: bool = typer.Option(False, "--pd", help="With --rate: also size each shape as prefill/decode pairs (vLLM's NixlConnector): prefill replicas simulated at the TTFT target less the KV transfer, decode replicas in their steady state at the TPOT/ITL target."),
    pd_link_gbs: Optional[float] = typer.Option(None, "--pd-link-gbs", help="With --pd: one NIC's rate in GB/s for the KV transfer (default: 50, a 400 Gb/s NIC).", metavar="GB/S"),
    steptime: Optional[str] = typer.Option(None, "--steptime", help="With --rate: size replicas of the engine a bench run measured (its pool and limits, and the step-time model calibrated on it: kvplan calibrate --bench RUN) instead of searching GPUs.", metavar="RUN"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help="Accounting rules of this vLLM release (default: newest known).", metavar="VERSION"),
    source: str = typer.Option("auto", "--source", help="auto (local, Hub, bundled), local, hub or bundled.", metavar="auto|local|hub|bundled"),
    offline: bool = typer.Option(False, "--offline", help="Do not contact the Hub."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document (same as --format json).", rich_help_panel="Output"),
    fmt: OutputFormat = format_option(),
) -> None:
    """Find the deployments of MODEL that start and fit the workload, ranked by GPU count (or price).

    Searches GPU type x count x TP/PP/DP x KV dtype x context cap and shows the best.

    --format csv or markdown prints the deployments table alone (one row per deployment, with its
    vllm serve command); json (as --json) the whole search.

    --rate sizes a fleet: replicas of one deployment (--max-gpus each) behind a router, each simulated at its
    share of the rate; ranked by the fleet's GPUs (or price), with what holds a replica back (KV pool, batch or
    compute) one replica short. --pd adds each shape as prefill/decode pairs (prefill replicas simulated at the TTFT
    target less the KV transfer; decode replicas in their steady state at the TPOT/ITL target).

    Exit code 0: something fits; 1: nothing within --max-gpus (or --max-replicas); 2: bad input; 3: internal error.
    """
    import time

    from kvplan.bench.slo import describe_slo, parse_slo
    from kvplan.deploy import load_model
    from kvplan.errors import KvplanError
    from kvplan.hardware.catalog import find_device, load_catalog
    from kvplan.plan.fit import FitRequest, latency_floor, replan, search, workload_lengths
    from kvplan.plan.overhead import load_overhead
    from kvplan.plan.size import serve_command, verdict_for
    from kvplan.plan.steptime import model_for, quick_latency
    from kvplan.vllm.rules import rules_for

    fmt = chosen_format(fmt, as_json)
    if source not in ("auto", "local", "hub", "bundled"):
        raise KvplanError(f"invalid --source {source!r}", "use auto, local, hub or bundled")
    for name, value in (("--concurrency", concurrency), ("--max-gpus", max_gpus), ("--top", top)):
        if value <= 0:
            raise KvplanError(f"invalid {name}: {value} must be greater than 0")
    if max_gpus > 64:
        raise KvplanError(f"--max-gpus {max_gpus} is more than kvplan searches (64)")
    dtypes = tuple(d.strip() for d in kv_dtypes.split(",") if d.strip())
    if not dtypes:
        raise KvplanError("--kv-dtypes is empty", "use auto,fp8")
    from kvplan.model.dtypes import kv_dtype

    for d in dtypes:
        if d != "auto":
            kv_dtype(d)
    if gpus:
        devices = list(dict.fromkeys(find_device(g.strip()) for g in gpus.split(",") if g.strip()))
    else:
        devices = [d for d in load_catalog()[0].values() if d.bandwidth_gbps or d.memory_bytes]
    req = FitRequest(
        ctx=parse_tokens(ctx, "context length"),
        concurrency=concurrency,
        prompt=None if prompt is None else parse_tokens(prompt, "prompt length"),
        output=None if output is None else parse_tokens(output, "output length", allow_zero=True),
        shared_prefix=0 if shared_prefix is None else parse_tokens(shared_prefix, "shared prefix", allow_zero=True),
        max_gpus=max_gpus, kv_dtypes=dtypes, prices=_prices(price), allow_pp=not no_pp,
    )
    slo_targets = parse_slo(slo)
    if slo is not None and not slo_targets:
        raise KvplanError("--slo is empty", "use key=value pairs: ttft_p99=500ms,itl_p99=50ms")
    rate_per_s = None if rate is None else _rate(rate, slo_targets, concurrency, max_replicas)
    if pd_link_gbs is not None and not pd:
        raise KvplanError("--pd-link-gbs is for --pd", "add --pd, or drop --pd-link-gbs")
    if pd and rate_per_s is None:
        raise KvplanError("--pd sizes a fleet: it needs --rate", "add --rate 200 --slo ttft_p99=1s,tpot_p99=50ms")
    _check_steptime_options(steptime, rate_per_s, {"--gpus": gpus, "--price": price, "--pd": pd})
    link_gb_per_s = None if not pd else check_positive(50.0 if pd_link_gbs is None else pd_link_gbs, "--pd-link-gbs",
                                                       maximum=100_000)
    resolved = load_model(model, None, source, True if offline else None, {})
    rules = rules_for(vllm_version)
    if steptime is not None:
        t0 = time.perf_counter()
        payload = _measured_fleet_payload(resolved, rules, req, Path(steptime), slo_targets, rate_per_s, max_replicas)
        payload["search_seconds"] = round(time.perf_counter() - t0, 4)
        _emit_fleets(payload, fmt)
    overhead = load_overhead()
    t0 = time.perf_counter()
    from kvplan.deploy import load_draft
    from kvplan.plan.schema import Settings
    from kvplan.plan.speculative import parse_speculative_config

    spec = None if speculative_config is None else parse_speculative_config(speculative_config)
    base = Settings(speculative=load_draft(spec, source, True if offline else None))
    result = search(resolved.arch, devices, req, rules, overhead, resolved.weights_total, base)
    elapsed = time.perf_counter() - t0
    if rate_per_s is not None:
        payload = _fleet_payload(resolved, result, req, rules, overhead, base, slo_targets, rate_per_s, max_replicas, top,
                                 link_gb_per_s)
        payload["search_seconds"] = round(time.perf_counter() - t0, 4)
        _emit_fleets(payload, fmt)
    shown, seen, sized = [], set(), set()
    slo_rejected: dict[str, int] = {}
    simulated = 0
    slo_stopped = False
    for cand in result.fitting:
        group = (cand.device.name, cand.tp, cand.pp, cand.dp, cand.kv_dtype)
        same_size = (cand.device.name, cand.gpus, cand.kv_dtype)
        if group in seen or (cand.pp > 1 and same_size in sized):  # PP only where no TP-only layout fits
            continue
        seen.add(group)
        if not slo_targets:
            sized.add(same_size)
        cap = replan(resolved.arch, cand, req, rules, overhead, resolved.weights_total, base)
        verdict = verdict_for(cap, cand.dp)
        if not verdict.fits:  # the fast path and the full plan disagree: trust the full plan
            continue
        latency = predicted = checks = None
        try:
            step_model = model_for(cap)
        except KvplanError:
            step_model = None
        if slo_targets:
            if step_model is None:
                slo_rejected["no bandwidth / TFLOP/s in the catalog to predict latency"] = \
                    slo_rejected.get("no bandwidth / TFLOP/s in the catalog to predict latency", 0) + 1
                continue
            prompt_tokens, out_tokens = workload_lengths(req, cand.ctx)
            floor = latency_floor(step_model, prompt_tokens, out_tokens, cap.limits.max_num_batched_tokens,
                                  cached=req.shared_prefix)
            missed = [k for k, target in slo_targets.items() if floor[k.rpartition("_")[0]] > target]
            if missed:  # even one request alone could not meet it: no need to simulate
                reason = f"{missed[0]} out of reach (bound)"
                slo_rejected[reason] = slo_rejected.get(reason, 0) + 1
                continue
            if simulated >= MAX_SLO_SIMULATIONS:
                slo_stopped = True
                break
        if step_model is not None:
            prompt_tokens, out_tokens = workload_lengths(req, cand.ctx)
            est = quick_latency(step_model, prompt_tokens, out_tokens, cdiv(concurrency, cand.dp))
            latency = {"ttft_ms": round(est["ttft_s"] * 1000, 1), "tpot_ms": round(est["tpot_s"] * 1000, 2),
                       "e2e_s": round(est["e2e_s"], 2),
                       "output_tokens_per_s": round(est["output_tokens_per_s"] * cand.dp, 1), "source": "prior"}
            if slo_targets:
                simulated += 1
                predicted, checks, reason = _simulated_slo(cap, req, cand.dp, step_model, slo_targets)
                if reason:
                    slo_rejected[reason] = slo_rejected.get(reason, 0) + 1
                    continue
        sized.add(same_size)  # (with SLOs: only a TP-only layout that meets them rules out PP of its size)
        shown.append({
            "gpu": cand.device.name, "gpus": cand.gpus, "tensor_parallel_size": cand.tp,
            "pipeline_parallel_size": cand.pp, "data_parallel_size": cand.dp, "kv_cache_dtype": cap.dtype.name,
            "max_model_len": cand.ctx, "headroom": round(cand.headroom, 4), "blocks_needed": cand.blocks_needed,
            "usable_blocks": cand.usable_blocks, "price_per_hour": cand.price_per_hour, "verdict": verdict.reason,
            "latency_estimate": latency,
            "latency_predicted": predicted,
            "slo": None if checks is None else {k: {"target_ms": round(c["target"] * 1000, 3),
                                                     "predicted_ms": None if c["value"] is None
                                                     else round(c["value"] * 1000, 3), "met": c["met"]}
                                                 for k, c in checks.items()},
            "vllm_serve_command": serve_command(resolved.config.name, cap, cand.dp),
        })
        if len(shown) >= top:
            break
    payload = {
        "model": resolved.config.name, "model_source": resolved.config.source, "vllm_version": rules.version,
        "ctx": req.ctx, "concurrency": concurrency, "prompt_tokens": req.prompt, "output_tokens": req.output,
        "candidates_evaluated": result.evaluated, "candidates_fitting": len(result.fitting),
        "search_seconds": round(elapsed, 4), "rejected": result.rejected_reasons,
        "slo": {k: round(v * 1000, 3) for k, v in slo_targets.items()} if slo_targets else None,
        "slo_description": describe_slo(slo_targets) if slo_targets else None,
        "slo_rejected": slo_rejected, "slo_simulated": simulated, "slo_search_stopped": slo_stopped,
        "deployments": shown,
    }
    if fmt is OutputFormat.json:
        print_json(payload)
    elif fmt is OutputFormat.table:
        _render(payload)
    else:
        emit_rows(*deployment_rows(payload), fmt, footnote=_latency_note(payload) if shown else None)
        if not shown:  # stdout stays the (empty) table; why goes beside it
            typer.echo(printable(_why_none(payload)), err=True)
    raise typer.Exit(ExitCode.OK if shown else ExitCode.DOES_NOT_FIT)


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def deployment_rows(p: dict) -> tuple[list[dict], list[Column]]:
    """The deployments table as flat records (CSV, Markdown): with SLOs, the latency columns are the
    simulated figure of each SLO key (``ttft_p99_ms``...); without, the prior estimate."""
    slo_keys = list(p["slo"] or {})
    latency = [(f"{k}_ms", f"{k} ms") for k in slo_keys] if slo_keys else [("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms")]
    rows = []
    for rank, d in enumerate(p["deployments"], 1):
        if slo_keys:
            figures = {f"{k}_ms": (d["slo"] or {}).get(k, {}).get("predicted_ms") for k in slo_keys}
            tokens_per_s = (d["latency_predicted"] or {}).get("output_tokens_per_s")
        else:
            estimate = d["latency_estimate"] or {}
            figures = {"ttft_ms": estimate.get("ttft_ms"), "tpot_ms": estimate.get("tpot_ms")}
            tokens_per_s = estimate.get("output_tokens_per_s")
        rows.append({"rank": rank, "gpu": d["gpu"], "gpus": d["gpus"], "tensor_parallel_size": d["tensor_parallel_size"],
                     "pipeline_parallel_size": d["pipeline_parallel_size"], "data_parallel_size": d["data_parallel_size"],
                     "kv_cache_dtype": d["kv_cache_dtype"], "max_model_len": d["max_model_len"], "headroom": d["headroom"],
                     **figures, "output_tokens_per_s": tokens_per_s, "price_per_hour": d["price_per_hour"],
                     "vllm_serve_command": d["vllm_serve_command"]})
    columns = [Column("rank", "#"), Column("gpu", "GPU", right=False), Column("gpus", "GPUs"),
               Column("tensor_parallel_size", "TP"), Column("pipeline_parallel_size", "PP"),
               Column("data_parallel_size", "DP"), Column("kv_cache_dtype", "KV dtype", right=False),
               Column("max_model_len", "context", "{:,}".format), Column("headroom", "headroom", "{:.0%}".format),
               *(Column(key, head, _or_dash) for key, head in latency),
               Column("output_tokens_per_s", "tok/s", _or_dash),
               Column("price_per_hour", "$/h", lambda v: "-" if v is None else f"{v:.2f}"),
               Column("vllm_serve_command", "vLLM command", lambda v: f"`{v}`", right=False)]
    return rows, columns


def _why_none(p: dict) -> str:
    if p.get("slo") and p["candidates_fitting"]:
        return ("NO DEPLOYMENT MEETS THE SLOs within the search (its predicted latency, prior step-time model). "
                "Try more GPUs (--max-gpus), a lower concurrency or looser targets.")
    reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(p["rejected"].items(), key=lambda kv: -kv[1]))
    return (f"NOTHING FITS within the search ({reasons}). Try more GPUs (--max-gpus), fp8, a shorter context "
            "or a lower concurrency.")


def _latency_note(p: dict) -> str:
    if p.get("slo"):
        return ("Latency: predicted by the scheduler simulator with the prior step-time model (roofline x "
                "assumed efficiencies; uncalibrated), per replica, closed loop of the asked concurrency.")
    return ("Latency: prior step-time estimate (roofline x assumed efficiencies; uncalibrated), TTFT of one "
            "prompt alone, TPOT at the asked concurrency per replica.")


def _render(p: dict) -> None:
    from rich.table import Table

    from kvplan.term import make_console

    console = make_console()
    work = f"{p['concurrency']} x " + (f"prompt {p['prompt_tokens']:,} + output {p['output_tokens'] or 0:,}"
                                        if p["prompt_tokens"] is not None else f"{p['ctx']:,}-token requests")
    console.print(f"{esc(p['model'])} ({p['model_source']}), vLLM {p['vllm_version']} rules: {work}, context {p['ctx']:,}")
    console.print(f"Searched {p['candidates_evaluated']:,} candidate deployments in {p['search_seconds']:.2f} s; "
                  f"{p['candidates_fitting']:,} start and fit.")
    if p.get("slo"):
        rejected = ", ".join(f"{esc(k)}: {v:,}" for k, v in sorted(p["slo_rejected"].items(), key=lambda kv: -kv[1]))
        console.print(f"SLOs: {esc(p['slo_description'])}; predicted latency simulated for {p['slo_simulated']} "
                      f"deployment{'s' if p['slo_simulated'] != 1 else ''}" + (f"; missed: {rejected}" if rejected else "")
                      + (" (search stopped: simulation limit reached)" if p["slo_search_stopped"] else "") + ".")
    if not p["deployments"]:
        console.print(esc(_why_none(p)))
        return
    slo_keys = list(p["slo"] or {})
    priced = any(d["price_per_hour"] is not None for d in p["deployments"])
    # Readable at 80 columns: TP/PP/DP in one cell, numbers never wrapped, names folded, no empty price column.
    table = Table(show_header=True, header_style="bold", show_edge=False, pad_edge=False)
    latency_cols = ("TTFT ms", "TPOT ms", "tok/s") if not slo_keys else tuple(f"{k} ms" for k in slo_keys) + ("tok/s",)
    for col in ("#", "GPUs", "TP/PP/DP", "KV dtype", "context", "headroom", *latency_cols, *(("$/h",) if priced else ())):
        text = col in ("GPUs", "KV dtype")
        table.add_column(col, justify="left" if text else "right", overflow="fold", no_wrap=col != "GPUs")

    def ms(value) -> str:
        return "-" if value is None else format_ms(float(value) / 1000)

    def per_s(value) -> str:
        return "-" if value is None else f"{float(value):,.1f}"

    for i, d in enumerate(p["deployments"], 1):
        lat = d["latency_estimate"] or {}
        if slo_keys:
            cells = [ms((d["slo"] or {}).get(k, {}).get("predicted_ms")) for k in slo_keys]
            cells.append(per_s((d["latency_predicted"] or {}).get("output_tokens_per_s")))
        else:
            cells = [ms(lat.get("ttft_ms")), ms(lat.get("tpot_ms")), per_s(lat.get("output_tokens_per_s"))]
        price = ["-" if d["price_per_hour"] is None else f"{d['price_per_hour']:.2f}"] if priced else []
        table.add_row(str(i), f"{d['gpus']} x {esc(d['gpu'])}",
                      f"{d['tensor_parallel_size']}/{d['pipeline_parallel_size']}/{d['data_parallel_size']}",
                      d["kv_cache_dtype"], f"{d['max_model_len']:,}", f"{d['headroom']:.0%}", *cells, *price)
    console.print(table)
    console.print(_latency_note(p))
    for i, d in enumerate(p["deployments"], 1):
        console.print(f"{i}. {esc(d['vllm_serve_command'])}", soft_wrap=True, highlight=False)


# --------------------------------------------------------------------------- --rate: fleets


FLEET_NOTE = ("Replicas: the fewest whose replica, simulated at its share of the rate (Poisson arrivals, {model}), "
              "meets every SLO (figures in ms); 'bound by': what held a replica back one replica short (kv: its pool; "
              "batch: max_num_seqs; compute).")


def _fleet_note(p: dict) -> str:
    run = p.get("steptime_run")
    note = FLEET_NOTE.format(model="prior step-time model, uncalibrated" if run is None
                             else f"its pool, limits and step-time model calibrated on {run}")
    return note + (f" Note: {p['steptime_note']}." if p.get("steptime_note") else "")


def _rate(text: str, slo_targets: dict, concurrency: int, max_replicas: int) -> float:
    """--rate as requests per second ("200" or "200/s"), with the options it needs and excludes."""
    from kvplan.errors import KvplanError
    from kvplan.units import parse_rate

    rate = parse_rate(text, "--rate")
    if not slo_targets:
        raise KvplanError("--rate needs --slo: what serving the rate means", "add --slo ttft_p99=1s")
    if concurrency != 1:
        raise KvplanError("--rate and --concurrency both given", "a fleet's load is its rate: drop -c")
    if not 1 <= max_replicas <= 4096:
        raise KvplanError(f"invalid --max-replicas {max_replicas}", "use 1 to 4,096")
    return rate


PD_NOTE = ("P/D: the same engine as prefill and decode replicas (vLLM's NixlConnector, one {link:g} GB/s NIC a GPU): "
           "prefill replicas simulated at the TTFT target less the KV transfer and the decode's first step; decode "
           "replicas in their steady state (no queue: the count errs low under bursts), as many requests at once as "
           "their pool, max_num_seqs and the TPOT/ITL target allow (what binds in brackets).")


def _pd_cell(pair: dict | None) -> str:
    if not pair or pair["replicas"] is None:
        return "-" if not pair else esc(f"- ({pair['reason']})")
    return (f"{pair['prefill_replicas']} + {pair['decode_replicas']} = {pair['gpus']} GPUs "
            f"(decode {pair['decode_concurrency']} at once, {pair['decode_binding']}; KV {pair['transfer_ms']:g} ms)")


def _emit_fleets(payload: dict, fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        print_json(payload)
    elif fmt is OutputFormat.table:
        _render_fleets(payload)
    else:
        emit_rows(*fleet_rows(payload), fmt, footnote=_fleet_note(payload) if payload["fleets"] else None)
        if not payload["fleets"]:
            typer.echo(printable(_why_no_fleet(payload)), err=True)
    raise typer.Exit(ExitCode.OK if payload["fleets"] else ExitCode.DOES_NOT_FIT)


def _fleet_payload(resolved, result, req, rules, overhead, base, slo_targets: dict, rate_per_s: float,
                   max_replicas: int, top: int, pd_link_gb_per_s: float | None = None) -> dict:
    """The fewest replicas of each deployment shape (one engine: GPU x TP x PP x KV dtype, at the first context the
    search found for it) for the rate, best first; with ``pd_link_gb_per_s`` (--pd) also as prefill/decode pairs."""
    from kvplan.bench.slo import describe_slo
    from kvplan.errors import KvplanError
    from kvplan.plan.fit import latency_floor, replan, workload_lengths
    from kvplan.plan.fleet import replicas_for_rate
    from kvplan.plan.simulate import SchedulerConfig
    from kvplan.plan.size import serve_command, verdict_for
    from kvplan.plan.steptime import model_for
    from kvplan.term import make_console

    fleets, unmet, seen = [], {}, set()
    simulations, stopped, said_slow = 0, False, False

    def miss(reason: str) -> None:
        unmet[reason] = unmet.get(reason, 0) + 1

    for cand in (c for c in result.fitting if c.dp == 1):
        shape = (cand.device.name, cand.tp, cand.pp, cand.kv_dtype)
        if shape in seen:
            continue
        if len(seen) >= MAX_FLEET_SHAPES or simulations >= MAX_SLO_SIMULATIONS:
            stopped = True
            break
        seen.add(shape)
        cap = replan(resolved.arch, cand, req, rules, overhead, resolved.weights_total, base)
        if not verdict_for(cap, 1).fits:
            continue
        try:
            step_model = model_for(cap)
        except KvplanError:
            miss("no bandwidth / TFLOP/s in the catalog to predict latency")
            continue
        prompt_tokens, out_tokens = workload_lengths(req, cand.ctx)
        floor = latency_floor(step_model, prompt_tokens, out_tokens, cap.limits.max_num_batched_tokens,
                              cached=req.shared_prefix)
        try:
            config = SchedulerConfig.from_capacity(cap)
        except KvplanError as exc:  # a KV cache group the simulator does not model
            miss(f"latency not simulated: {exc.message}")
            continue
        if config.kv_groups is not None and not said_slow:  # (stderr: --json's stdout stays one document)
            said_slow = True
            make_console(stderr=True).print(
                f"KV cache groups {config.kv_groups.describe()}: each replica's blocks are simulated in every "
                "group; this search may take a minute or more")
        count = replicas_for_rate(config, step_model, rate_per_s, prompt_tokens, out_tokens,
                                  slo_targets, floor, shared_prefix_tokens=min(req.shared_prefix, prompt_tokens),
                                  max_replicas=max_replicas, max_simulations=MAX_SLO_SIMULATIONS - simulations)
        simulations += count.simulations
        pair = None
        if pd_link_gb_per_s is not None:
            pair = _pd_pair(cap, config, cand, step_model, rate_per_s, prompt_tokens, out_tokens, slo_targets, floor,
                            min(req.shared_prefix, prompt_tokens), pd_link_gb_per_s, max_replicas,
                            MAX_SLO_SIMULATIONS - simulations)
            simulations += pair.pop("simulations")
        if count.replicas is None and (pair is None or pair["replicas"] is None):
            miss(count.reason)
            continue
        tokens_per_s = rate_per_s * out_tokens  # in steady state every request is served whole
        if pair is not None:
            pair["price_per_hour"], pair["usd_per_million_output_tokens"] = _cost(cand.price_per_hour, pair["gpus"],
                                                                                tokens_per_s)
        price, per_million = _cost(cand.price_per_hour, count.replicas and count.replicas * cand.gpus, tokens_per_s)
        fleets.append({
            "gpu": cand.device.name, "gpus_per_replica": cand.gpus, "tensor_parallel_size": cand.tp,
            "pipeline_parallel_size": cand.pp, "kv_cache_dtype": cap.dtype.name, "max_model_len": cand.ctx,
            **_count_fields(count, cand.gpus, slo_targets),
            "price_per_hour": price, "usd_per_million_output_tokens": per_million,
            "vllm_serve_command": serve_command(resolved.config.name, cap, 1),
            "pd": pair,
        })
    order = {id(f): i for i, f in enumerate(fleets)}  # the search's order breaks ties

    def best(f: dict, key: str):  # the fleet's figure, or its P/D pair's where that needs fewer GPUs
        options = [f] + ([f["pd"]] if f["pd"] and f["pd"]["replicas"] is not None else [])
        return min((o for o in options if o["gpus"] is not None), key=lambda o: o["gpus"])[key]

    priced = all(best(f, "price_per_hour") is not None for f in fleets)
    fleets.sort(key=lambda f: ((best(f, "price_per_hour"), best(f, "gpus")) if priced else (best(f, "gpus"),),
                               order[id(f)]))
    return {
        "model": resolved.config.name, "model_source": resolved.config.source, "vllm_version": rules.version,
        "ctx": req.ctx, "rate_per_s": rate_per_s, "prompt_tokens": req.prompt, "output_tokens": req.output,
        "candidates_evaluated": result.evaluated, "candidates_fitting": len(result.fitting),
        "rejected": result.rejected_reasons, "slo": {k: round(v * 1000, 3) for k, v in slo_targets.items()},
        "slo_description": describe_slo(slo_targets), "shapes_sized": len(seen), "fleet_unmet": unmet,
        "fleet_simulations": simulations, "fleet_search_stopped": stopped, "max_replicas": max_replicas,
        "pd": pd_link_gb_per_s is not None, "pd_link_gb_per_s": pd_link_gb_per_s, "steptime_run": None,
        "fleets": fleets[:top],
    }


def _check_steptime_options(steptime: str | None, rate_per_s: float | None, search_options: dict) -> None:
    """--steptime RUN sizes a fleet of the measured engine: it needs --rate, and takes none of the GPU search's."""
    from kvplan.errors import KvplanError

    if steptime is None:
        return
    if rate_per_s is None:
        raise KvplanError("--steptime sizes a fleet of the measured engine: it needs --rate",
                          "add --rate 5 --slo ttft_p99=2s")
    given = [name for name, value in search_options.items() if value]
    if given:
        raise KvplanError(f"--steptime sizes the engine the run measured; {given[0]} is for the GPU search",
                          f"drop {given[0]}")


def _count_fields(count, gpus_per_replica: int, slo_targets: dict) -> dict:
    """A fleet record's replica count, its replica's prediction and SLO checks (kvplan.plan.fleet.ReplicaCount)."""
    from kvplan.bench.slo import point_checks

    pred = count.prediction if count.replicas is not None else None
    checks = {} if pred is None else point_checks(
        {"ttft": pred.ttft, "itl": pred.itl, "tpot": pred.tpot, "e2e": pred.e2e}, slo_targets)
    return {
        "replicas": count.replicas, "gpus": count.replicas and count.replicas * gpus_per_replica,
        "per_replica_rate_per_s": count.per_replica_rate_per_s and round(count.per_replica_rate_per_s, 4),
        "binding": count.binding if count.replicas is not None else "-",
        "latency_predicted": None if pred is None else pred.to_json(),
        "slo": {k: {"target_ms": round(c["target"] * 1000, 3),
                    "predicted_ms": None if c["value"] is None else round(c["value"] * 1000, 3), "met": c["met"]}
                for k, c in checks.items()},
        "simulations": count.simulations,
    }


def _measured_fleet_payload(resolved, rules, req, run: Path, slo_targets: dict, rate_per_s: float,
                            max_replicas: int) -> dict:
    """--steptime RUN: the fewest replicas of the engine a bench run measured (RUN/steptime.json: its pool, its
    limits, the step-time model fitted to its points), the one shape of the answer; no GPU search."""
    from kvplan.bench.slo import describe_slo
    from kvplan.bench.steptime_io import calibrated_engine, calibrated_prompt_range
    from kvplan.errors import KvplanError
    from kvplan.plan.fit import latency_floor, workload_lengths
    from kvplan.plan.fleet import replicas_for_rate
    from kvplan.plan.steptime import prompt_range_note

    engine = calibrated_engine(run)
    if engine.model_name and not _same_model(engine.model_name, resolved.config.name):
        raise KvplanError(f"{run} was calibrated on {engine.model_name}, not {resolved.config.name}",
                          "size the model the run served, or calibrate a run of this one")
    sched = engine.scheduler
    ctx = min(req.ctx, sched.max_model_len or req.ctx)
    prompt_tokens, out_tokens = workload_lengths(req, ctx)
    shared = min(req.shared_prefix, prompt_tokens)
    floor = latency_floor(engine.model, prompt_tokens, out_tokens, sched.max_num_batched_tokens, cached=shared)
    count = replicas_for_rate(sched, engine.model, rate_per_s, prompt_tokens, out_tokens, slo_targets, floor,
                              shared_prefix_tokens=shared, max_replicas=max_replicas,
                              max_simulations=MAX_SLO_SIMULATIONS)
    fleets = [] if count.replicas is None else [{
        "gpu": f"engine of {run}", "gpus_per_replica": engine.gpus_per_replica,
        "tensor_parallel_size": engine.gpus_per_replica, "pipeline_parallel_size": 1, "kv_cache_dtype": "as run",
        "max_model_len": ctx, **_count_fields(count, engine.gpus_per_replica, slo_targets),
        "price_per_hour": None, "usd_per_million_output_tokens": None,
        "vllm_serve_command": f"as run for {run}", "pd": None,
    }]
    return {
        "model": resolved.config.name, "model_source": resolved.config.source, "vllm_version": engine.vllm_version or rules.version,  # the run's engine's release
        "ctx": req.ctx, "rate_per_s": rate_per_s, "prompt_tokens": req.prompt, "output_tokens": req.output,
        "candidates_evaluated": 1, "candidates_fitting": 1, "rejected": {},
        "slo": {k: round(v * 1000, 3) for k, v in slo_targets.items()}, "slo_description": describe_slo(slo_targets),
        "shapes_sized": 1, "fleet_unmet": {} if count.replicas is not None else {count.reason: 1},
        "fleet_simulations": count.simulations, "fleet_search_stopped": False, "max_replicas": max_replicas,
        "pd": False, "pd_link_gb_per_s": None, "steptime_run": str(run), "fleets": fleets,
        "steptime_note": prompt_range_note(calibrated_prompt_range(run), (prompt_tokens, prompt_tokens)),
    }


def _same_model(a: str, b: str) -> bool:
    """Two names of one model: equal, or the same local folder written two ways."""
    return a == b or (Path(a).is_dir() and Path(b).is_dir() and Path(a).resolve() == Path(b).resolve())


def _cost(usd_per_gpu_hour: float | None, gpus: int | None, output_tokens_per_s: float) -> tuple:
    """(USD per hour, USD per million output tokens) of ``gpus`` GPUs; None where the price or the count is unknown."""
    if usd_per_gpu_hour is None or gpus is None:
        return None, None
    hourly = usd_per_gpu_hour * gpus
    return round(hourly, 4), round(hourly / (output_tokens_per_s * 3600) * 1e6, 4)


def _simulated_slo(cap, req, dp: int, step_model, slo_targets: dict) -> tuple[dict | None, dict | None, str]:
    """One deployment's simulated latency against the SLOs: (its prediction as JSON, the checks, why it is rejected:
    '' when it meets them)."""
    from kvplan.bench.slo import point_checks
    from kvplan.errors import KvplanError
    from kvplan.plan.fit import REQUESTS_PER_STREAM, predict_deployment

    try:
        pred = predict_deployment(cap, req, dp, step_model)
    except KvplanError as exc:  # a KV cache group the simulator does not model: no latency to judge
        return None, None, f"latency not simulated: {exc.message}"
    checks = point_checks({"ttft": pred.ttft, "itl": pred.itl, "tpot": pred.tpot, "e2e": pred.e2e}, slo_targets)
    predicted = pred.to_json()
    predicted["output_tokens_per_s"] = round(pred.output_tokens_per_s * dp, 2)
    predicted["requests_per_stream"] = REQUESTS_PER_STREAM
    predicted["load"] = "steady state: streams started one request's duration apart"
    failed = [k for k, c in checks.items() if c["met"] is False]
    return predicted, checks, f"{failed[0]} missed (simulated)" if failed else ""


def _pd_pair(cap, config, cand, step_model, rate_per_s: float, prompt: int, output: int, slo: dict, floor: dict, shared: int,
             link_gb_per_s: float, max_replicas: int, max_simulations: int) -> dict:
    """--pd: the shape as prefill and decode replicas of the same engine (kvplan.plan.fleet.pd_replicas_for_rate),
    its KV moved over one NIC per GPU (kvplan.plan.disagg, decode TP = prefill TP); ``config``: its scheduler."""
    from kvplan.errors import KvplanError
    from kvplan.plan.disagg import pd_transfer
    from kvplan.plan.fit import latency_floor
    from kvplan.plan.fleet import pd_replicas_for_rate

    empty = {"replicas": None, "prefill_replicas": None, "decode_replicas": None, "gpus": None, "transfer_ms": None,
             "decode_concurrency": None, "decode_step_ms": None, "decode_binding": None, "prefill_binding": None,
             "link_gb_per_s": link_gb_per_s, "simulations": 0}
    try:
        transfer_s = pd_transfer(cap, cand.tp, prompt).transfer_s(link_gb_per_s)
    except KvplanError as exc:
        return {**empty, "reason": exc.message}
    floor = latency_floor(step_model, prompt, 1, cap.limits.max_num_batched_tokens, cached=shared)
    pair = pd_replicas_for_rate(config, step_model, rate_per_s, prompt, output, slo,
                                transfer_s, cap.blocks_per_request(prompt + max(output - 1, 0)), floor, shared,
                                max_replicas, max_simulations)
    d, pre = pair.decode, pair.prefill
    return {
        "replicas": pair.replicas, "prefill_replicas": pre and pre.replicas, "decode_replicas": pair.decode_replicas,
        "gpus": pair.replicas and pair.replicas * cand.gpus, "transfer_ms": round(transfer_s * 1000, 3),
        "decode_concurrency": d and d.concurrency, "decode_step_ms": d and round(d.step_s * 1000, 3),
        "decode_binding": d and d.binding, "prefill_binding": pre and pre.binding, "link_gb_per_s": link_gb_per_s,
        "simulations": pre.simulations if pre else 0, "reason": pair.reason,
    }


def fleet_rows(p: dict) -> tuple[list[dict], list[Column]]:
    """The fleets table as flat records (CSV, Markdown)."""
    keys = list(p["slo"])
    rows = [{"rank": i, "gpu": f["gpu"], "replicas": f["replicas"], "gpus_per_replica": f["gpus_per_replica"],
             "gpus": f["gpus"], "tensor_parallel_size": f["tensor_parallel_size"],
             "pipeline_parallel_size": f["pipeline_parallel_size"], "kv_cache_dtype": f["kv_cache_dtype"],
             "max_model_len": f["max_model_len"], "binding": f["binding"],
             **{f"{k}_ms": f["slo"][k]["predicted_ms"] for k in keys},
             "price_per_hour": f["price_per_hour"], "usd_per_million_output_tokens": f["usd_per_million_output_tokens"],
             **({} if not p.get("pd") else {
                 "pd_prefill_replicas": (f["pd"] or {}).get("prefill_replicas"),
                 "pd_decode_replicas": (f["pd"] or {}).get("decode_replicas"), "pd_gpus": (f["pd"] or {}).get("gpus")}),
             "vllm_serve_command": f["vllm_serve_command"]} for i, f in enumerate(p["fleets"], 1)]
    money = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    columns = [Column("rank", "#"), Column("gpu", "GPU", right=False), Column("replicas", "replicas"),
               Column("gpus", "GPUs"), Column("tensor_parallel_size", "TP"), Column("pipeline_parallel_size", "PP"),
               Column("kv_cache_dtype", "KV dtype", right=False), Column("max_model_len", "context", "{:,}".format),
               Column("binding", "bound by", right=False), *(Column(f"{k}_ms", f"{k} ms", _or_dash) for k in keys),
               Column("price_per_hour", "$/h", money), Column("usd_per_million_output_tokens", "$/M tok", money),
               *((Column("pd_prefill_replicas", "P/D prefill", _or_dash), Column("pd_decode_replicas", "P/D decode", _or_dash),
                  Column("pd_gpus", "P/D GPUs", _or_dash)) if p.get("pd") else ()),
               Column("vllm_serve_command", "vLLM command (one replica)", lambda v: f"`{v}`", right=False)]
    return rows, columns


def _why_no_fleet(p: dict) -> str:
    if not p["candidates_fitting"]:
        return _why_none({**p, "slo": None})
    reasons = ", ".join(f"{k}: {v:,}" for k, v in sorted(p["fleet_unmet"].items(), key=lambda kv: -kv[1]))
    return (f"NO FLEET MEETS THE SLOs within {p['max_replicas']:,} replicas of a deployment ({reasons or 'none sized'}). "
            "Try looser targets, more GPUs a replica (--max-gpus) or more replicas (--max-replicas).")


def _render_fleets(p: dict) -> None:
    from rich.table import Table

    from kvplan.term import make_console

    console = make_console()
    work = (f"prompt {p['prompt_tokens']:,} + output {p['output_tokens'] or 0:,}" if p["prompt_tokens"] is not None
            else f"{p['ctx']:,}-token requests")
    console.print(f"{esc(p['model'])} ({p['model_source']}), vLLM {p['vllm_version']} rules: {p['rate_per_s']:g} "
                  f"requests/s of {work}, context {p['ctx']:,}; SLOs: {esc(p['slo_description'])}")
    console.print(f"{p['shapes_sized']} deployment shape{'s' if p['shapes_sized'] != 1 else ''} sized in "
                  f"{p['fleet_simulations']} simulations ({p['search_seconds']:.1f} s)"
                  + (" (search stopped: shape or simulation limit reached)" if p["fleet_search_stopped"] else "") + ".")
    if not p["fleets"]:
        console.print(esc(_why_no_fleet(p)))
        return
    keys = list(p["slo"])
    pd = bool(p.get("pd"))
    priced = any(f["price_per_hour"] is not None for f in p["fleets"])
    table = Table(show_header=True, header_style="bold", show_edge=False, pad_edge=False)
    for col in ("#", "fleet", "KV dtype", "bound by", *keys, *(("$/h", "$/M tok") if priced else ()),
                *(("P/D: prefill + decode",) if pd else ())):
        text = col in ("fleet", "KV dtype", "bound by", "P/D: prefill + decode")
        table.add_column(col, justify="left" if text else "right", overflow="fold", no_wrap=col != "fleet")
    for i, f in enumerate(p["fleets"], 1):
        cells = [_or_dash(None if k not in f["slo"] or f["slo"][k]["predicted_ms"] is None
                          else format_ms(f["slo"][k]["predicted_ms"] / 1000)) for k in keys]
        money = [_or_dash(None if f[k] is None else f"{f[k]:.2f}") for k in ("price_per_hour", "usd_per_million_output_tokens")]
        each = esc(f["gpu"]) if f["gpus_per_replica"] == 1 else f"({f['gpus_per_replica']} x {esc(f['gpu'])})"
        split = f" PP{f['pipeline_parallel_size']}" if f["pipeline_parallel_size"] > 1 else ""
        count = "-" if f["replicas"] is None else str(f["replicas"])
        table.add_row(str(i), f"{count} x {each}{split}", f["kv_cache_dtype"], f["binding"], *cells,
                      *(money if priced else ()), *((_pd_cell(f["pd"]),) if pd else ()))
    console.print(table)
    console.print(esc(_fleet_note(p)))
    if pd:
        console.print(PD_NOTE.format(link=p["pd_link_gb_per_s"]))
    for i, f in enumerate(p["fleets"], 1):
        console.print(f"{i}. {esc(f['vllm_serve_command'])}", soft_wrap=True, highlight=False)
