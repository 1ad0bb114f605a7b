"""The engine tests' engines, started ahead of their tests while the tests that need no engine run.

Why: those tests run first (tests/conftest.py) and, once the twins' probe is done, keep one core of CI's two busy (a
`.ci/run` of 2026-12-08 on the 2-core EPYC: 1.0 of 2 cores for 5.5 minutes), while each engine's start took 33-39 s of
the engine phase. So the engines the selected tests use (their fixtures' ``EngineSpec``: helpers.bench.PINNED and each
module's ``ENGINE``) start in the background when collection ends, one at a time, in the order their tests come, and
each waits, ready, for the fixture that takes it (``take``). The first starts once the twins' probe has ended (which
the tests that need no engine run beside): in a `.ci/run` of 2026-12-08 whose engines started beside the probe, the
first 5 minutes of those tests took 100 s longer than the day's run before (1.99 of 2 cores busy, against 1.5-1.8),
which took back most of what the engine phase gained (119 s) and the latency file (49 s).

They start at the idle priority (SCHED_IDLE: a core only when nothing else wants it), so that the tests and the twins'
probe beside them keep theirs: from a thread of that policy, which each child takes (Linux: a scheduling policy belongs
to a thread, and a child inherits its forking thread's). The fixture that takes one gives its every thread the normal
policy back (``promote``; the fixture then renices the engine's own processes as for any engine); so does ``take`` for
an engine still starting, which its tests now wait for. Giving the normal policy back needs CAP_SYS_NICE: where the
session cannot, nothing starts early and each fixture starts its own engine, as before. The thread stays alive until
``stop``: the engine's server dies with the thread that forked it (PR_SET_PDEATHSIG, kvplan.bench.engine).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers.bench import EngineSpec
    from kvplan.bench.engine import EngineLauncher

_early: EarlyEngines | None = None


class EarlyEngines:
    """Starts ``specs``' engines one at a time from a thread at the idle priority, each in its own folder under
    ``folder``."""

    def __init__(self, specs: list[EngineSpec], folder: Path, after: list[subprocess.Popen] = ()):
        self._specs = specs
        self._folder = folder
        self._after = list(after)  # processes whose end the first start waits for (the twins' probe)
        self._hurry = threading.Event()  # a fixture waits: no more waiting, and starts at the normal priority
        self._lock = threading.Lock()
        self._launchers: dict[str, EngineLauncher] = {}  # started and not yet taken
        self._settled = {spec.fixture: threading.Event() for spec in specs}  # ready, failed, or never started
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="early-engines", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from helpers.bench import engine_launcher
        from kvplan.bench.engine import EngineError

        tid = threading.get_native_id()
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        for proc in self._after:
            while proc.poll() is None and not self._hurry.is_set() and not self._stopping.is_set():
                self._hurry.wait(1.0)
        for spec in self._specs:
            try:
                launcher = engine_launcher(spec, self._folder / spec.fixture)
                with self._lock:
                    if self._stopping.is_set():
                        continue
                    if self._hurry.is_set():
                        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    launcher.start()
                    self._launchers[spec.fixture] = launcher
                with contextlib.suppress(EngineError):  # the fixture's own wait_ready says why
                    launcher.wait_ready()
            except Exception:  # noqa: BLE001 - the fixture starts this engine itself
                pass
            finally:
                self._settled[spec.fixture].set()
        self._stopping.wait()  # alive while its engines are: they die with the thread that forked them

    def take(self, fixture: str) -> EngineLauncher | None:
        """``fixture``'s engine once its start settled (ready, or ended: its ``wait_ready`` says why); None when it
        was not started here."""
        settled = self._settled.get(fixture)
        if settled is None:
            return None
        self._hurry.set()
        if not settled.is_set():  # its tests wait for it now: its start gets the normal priority
            with self._lock:
                starting = self._launchers.get(fixture)
            if starting is not None:
                promote(starting)
        settled.wait()
        with self._lock:
            return self._launchers.pop(fixture, None)

    def stop(self) -> None:
        """Stop, by PID, every engine started here and not taken, and the thread."""
        from helpers.bench import kill_group

        self._stopping.set()
        with self._lock:
            left = list(self._launchers.values())
            self._launchers.clear()
        for launcher in left:
            launcher.stop()
            kill_group(launcher.pid)
        self._thread.join(timeout=30)


def can_promote() -> bool:
    """Can this process give a thread at the idle priority the normal one back (CAP_SYS_NICE)? Tried on a thread of
    its own."""
    answer: list[bool] = []

    def attempt() -> None:
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            answer.append(os.sched_getscheduler(tid) == os.SCHED_OTHER)
        except (OSError, AttributeError):  # AttributeError: no SCHED_IDLE (not Linux)
            answer.append(False)

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return answer == [True]


def start(specs: list[EngineSpec], folder: Path, after: list[subprocess.Popen] = ()) -> bool:
    """Start ``specs``' engines ahead (see the module doc), once the processes ``after`` ended or a fixture takes one;
    False where this process could not give them the normal priority back."""
    global _early
    if not specs or not can_promote():
        return False
    _early = EarlyEngines(specs, folder, after)
    return True


def take(fixture: str) -> EngineLauncher | None:
    return None if _early is None else _early.take(fixture)


def stop() -> None:
    global _early
    if _early is not None:
        _early.stop()
        _early = None


def promote(launcher: EngineLauncher) -> None:
    """Every thread of the engine's processes (its server, the group's leader, and the server's children) at the
    normal priority, nice 0: where an early start left them at the idle one. (A thread that ends meanwhile is skipped;
    one started after it by a thread at the normal priority has that priority.)"""
    import psutil

    try:
        leader = psutil.Process(launcher.pid)
        processes = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return
    for process in processes:
        with contextlib.suppress(psutil.Error):
            for thread in process.threads():
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(thread.id, os.SCHED_OTHER, os.sched_param(0))
                    os.setpriority(os.PRIO_PROCESS, thread.id, 0)
