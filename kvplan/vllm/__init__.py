"""Everything that faces vLLM: its release rules (rules.py), the flags it takes (args.py), the
start-up log it prints (startup_log.py), the metric names it exposes (metric_names.py), and the
probes that ask the installed vLLM itself (twin.py, probe.py, engine_layout.py)."""
