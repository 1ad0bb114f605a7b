"""TensorRT-LLM: its pool rules (rules.py), its start-up lines (startup_log.py) and its page math (pool.py).
docs/engines-trtllm-rules.md quotes the source each rule follows."""
