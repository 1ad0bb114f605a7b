"""What several test folders share, importable from any test as ``helpers.X`` (pyproject's pytest ``pythonpath``
puts tests/ on the path): bench.py (the tiny model, the CPU engine fixture, the kvplan command), fake_server.py (a
lying or slow OpenAI-style server for failure paths), harness.py (running kvplan as a user does, with bounds),
twins.py (the twins' vLLM probe started at collection)."""
