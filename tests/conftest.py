"""Shared test setup: no network but loopback, no user state."""

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path


def _session_folder(prefix: str) -> str:
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(functools.partial(shutil.rmtree, folder, ignore_errors=True))
    return folder


# Set before anything imports kvplan or huggingface_hub: tests never reach the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_CACHE", _session_folder("kvplan-hf-cache-"))
# User calibration profiles must not leak into tests.
os.environ["KVPLAN_CONFIG_DIR"] = _session_folder("kvplan-config-")
# No plot.png (matplotlib's import and drawing: 1.5 s of a 3.5 s `kvplan bench` run against the fake server, in each of
# the tests' bench runs and `kvplan report`s); the tests of the plot unset it (kvplan/bench/outputs/png.py).
os.environ["KVPLAN_NO_PLOT"] = "1"

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def pinned_cpu_engine(tmp_path_factory):
    """One real vLLM CPU engine (the tiny model, the pool pinned to 17 blocks of 32, context 512) for
    every test module that only sends it requests: started once a session (34-35 s on the 2-core EPYC), stopped
    by PID at the end. Each bench run sends prompts no other run shares (a nonce per run), and reads
    counter deltas, so the modules cannot see each other's traffic."""
    from helpers.bench import cpu_engine_fixture

    yield from cpu_engine_fixture(tmp_path_factory)


def _phase(item) -> int:
    """0: needs no engine; 1: a twin, answered by the probe started at collection (tests/twins/conftest.py);
    2: starts or uses a real engine; 3: judges the engine's speed against a calibration (marked ``alone``)."""
    if item.get_closest_marker("engine") is None:
        return 0
    if item.get_closest_marker("alone") is not None:
        return 3
    return 1 if "engine_results" in getattr(item, "fixturenames", ()) else 2


def pytest_collection_modifyitems(config, items) -> None:
    """The tests that need no engine run first, beside the twins' probe (niced: they keep their core) and the engines
    started ahead (helpers.early_engines, at the idle priority); then the twins, whose engines were built meanwhile;
    then the engine tests, whose timings see no probe; last the tests that judge the engine's speed, alone on the
    machine. Within a phase the order is pytest's own (a stable sort)."""
    items.sort(key=_phase)


@pytest.hookimpl(trylast=True)  # after tests/twins/conftest.py started the twins' probe, which they wait for
def pytest_collection_finish(session) -> None:
    """The engines of the selected engine tests start ahead, in the order of their first tests (helpers.early_engines),
    when tests that need no engine run before them."""
    from helpers.bench import HAVE_VLLM, PINNED
    from helpers.twins import PROBE_RUN

    items = session.items
    if session.config.option.collectonly or not HAVE_VLLM or not any(_phase(item) == 0 for item in items):
        return
    specs: dict = {}
    for item in items:
        if _phase(item) >= 2:
            for spec in (PINNED, getattr(item.module, "ENGINE", None)):
                if spec is not None and spec.fixture in getattr(item, "fixturenames", ()):
                    specs.setdefault(spec.fixture, spec)
    if specs:
        from helpers import early_engines

        probe = session.config.stash.get(PROBE_RUN, None)
        early_engines.start(list(specs.values()), Path(_session_folder("kvplan-early-engines-")),
                            [proc for proc, _, _ in probe.running] if probe is not None else [])


def pytest_unconfigure(config) -> None:
    """The engines started ahead are ours: stopped by PID however the session ends (Ctrl-C included)."""
    from helpers import early_engines

    early_engines.stop()


#: .ci/run names a file here and starts its dependency-floors job, at the idle priority, once the file exists: the
#: engine tests leave about a core idle, which that job takes (tests/bench/test_bench_engine.py and
#: test_replay_engine.py kept 0.84 of 2 cores busy, the engine's start included). The first engine test creates it.
ENGINE_PHASE_FILE = "KVPLAN_ENGINE_PHASE_STARTED"
#: .ci/run sets it to the PID of that job: the tests that judge the engine's speed compare runs minutes apart, so
#: the first of them waits for the job to end (at most MAX_WAIT_S).
WAIT_FOR_PID = "KVPLAN_ENGINE_TESTS_WAIT_FOR"
MAX_WAIT_S = 1800.0
_signalled = _waited = False


def _running(pid: int) -> bool:
    """Alive and not a zombie (the job ends before its parent shell reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def pytest_runtest_setup(item) -> None:
    global _signalled, _waited
    phase = _phase(item)
    if phase >= 2 and not _signalled:
        _signalled = True
        if os.environ.get(ENGINE_PHASE_FILE):
            open(os.environ[ENGINE_PHASE_FILE], "a").close()
    if _waited or phase != 3:
        return
    _waited = True
    pid = os.environ.get(WAIT_FOR_PID, "")
    if pid.isdigit():
        import time

        deadline = time.monotonic() + MAX_WAIT_S
        while _running(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
