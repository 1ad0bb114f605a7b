"""`kvplan bench`: drive a real vLLM server, measure KV pressure and latency, compare with the plan.

engine.py (launch/stop/capacity), workload.py (requests), loadgen.py (streaming client),
metrics.py (/metrics), sweep.py (onset search), runner.py (one run), store.py (run folder),
report.py (summary, Markdown, PNG), view.py (progress display).
"""
