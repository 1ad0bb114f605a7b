"""Shared test setup: no network but loopback, no user state."""

import os
import tempfile

# Set before anything imports kvplan or huggingface_hub: tests never reach the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_CACHE", tempfile.mkdtemp(prefix="kvplan-hf-cache-"))
# User calibration profiles must not leak into tests.
os.environ["KVPLAN_CONFIG_DIR"] = tempfile.mkdtemp(prefix="kvplan-config-")
