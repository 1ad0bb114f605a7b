"""`kvplan bench`: drive a real vLLM server, measure KV pressure and latency, compare with the plan.

config.py (what a run is asked), engine.py (launch/stop/capacity), workload.py (requests), loads.py (a point's
load: closed, open, replay), profiles/ (which points a run measures: one module per load profile), loadgen.py
(streaming client), metrics.py (/metrics), point.py (a point's result, pure), sweep.py (onset and rate searches),
runner.py (one run), store.py (run folder), results.py (the typed results: summary.json, points.jsonl), outputs/
(one module per file a run writes), external.py (other harnesses' results), render.py (finished runs, offline),
view.py (progress display).
"""
