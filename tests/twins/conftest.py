"""Start the twins' vLLM probe when collection ends, so it builds its engines beside the tests that need
none (tests/conftest.py runs those first); the twin tests wait for it (``engine_results``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from helpers.twins import PROBE_RUN, ProbeRun

PROBE_FOLDER = pytest.StashKey[Path]()


def pytest_collection_finish(session) -> None:
    items = [item for item in session.items if "engine_results" in getattr(item, "fixturenames", ())]
    if not items or session.config.option.collectonly:
        return
    selected = {(item.callspec.params["profile"], item.callspec.params["variant"]) for item in items}
    folder = Path(tempfile.mkdtemp(prefix="kvplan-twins-"))
    session.config.stash[PROBE_FOLDER] = folder
    session.config.stash[PROBE_RUN] = ProbeRun(items[0].module.probe_cases(selected, folder), folder)


def pytest_unconfigure(config) -> None:
    """The probe is ours: stopped by PID however the session ends (Ctrl-C included), its folder removed."""
    run = config.stash.get(PROBE_RUN, None)
    if run is not None:
        run.stop()
    folder = config.stash.get(PROBE_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
