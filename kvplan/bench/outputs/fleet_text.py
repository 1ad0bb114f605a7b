"""The replicas of a fleet run (kvplan.bench.fleet) in the reports and the terminal: each replica's pool and own
onsets, the fleet's first wait and first preemption with the replica that reached it (predicted and measured), and
one row per point and replica. The same for the engines of a data-parallel server (BenchSummary.engines, each
engine a pool of its own). Nothing for a run of one server of one engine."""

from __future__ import annotations

from collections.abc import Callable

from kvplan.bench.outputs.text import int_or_none, load_text, num
from kvplan.bench.results import ONSETS, BenchSummary, FleetOnset, FleetSummary, PointResult, ReplicaPoint

#: The per-replica table's columns (terminal and report.md).
FLEET_HEAD = ("load", "replica", "requests", "peak in flight", "limit (plan)", "preemptions", "peak waiting",
              "KV peak (plan)", "prefix hits / queried")
#: The per-engine table's (a data-parallel server): the most it was seen holding (running + waiting) for the client's
#: counts, which do not say which engine the API server chose.
ENGINES_HEAD = ("load", "engine", "peak held", "limit", "preemptions", "peak waiting", "KV peak",
                "prefix hits / queried")

_ROUTES = {"round-robin": "round robin", "least-outstanding": "least outstanding requests",
           "gateway": "the gateway's own split", "data-parallel": "vLLM's DP coordinator"}


def _pools(summary: BenchSummary) -> list[tuple[FleetSummary, Callable[[PointResult], list[ReplicaPoint] | None]]]:
    """The run's sets of pools: its replicas, or a data-parallel server's engines (each with the points' figures)."""
    out = []
    if summary.fleet is not None:
        out.append((summary.fleet, lambda p: p.replicas))
    if summary.engines is not None:
        out.append((summary.engines, lambda p: p.engines))
    return out


def _noun(pools: FleetSummary) -> str:
    return "engine" if pools.route == "data-parallel" else "replica"


def _pool(pools: FleetSummary, index: int) -> str:
    replica = pools.replicas[index]
    cap, pred = replica.capacity, replica.prediction
    pool = f"{cap.num_blocks:,} blocks of {cap.block_size}" if cap.num_blocks and cap.block_size else "pool unknown"
    if pred is None:
        return pool
    return (f"{pool}; alone it waits for KV at {pred.first_kv_wait or 'never'}, "
            f"preempts at {pred.first_preemption or 'never'}")


def _onset(name: str, onset: FleetOnset, predicted_at_all: bool, noun: str = "replica") -> str:
    predicted = "predicted never" if predicted_at_all else "not predicted"
    if onset.predicted_earliest is not None:  # data parallel: the load's bounds, not which engine
        predicted = (f"predicted {onset.predicted_earliest} to {onset.predicted} streams ({onset.predicted} at the "
                     f"latest, {onset.predicted_share} of them on the first {noun}; below, the DP coordinator's timing "
                     f"decides; which {noun}: not determinate)")
    elif onset.predicted is not None:
        predicted = (f"predicted {onset.predicted} streams, replica {onset.predicted_replica} first "
                     f"({onset.predicted_share} of them on it)")
    measured = "not seen"
    if onset.measured is not None and noun == "engine":
        measured = f"measured {onset.measured}, {onset.measured_replica or 'engine ?'}"
    elif onset.measured is not None:
        measured = (f"measured {onset.measured}, replica {onset.measured_replica or '?'}"
                    + (f" ({onset.measured_in_flight} in flight on it)" if onset.measured_in_flight is not None else ""))
    verdict = "" if onset.agrees is None else ("; agrees" if onset.agrees else "; differs")
    return f"{name}: {predicted}; {measured}{verdict}"


def _predicted(pools: FleetSummary) -> bool:
    """Was the fleet predicted at all (every replica's pool known)?"""
    return all(r.prediction is not None for r in pools.replicas)


