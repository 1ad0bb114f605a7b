"""points.csv (one row per point) and requests.csv (one row per request): latencies in ms."""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator

from kvplan.bench.loadgen import RequestRecord
from kvplan.bench.outputs.registry import output
from kvplan.bench.results import BenchSummary, LatencyStats, PointResult
from kvplan.bench.store import RunStore
from kvplan.term import csv_writer

#: A request's error as a spreadsheet cell: kvplan's own reasons are one line (error bodies are read up to 4 KiB);
#: a run file can hold any text, which a cell need not repeat whole.
MAX_ERROR_CELL = 4096

POINTS_CSV = "points.csv"
REQUESTS_CSV = "requests.csv"


@output("points-csv", POINTS_CSV, order=20)
def write_points_csv(summary: BenchSummary, store: RunStore) -> str:
    return points_csv(summary.points)


@output("requests-csv", REQUESTS_CSV, order=20)
def write_requests_csv(summary: BenchSummary, store: RunStore) -> Iterator[str]:
    return requests_csv(store.read_requests())


_STAT_KEYS = ("n", "mean", "p50", "p90", "p95", "p99")


def points_csv(points: list[PointResult]) -> str:
    """One row per point; latencies in ms, with the sample count of each metric."""
    head = ["seq", "mode", "concurrency", "rate", "burstiness", "max_concurrency", "status", "label", "latency_from",
            "wall_s", "requests", "requests_ok", "requests_failed", "output_tokens", "output_tok_s", "request_s",
            "preemptions", "peak_waiting", "peak_running", "peak_kv_usage", "predicted_label", "predicted_kv_fill",
            "slo_met", "goodput_share", "goodput_req_s", "goodput_tok_s", "retries"]
    for metric in ("ttft", "itl", "tpot", "e2e", "send_lag"):
        head += [f"{metric}_n"] + [f"{metric}_{k}_ms" for k in _STAT_KEYS[1:]]
    head += ["warnings", "error", "predicted_source"]
    head += [f"predicted_{m}_{k}_ms" for m in ("ttft", "itl", "tpot", "e2e") for k in ("p50", "p99")]
    head += ["predicted_output_tok_s"]
    head += [f"replay_{k}" for k in REPLAY_CSV_KEYS]  # --traffic points (kvplan.bench.replay); empty otherwise
    head += list(TIER_CSV_KEYS)  # the KV tier's counters where the server declares them
    head += ["waited_for_budget", "predicted_waits_for_budget"]  # waits for the token budget, not KV (kvplan.bench.point)
    buf = io.StringIO()
    w = csv_writer(buf)
    w.writerow(head)
    for p in points:
        srv, pred = p.server, p.predicted
        row = [p.seq, p.mode, p.concurrency, p.rate, p.burstiness, p.max_concurrency, p.status, p.label, p.latency_from,
               p.wall_s, p.requests, p.requests_ok, p.requests_failed, p.output_tokens, p.throughput_tok_s,
               p.request_throughput, srv.preemptions, srv.peak_waiting, srv.peak_running, srv.peak_kv_usage,
               None if pred is None else pred.label, None if pred is None else pred.kv_fill, p.slo_met, p.goodput_share,
               p.goodput_req_s, p.goodput_tok_s, p.retries]
        for metric in ("ttft", "itl", "tpot", "e2e", "send_lag"):
            stats: LatencyStats = getattr(p, metric)
            row.append(stats.n)
            row += [None if stats.stat(k) is None else round(stats.stat(k) * 1000, 3) for k in _STAT_KEYS[1:]]
        row += ["; ".join(p.warnings), p.error]
        lat = p.predicted_latency
        row.append(None if lat is None else lat.source)
        for m in ("ttft", "itl", "tpot", "e2e"):
            for k in ("p50", "p99"):
                v = None if lat is None else lat.stat(m, k)
                row.append(None if v is None else round(v * 1000, 3))
        row.append(None if lat is None else lat.output_tokens_per_s)
        row += [None if p.replay is None else getattr(p.replay, k) for k in REPLAY_CSV_KEYS]
        row += [getattr(srv, k) for k in TIER_CSV_KEYS]
        row += [p.waited_for_budget, None if pred is None else pred.waits_for_budget]
        w.writerow(["" if v is None else v for v in row])
    return buf.getvalue()


TIER_CSV_KEYS = ("external_queries", "external_hits", "offload_load_bytes", "offload_load_s", "offload_store_bytes",
                 "offload_store_s")
REPLAY_CSV_KEYS = ("sessions", "prefix_queries", "prefix_hits", "hit_rate", "predicted_hit_rate",
                   "predicted_hit_rate_low", "predicted_hit_rate_high", "predicted_preemption", "predicted_by")


def requests_csv(rows: Iterable[dict]) -> Iterator[str]:
    """One row per request (requests.jsonl): scheduled and actual send times, TTFT/E2E from the scheduled
    time, mean ITL per token, tokens. Yields the CSV a row at a time: the file grows with every request of the run."""
    head = ["seq", "concurrency", "rate", "index", "stream", "ok", "scheduled_s", "sent_s", "send_lag_ms",
            "first_token_s", "end_s", "ttft_ms", "e2e_ms", "tpot_ms", "itl_mean_ms", "deliveries", "prompt_tokens",
            "output_tokens", "retries", "error"]
    buf = io.StringIO()
    w = csv_writer(buf)
    w.writerow(head)

    def flush() -> str:
        text = buf.getvalue()
        buf.seek(0)
        buf.truncate()
        return text

    yield flush()
    for row in rows:
        try:
            rec = RequestRecord(int(row["index"]), int(row["stream"]), float(row["scheduled_s"]),
                                float(row.get("sent_s") or 0.0), row.get("first_token_s"), row.get("end_s"),
                                [float(t) for t in row.get("chunk_times_s") or []],
                                [int(k) for k in row.get("chunk_tokens") or []], row.get("prompt_tokens"),
                                int(row.get("output_tokens") or 0), int(row.get("max_tokens") or 0), bool(row.get("ok")),
                                row.get("error"))
        except (KeyError, TypeError, ValueError):
            continue  # not a line kvplan wrote
        itl = rec.itl_s

        def ms(v):
            return "" if v is None else round(v * 1000, 3)

        w.writerow([row.get("seq", ""), row.get("concurrency", ""), row.get("rate", ""), rec.index, rec.stream, rec.ok,
                    round(rec.scheduled_s, 6), round(rec.sent_s, 6), ms(rec.sent_s - rec.scheduled_s if rec.sent_s else None),
                    "" if rec.first_token_s is None else rec.first_token_s, "" if rec.end_s is None else rec.end_s,
                    ms(rec.ttft_s), ms(rec.e2e_s), ms(rec.tpot_s), ms(sum(itl) / len(itl) if itl else None),
                    len(rec.chunk_times_s), "" if rec.prompt_tokens is None else rec.prompt_tokens, rec.output_tokens,
                    row.get("retries", 0), (rec.error or "")[:MAX_ERROR_CELL]])
        yield flush()
