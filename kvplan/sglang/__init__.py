"""SGLang: its pool rules by release (rules.py, read in its wheels) and its pool for a deployment (pool.py).
docs/engines-sglang-rules.md quotes the lines each rule follows."""