def fleet_lines(summary: BenchSummary) -> list[str]:
    """The terminal's lines above the per-replica (per-engine) table."""
    out = []
    for pools, _ in _pools(summary):
        noun = _noun(pools)
        if noun == "engine":
            out += [f"{len(pools.replicas)} engines behind {pools.gateway}, requests spread by {_ROUTES[pools.route]}; "
                    "each engine's figures from the server's /metrics (vLLM's engine label)"]
            out += [f"  {r.name}: {_pool(pools, i)}" for i, r in enumerate(pools.replicas)]
        else:
            via = f" through the gateway {pools.gateway}" if pools.gateway else ""
            out += [f"{len(pools.replicas)} replicas{via}, requests by {_ROUTES[pools.route]}; each replica's figures "
                    "from its own /metrics"]
            out += [f"  replica {r.index + 1}: {r.name} ({_pool(pools, r.index)})" for r in pools.replicas]
        out += [f"  first {_onset(name, pools.onset(key), _predicted(pools), noun)}"
                for key, name in zip(ONSETS, ("KV wait", "preemption"))]
        out.append(f"  prediction: {pools.prediction_basis}")
    return out


def fleet_tables(summary: BenchSummary) -> list[tuple[tuple[str, ...], list[tuple[str, ...]]]]:
    """(head, rows) of each set of pools (FLEET_HEAD; ENGINES_HEAD for a data-parallel server's engines)."""
    return [(ENGINES_HEAD, fleet_rows(summary.points, pools_of, engines=True)) if _noun(pools) == "engine"
            else (FLEET_HEAD, fleet_rows(summary.points, pools_of)) for pools, pools_of in _pools(summary)]


def fleet_rows(points: list[PointResult], pools_of: Callable[[PointResult], list[ReplicaPoint] | None] =
               lambda p: p.replicas, engines: bool = False) -> list[tuple[str, ...]]:
    """One row per point and replica (FLEET_HEAD), or per point and engine (``pools_of`` the points' engines,
    ``engines``: ENGINES_HEAD, without the client's counts, which do not say which engine served a request)."""
    short = {"KV-limited": "KV", "budget-limited": "budget", "admission-limited": "admission", "neither": "-",
             "failed": "failed"}
    rows = []
    for p in points:
        for r in pools_of(p) or []:
            srv, pr = r.server, r.predicted
            limit = short.get(r.label, r.label) + ("" if pr is None else f" ({short.get(pr.label, pr.label)})")
            kv = "-" if srv.peak_kv_usage is None else f"{srv.peak_kv_usage:.0%}"
            kv += "" if pr is None else f" ({pr.kv_fill:.0%})"
            hits = "-" if srv.prefix_queries is None else \
                f"{num(int_or_none(srv.prefix_hits))} / {num(int_or_none(srv.prefix_queries))}"
            counts = (str(r.index), num(int_or_none(srv.peak_in_engine))) if engines else \
                (str(r.index + 1), num(r.requests), num(r.peak_in_flight))
            rows.append((load_text(p), *counts, limit, num(int_or_none(srv.preemptions)),
                         num(int_or_none(srv.peak_waiting)), kv, hits))
    return rows


def fleet_markdown(summary: BenchSummary) -> list[str]:
    """report.md's "Replicas" section (a data-parallel server: "Engines")."""
    lines: list[str] = []
    for (pools, _), (head, rows) in zip(_pools(summary), fleet_tables(summary)):
        noun = _noun(pools)
        if noun == "engine":
            lines += ["", "## Engines", ""]
            lines.append(f"{len(pools.replicas)} engines behind {pools.gateway} (data parallel); requests spread by "
                         f"{_ROUTES[pools.route]}. Each engine's figures come from the server's /metrics (vLLM's "
                         "engine label); the server's onset is the load at which the first engine reaches its own.")
            lines += ["", "| engine | pool and its own onsets |", "|---:|---|"]
            lines += [f"| {r.index} | {_pool(pools, i)} |" for i, r in enumerate(pools.replicas)]
        else:
            lines += ["", "## Replicas", ""]
            via = f" through the gateway {pools.gateway}" if pools.gateway else ""
            lines.append(f"{len(pools.replicas)} replicas{via}; requests by {_ROUTES[pools.route]}. Each replica's "
                         "figures come from its own /metrics; the fleet's onset is the load at which the first replica "
                         "reaches its own.")
            lines += ["", "| replica | URL | /metrics of | pool and its own onsets |", "|---:|---|---|---|"]
            lines += [f"| {r.index + 1} | {r.name} | {r.metrics_url} | {_pool(pools, r.index)} |"
                      for r in pools.replicas]
        lines += [""] + [f"- first {_onset(name, pools.onset(key), _predicted(pools), noun)}"
                         for key, name in zip(ONSETS, ("KV wait", "preemption"))]
        lines += ["", f"Prediction: {pools.prediction_basis}."]
        if rows:
            lines += ["", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head),
                      *("| " + " | ".join(r) + " |" for r in rows)]
    return lines
