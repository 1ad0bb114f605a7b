"""One point's result, from what the client recorded and what the server's /metrics said before, during and
after it: status, latency statistics, SLO checks, goodput, the evidence of KV waits and preemptions, and the block
rule's prediction for the same load. Pure: the runner (kvplan.bench.runner) measures, this module judges."""

from __future__ import annotations

import math
from typing import Any

from kvplan.bench.config import BenchConfig
from kvplan.bench.loadgen import RequestRecord
from kvplan.bench.metrics import Snapshot, preempted, summarize
from kvplan.bench.results import LatencyStats, PointResult, PredictedPoint, ReplicaPoint, ServerFigures
from kvplan.bench.slo import request_meets, slo_results
from kvplan.bench.stats import sample_warnings
from kvplan.bench.sweep import PointOutcome, measured_label, waited_for_kv
from kvplan.plan.blocks import BlockRule
from kvplan.term import printable

#: Fewer gauge samples than this inside a point's Prometheus window get a note (kvplan.bench.prometheus).
SPARSE_SAMPLES = 3


def point_result(cfg: BenchConfig, rule: BlockRule | None, concurrency: int, seq: int, first_index: int,
             started_at: str, records: list[RequestRecord], wall: float, aborted: str | None,
             before: Snapshot | None, during: list[Snapshot], after: Snapshot | None,
             rate: float | None = None, prometheus: ServerFigures | None = None) -> tuple[PointResult, list[dict[str, Any]]]:
    """One point's result from what the client recorded (``records``, the wall time, why it stopped) and the
    server's /metrics before, during and after it; with the request rows requests.jsonl keeps. ``concurrency``:
    the streams (closed loop), the sessions (replay) or the peak in flight (open loop, ``rate`` set). ``prometheus``:
    the point's figures from Prometheus (--prometheus), which then judge it; the scraped ones are kept beside."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    server = server_figures(before, during, after)
    scraped = None
    if prometheus is not None:
        server, scraped = prometheus, (None if server.empty else server)
    # A point is "ok" only when every request completed: one failed request (whatever its
    # reason, or none recorded) fails it, and a point that sent nothing is no measurement.
    error = aborted or next((r.error for r in failed if r.error), None)
    if error is None and failed:
        error = f"{len(failed)} of {len(records)} requests failed"
    if error is None and not records:
        error = "no request was sent"
    # A data-parallel server: each engine has its own pool, so the point waited or preempted when one engine did
    # (the first to, as a fleet's first replica), never by queues summed over engines. The engines' figures come from
    # the server's own /metrics (with --prometheus, when scraped beside it: Prometheus' figures stay summed)
    engines, engine_error = engine_points(before, during, after, cfg, error is not None)
    error = error or engine_error
    status = "failed" if error else "ok"
    peak_wait = server.peak_waiting_capacity
    if peak_wait is None:
        peak_wait = server.peak_waiting
    preemptions = server.preemptions
    evidence = wait_evidence(concurrency, cfg.max_num_seqs, peak_wait, preemptions)
    did_preempt = preempted(preemptions)  # a reset or lying counter (negative, NaN, inf) is no evidence
    if engines is not None:
        evidence = [f"{e} (engine {p.index})" for p in engines for e in p.wait_evidence]
        did_preempt = any(p.preempted for p in engines)
    notes = []
    by_budget = budget_wait(rule, concurrency, evidence, server) if rate is None and engines is None else None
    if by_budget is not None:
        notes.append(by_budget)
        evidence = []
    waited = bool(evidence)
    outcome = PointOutcome(concurrency, waited, did_preempt, status != "ok")
    output_tokens = sum(r.output_tokens for r in ok)
    predicted = None
    if rule is not None and rate is None:
        predicted = PredictedPoint.from_rule(rule, concurrency)
    seen = server.peak_in_engine
    if rate is None and status == "ok" and seen is not None and seen < min(concurrency, cfg.max_num_seqs or concurrency):
        notes.append(f"the engine was seen holding at most {seen:.0f} of the {concurrency} requests at once "
                     "(short requests, a slow API server or scrapes too far apart): the load may not have "
                     "reached this concurrency inside the engine")
    if server.source == "prometheus" and status == "ok" and server.scrapes < SPARSE_SAMPLES:
        notes.append(f"Prometheus scraped the engines {server.scrapes} time{'s' if server.scrapes != 1 else ''} during "
                     "this point: a wait for KV shorter than its scrape interval may not show (preemptions are "
                     "counted whatever the interval); lengthen the point (--requests, --duration)")
    request_rows = [dict(r.to_json(), concurrency=concurrency, seq=seq,
                               **({"rate": rate} if rate is not None else {})) for r in records]
    chosen = cfg.percentiles
    stats = {
        "ttft": LatencyStats.of([r.ttft_s for r in ok if r.ttft_s is not None], chosen),
        "itl": LatencyStats.of([g for r in ok for g in r.itl_s], chosen),
        "tpot": LatencyStats.of([r.tpot_s for r in ok if r.tpot_s is not None], chosen),
        "e2e": LatencyStats.of([r.e2e_s for r in ok if r.e2e_s is not None], chosen),
    }
    warnings = [w for name, key in (("TTFT", "ttft"), ("ITL", "itl"), ("TPOT", "tpot"), ("E2E", "e2e"))
                for w in sample_warnings(name, stats[key])]
    slo = cfg.slo
    checks = slo_results(stats, slo) if slo else None
    good = [r for r in ok if request_meets(r, slo)] if slo else []
    multi = sum(1 for r in ok if r.multi_token_chunks)
    if multi:
        notes.append(f"{multi} of {len(ok)} requests received several tokens in one delivery; ITL is per token "
                     "(the gap divided by the tokens delivered)")
    result = PointResult(
        mode="rate" if rate is not None else "concurrency",
        rate=rate,
        burstiness=cfg.burstiness if rate is not None else None,
        max_concurrency=cfg.rate_max_concurrency if rate is not None else None,
        send_lag=LatencyStats.of([max(0.0, r.sent_s - r.scheduled_s) for r in records if r.sent_s]),
        request_throughput=round(len(ok) / wall, 4) if wall > 0 and ok else None,
        multi_token_requests=multi,
        retries=sum(r.retries for r in records),
        warnings=warnings,
        slo=checks,
        slo_met=None if not checks or status != "ok" else all(c.met for c in checks.values()),
        goodput_share=round(len(good) / len(records), 4) if slo and records else None,
        goodput_req_s=round(len(good) / wall, 4) if slo and wall > 0 else None,
        goodput_tok_s=round(sum(r.output_tokens for r in good) / wall, 2) if slo and wall > 0 else None,
        seq=seq,
        concurrency=concurrency,
        status=status,
        error=error,
        started_at=started_at,
        wall_s=round(wall, 4),
        first_index=first_index,
        requests=len(records),
        requests_ok=len(ok),
        requests_failed=len(failed),
        output_tokens=output_tokens,
        throughput_tok_s=round(output_tokens / wall, 2) if wall > 0 and ok else None,
        ttft=stats["ttft"],
        itl=stats["itl"],
        tpot=stats["tpot"],
        e2e=stats["e2e"],
        server=server,
        waited_for_kv=waited,
        wait_evidence=evidence,
        preempted=did_preempt,
        label=measured_label(outcome, cfg.max_num_seqs, by_budget is not None),
        waited_for_budget=True if by_budget is not None else None,
        predicted=predicted,
        notes=notes,
        server_scraped=scraped,
        engines=engines,
    )
    return result, request_rows


def server_figures(before: Snapshot | None, during: list[Snapshot], after: Snapshot | None) -> ServerFigures:
    """What one server's /metrics said over a point (kvplan.bench.metrics.summarize); up to its last fast scrape,
    marked ``incomplete``, when it could not be read after the point; nothing without a scrape before it."""
    if before is not None and after is not None:
        return summarize(before, during, after)
    if before is not None and during:
        return summarize(before, during, during[-1]).model_copy(update={"incomplete": True})
    return ServerFigures()


def pool_point(index: int, name: str, server: ServerFigures, cfg: BenchConfig, failed: bool,
               mine: list[RequestRecord] | None = None, predicted: PredictedPoint | None = None,
               engines: list[ReplicaPoint] | None = None) -> ReplicaPoint:
    """One KV pool during a point (a replica of a fleet, or an engine of a data-parallel server), judged as one
    server is (wait_evidence) at the load it held: ``mine``, the requests the client sent it; without them (behind a
    gateway, or an engine whose requests vLLM's DP coordinator chose) the most its own gauges showed at once.
    ``engines``: a data-parallel replica's own engines, which then judge it: it waited or preempted when one did."""
    held = peak_in_flight(mine) if mine is not None else int(server.peak_in_engine or 0)
    peak_wait = server.peak_waiting_capacity if server.peak_waiting_capacity is not None else server.peak_waiting
    evidence = wait_evidence(held, cfg.max_num_seqs, peak_wait, server.preemptions)
    did_preempt = preempted(server.preemptions)
    if engines:
        evidence = [f"{e} (engine {p.index})" for p in engines for e in p.wait_evidence]
        did_preempt = any(p.preempted for p in engines)
    admission_waits = max(0, held - (cfg.max_num_seqs or held))
    return ReplicaPoint(
        index=index, name=name,
        requests=None if mine is None else len(mine),
        requests_ok=None if mine is None else sum(1 for x in mine if x.ok),
        peak_in_flight=None if mine is None else held,
        server=server, waited_for_kv=bool(evidence), wait_evidence=evidence, preempted=did_preempt,
        label=pools_label([p.label for p in engines], failed) if engines else
        measured_label(PointOutcome(held, bool(evidence), did_preempt, failed), cfg.max_num_seqs),
        first_kv_wait_s=_first_seen([p.first_kv_wait_s for p in engines]) if engines else
        next((t for t, _, wait, _, pre in server.series if pre > 0 or wait > admission_waits), None),
        first_preemption_s=_first_seen([p.first_preemption_s for p in engines]) if engines else
        next((t for t, _, _, _, pre in server.series if pre > 0), None),
        predicted=predicted, engines=engines or None,
    )


def failed_point(point: PointResult, why: str) -> PointResult:
    """``point`` failed for ``why`` (the first reason kept, when it had failed already)."""
    return point.model_copy(update={"status": "failed", "error": point.error or why, "label": "failed"})


def pools_label(labels: list[str], failed: bool) -> str:
    """The label of several pools' point: what held back the first of them to be held back."""
    return "failed" if failed else next((x for x in ("KV-limited", "admission-limited") if x in labels), "neither")


def _first_seen(times: list[float | None]) -> float | None:
    seen = [t for t in times if t is not None]
    return min(seen) if seen else None


def engine_points(before: Snapshot | None, during: list[Snapshot], after: Snapshot | None, cfg: BenchConfig,
                  failed: bool) -> tuple[list[ReplicaPoint] | None, str | None]:
    """Each engine of a data-parallel server over a point (pool_point on its own figures), or None for one engine;
    with why the point cannot be judged by engine: engine labels that are no engines, or engines that came or went
    during the point (a restarted or rescaled server: its counters are not one engine's over the point)."""
    if before is None:
        return None, None
    scrapes = [before, *during, *([after] if after is not None else [])]
    why = next((s.engine_error for s in scrapes if s.engine_error), None)
    if why is not None:
        return None, f"the server's /metrics: {why}"
    names = sorted(before.engines)
    changed = next((s for s in scrapes if sorted(s.engines) != names), None)
    if changed is not None:
        return None, (f"the server's /metrics named engines {engine_list(sorted(changed.engines))} during the point, "
                      f"{engine_list(names)} before it: an engine came or went (a restart or a rescale), so no "
                      "engine's figures span the point")
    if not names:
        return None, None
    return [pool_point(i, f"engine {i}", server_figures(before.engines[i], [s.engines[i] for s in during],
                                                         None if after is None else after.engines[i]), cfg, failed)
            for i in names], None


def engine_list(indexes: list[int]) -> str:
    """Engine indexes for a message (none: one engine, unlabelled)."""
    return printable(", ".join(map(str, indexes)), 100) if indexes else "none (one engine)"


def peak_in_flight(records: list[RequestRecord]) -> int:
    """The most requests the client had sent and not yet seen end, at once."""
    events = []
    for r in records:
        if r.sent_s or r.end_s is not None:
            events.append((r.sent_s, 1))
            events.append((r.end_s if r.end_s is not None else float("inf"), -1))
    peak = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        peak = max(peak, now)
    return peak


def budget_wait(rule: Any, concurrency: int, evidence: list[str], server: ServerFigures) -> str | None:
    """Why the point's only evidence of a KV wait, the waiting gauge, is a wait for the token budget (a note for
    the point), or None. vLLM's waiting gauge counts a request the step never tried for want of budget as it
    counts one refused KV blocks (`Scheduler.make_stats`, v1/core/sched/scheduler.py@0.32.0); on a Mamba hybrid with
    a small budget the block-aligned split leaves a waiting request no chunk while another decodes
    (`_mamba_block_aligned_split`, then ``if num_new_tokens == 0: break``). So: when the hybrid simulator
    (kvplan.plan.hybrid_rule) predicts waits for the budget and none for KV at this load, and the pool as measured
    never filled past the point where a waiting request's admission blocks would not fit (peak KV usage x usable
    blocks + admission blocks <= usable blocks), the gauge's waits were not for KV. A preemption always counts."""
    waits_for_budget = getattr(rule, "waits_for_budget", None)
    if (waits_for_budget is None or evidence != ["waiting gauge"] or not waits_for_budget(concurrency)
            or rule.waits_for_kv(concurrency) or server.peak_kv_usage is None):
        return None
    usable, admit = rule.usable_blocks, rule.admit_blocks
    used = math.ceil(server.peak_kv_usage * usable - 1e-9)  # (the gauge is a share of the usable blocks)
    if used + admit > usable:
        return None
    return (f"budget-limited, not KV-limited: requests waited (the waiting gauge) for the token budget; the simulator "
            f"predicts waits for the budget and none for KV at {concurrency} streams, and KV usage peaked at {used} of "
            f"{usable} blocks, leaving room for a request's {admit} at admission")


def wait_evidence(concurrency: int, max_num_seqs: int | None, peak_waiting: float | None,
                  preemptions: float | None) -> list[str]:
    """Why kvplan says some request of the point waited for KV (empty: it did not); see
    sweep.waited_for_kv. (Client timing alone is not evidence: on a busy API server one request
    of a wave can reach the engine steps after the others and look queued.)"""
    out = []
    if preemptions:
        out.append("preemptions")
    if waited_for_kv(concurrency, max_num_seqs, peak_waiting, 0):
        out.append("waiting gauge")
    return out
