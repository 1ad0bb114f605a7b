"""The engines the engine tests serve, started ahead of the tests that use them.

Starting a CPU engine is 45-55 s on one core, nearly all of it imports: three processes one after another, each
importing vLLM (the API server; the EngineCore it spawns; the worker the EngineCore spawns: the CPU platform always
spawns, vllm/platforms/cpu.py@0.32.0). The engine tests leave about a core idle (tests/bench/test_bench_engine.py and
test_replay_engine.py kept 0.84 of 2 busy). So when the first engine test is about to run (tests/conftest.py) one
thread starts, one after another and in the order the selected tests will first need them, whatever ENGINE_JOBS
(tests/helpers/bench.py) names among those tests' fixtures; each fixture then takes its engine (`Prestarts.take`),
waiting for it if it is not ready yet, and stops it after its last test, as it did when it started the engine itself.
An idle engine costs no CPU (its EngineCore's busy loop runs only while requests do).

Not earlier: started when collection ended, beside the tests that need none, the engines slowed those tests more than
they saved (a `.ci/run` on the 2-core EPYC, 2026-12-07: the tests that need no engine 909 s of its `--durations`
against 728 s, the engine tests 613 s against 706 s): those tests, their `kvplan` processes and servers and the twins'
probe keep both cores busy.

The engines are ours: `stop` stops every engine a job started, by PID, however the session ends. The thread stays
alive until then: kvplan's launcher asks the kernel to stop the engine when the thread that started it ends
(PR_SET_PDEATHSIG, kvplan/bench/engine.py)."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

#: A job: (a folder of its own, a callback that takes ownership of each launcher the job starts) -> its value
#: (the engine's launcher, ready; or what the fixture returns).
Job = Callable[[Path, Callable[[object], None]], object]

_KEY = pytest.StashKey["Prestarts"]()


class Prestarts:
    """Jobs run in one background thread, in order; their values taken by name."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="kvplan-engines-"))
        self._owned: list = []
        self._scheduled: dict[str, threading.Event] = {}
        self._values: dict[str, tuple[bool, object]] = {}
        self._release = threading.Event()
        self._thread: threading.Thread | None = None

    def schedule(self, jobs: list[tuple[str, Job]]) -> None:
        """Start running ``jobs`` ahead, one after another."""
        if not jobs:
            return
        self._scheduled = {name: threading.Event() for name, _ in jobs}
        runs = [(name, job, self._scheduled[name]) for name, job in jobs]  # take() pops its entry of _scheduled
        self._thread = threading.Thread(target=self._run, args=(runs,), name="kvplan-prestart", daemon=True)
        self._thread.start()

    def _run(self, runs: list[tuple[str, Job, threading.Event]]) -> None:
        try:
            for name, job, done in runs:
                if self._release.is_set():
                    break
                self._values[name] = self._call(name, job)
                done.set()
        finally:
            self._release.wait()  # see the module's note: the engines live while this thread does

    def _call(self, name: str, job: Job) -> tuple[bool, object]:
        try:
            return True, job(self.folder / name, self._owned.append)
        except BaseException as exc:  # noqa: BLE001 - a skip or a failure, raised again where the fixture takes it
            return False, exc

    def take(self, name: str, job: Job) -> object:
        """``name``'s value: the one started ahead (waiting for it), or ``job`` run now where it was not scheduled
        (or was taken already: a fixture set up again)."""
        done = self._scheduled.pop(name, None)
        if done is None:
            ok, value = self._call(name, job)
        else:
            while not done.wait(1.0):  # a short wait: Ctrl-C reaches the main thread between them
                pass
            ok, value = self._values.pop(name)
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Stop every engine a job started (the thread's next one included), then remove the folder."""
        self._release.set()
        for launcher in list(self._owned):
            launcher.stop()
        if self._thread is not None:
            self._thread.join(timeout=60)  # a start under way ends once its engine is stopped
            for launcher in list(self._owned):
                launcher.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def prestarts(config: pytest.Config) -> Prestarts:
    """The session's Prestarts (created on first use)."""
    if _KEY not in config.stash:
        config.stash[_KEY] = Prestarts()
    return config.stash[_KEY]


def schedule_for(session: pytest.Session, jobs: dict[str, Job]) -> None:
    """Schedule the ``jobs`` whose fixture names the selected tests use, in the order of the first test using each."""
    if session.config.option.collectonly or session.config.option.setupplan:  # no fixture will run
        return
    order: dict[str, Job] = {}
    for item in session.items:
        for name in getattr(item, "fixturenames", ()):
            if name in jobs and name not in order:
                order[name] = jobs[name]
    prestarts(session.config).schedule(list(order.items()))


def stop(config: pytest.Config) -> None:
    if _KEY in config.stash:
        config.stash[_KEY].stop()
