"""`kvplan bench`: drive a real vLLM server, measure KV pressure and latency, compare with the plan.

engine.py (launch/stop/capacity), workload.py (requests), loadgen.py (streaming client),
metrics.py (/metrics), sweep.py (onset search), runner.py (one run), store.py (run folder),
results.py (the typed results: summary.json, points.jsonl), outputs/ (one module per file a run
writes: registry.py, summary_json, markdown, csv, html, png), external.py (other harnesses' results), render.py (finished runs, offline),
view.py (progress display).
"""
