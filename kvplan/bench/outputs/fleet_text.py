"""The replicas of a fleet run (kvplan.bench.fleet) in the reports and the terminal: each replica's pool and own
onsets, the fleet's first wait and first preemption with the replica that reached it (predicted and measured), and
one row per point and replica. Nothing for a run of one server."""

from __future__ import annotations

from kvplan.bench.outputs.text import int_or_none, load_text, num
from kvplan.bench.results import ONSETS, BenchSummary, FleetOnset, PointResult

#: The per-replica table's columns (terminal and report.md).
FLEET_HEAD = ("load", "replica", "requests", "peak in flight", "limit (plan)", "preemptions", "peak waiting",
              "KV peak (plan)", "prefix hits / queried")

_ROUTES = {"round-robin": "round robin", "least-outstanding": "least outstanding requests",
           "gateway": "the gateway's own split"}


def _pool(summary: BenchSummary, index: int) -> str:
    replica = summary.fleet.replicas[index]
    cap, pred = replica.capacity, replica.prediction
    pool = f"{cap.num_blocks:,} blocks of {cap.block_size}" if cap.num_blocks and cap.block_size else "pool unknown"
    if pred is None:
        return pool
    return (f"{pool}; alone it waits for KV at {pred.first_kv_wait or 'never'}, "
            f"preempts at {pred.first_preemption or 'never'}")


def _onset(name: str, onset: FleetOnset, predicted_at_all: bool) -> str:
    predicted = "predicted never" if predicted_at_all else "not predicted"
    if onset.predicted is not None:
        predicted = (f"predicted {onset.predicted} streams, replica {onset.predicted_replica} first "
                     f"({onset.predicted_share} of them on it)")
    measured = "not seen"
    if onset.measured is not None:
        measured = (f"measured {onset.measured}, replica {onset.measured_replica or '?'}"
                    + (f" ({onset.measured_in_flight} in flight on it)" if onset.measured_in_flight is not None else ""))
    verdict = "" if onset.agrees is None else ("; agrees" if onset.agrees else "; differs")
    return f"{name}: {predicted}; {measured}{verdict}"


def _predicted(summary: BenchSummary) -> bool:
    """Was the fleet predicted at all (every replica's pool known)?"""
    return all(r.prediction is not None for r in summary.fleet.replicas)


def fleet_lines(summary: BenchSummary) -> list[str]:
    """The terminal's lines above the per-replica table."""
    fleet = summary.fleet
    if fleet is None:
        return []
    via = f" through the gateway {fleet.gateway}" if fleet.gateway else ""
    out = [f"{len(fleet.replicas)} replicas{via}, requests by {_ROUTES[fleet.route]}; each replica's figures from "
           "its own /metrics"]
    out += [f"  replica {r.index + 1}: {r.name} ({_pool(summary, r.index)})" for r in fleet.replicas]
    out += [f"  first {_onset(name, fleet.onset(key), _predicted(summary))}"
            for key, name in zip(ONSETS, ("KV wait", "preemption"))]
    out.append(f"  prediction: {fleet.prediction_basis}")
    return out


def fleet_rows(points: list[PointResult]) -> list[tuple[str, ...]]:
    """One row per point and replica (FLEET_HEAD)."""
    short = {"KV-limited": "KV", "admission-limited": "admission", "neither": "-", "failed": "failed"}
    rows = []
    for p in points:
        for r in p.replicas or []:
            srv, pr = r.server, r.predicted
            limit = short.get(r.label, r.label) + ("" if pr is None else f" ({short.get(pr.label, pr.label)})")
            kv = "-" if srv.peak_kv_usage is None else f"{srv.peak_kv_usage:.0%}"
            kv += "" if pr is None else f" ({pr.kv_fill:.0%})"
            hits = "-" if srv.prefix_queries is None else \
                f"{num(int_or_none(srv.prefix_hits))} / {num(int_or_none(srv.prefix_queries))}"
            rows.append((load_text(p), str(r.index + 1), num(r.requests), num(r.peak_in_flight), limit,
                         num(int_or_none(srv.preemptions)), num(int_or_none(srv.peak_waiting)), kv, hits))
    return rows


def fleet_markdown(summary: BenchSummary) -> list[str]:
    """report.md's "Replicas" section."""
    fleet = summary.fleet
    if fleet is None:
        return []
    lines = ["", "## Replicas", ""]
    via = f" through the gateway {fleet.gateway}" if fleet.gateway else ""
    lines.append(f"{len(fleet.replicas)} replicas{via}; requests by {_ROUTES[fleet.route]}. Each replica's figures "
                 "come from its own /metrics; the fleet's onset is the load at which the first replica reaches its own.")
    lines += ["", "| replica | URL | /metrics of | pool and its own onsets |", "|---:|---|---|---|"]
    lines += [f"| {r.index + 1} | {r.name} | {r.metrics_url} | {_pool(summary, r.index)} |" for r in fleet.replicas]
    lines += [""] + [f"- first {_onset(name, fleet.onset(key), _predicted(summary))}"
                     for key, name in zip(ONSETS, ("KV wait", "preemption"))]
    lines += ["", f"Prediction: {fleet.prediction_basis}."]
    rows = fleet_rows(summary.points)
    if rows:
        lines += ["", "| " + " | ".join(FLEET_HEAD) + " |", "|" + "---:|" * len(FLEET_HEAD),
                  *("| " + " | ".join(r) + " |" for r in rows)]
    return lines
