import os

import pytest


@pytest.fixture(autouse=True)
def _offline_and_isolated(tmp_path, monkeypatch):
    """No network, and a calibration folder of the test's own."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("KVPLAN_CONFIG_DIR", str(tmp_path / "kvplan-config"))
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)
    os.environ.setdefault("COLUMNS", "160")
