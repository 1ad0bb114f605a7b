"""EngineLauncher.stop() under a second Ctrl-C: the process group still ends.

The "engine" is a Python process that ignores SIGTERM (as a wedged server would), so stop()
waits its whole stop_timeout_s and then needs SIGKILL; a SIGINT that reached the caller in the
middle of that wait used to raise KeyboardInterrupt out of stop() and leave the engine running.
The caller is a child process here, so the SIGINT never reaches pytest itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from helpers.bench import group_alive

IGNORES_SIGTERM = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "print('hand' + 'ler set', flush=True)\n"  # not in the command line the log header shows
                   "time.sleep(120)\n")

CALLER = """
import json, os, signal, sys, threading, time
from pathlib import Path
from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port
log = Path(sys.argv[1])
cfg = EngineConfig(model="unused", port=free_port(), engine_cmd=(sys.executable, "-c", sys.argv[2]))
launcher = EngineLauncher(cfg, log, stop_timeout_s=1.5)
launcher.start()
print(json.dumps({"pgid": launcher.pid}), flush=True)
deadline = time.monotonic() + 30
while b"handler set" not in log.read_bytes() and time.monotonic() < deadline:
    time.sleep(0.05)
before = signal.getsignal(signal.SIGINT)
threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
started = time.monotonic()
launcher.stop()  # KeyboardInterrupt here, exit 1, if the SIGINT is not held off
print(json.dumps({"stop_s": time.monotonic() - started, "handler_back": signal.getsignal(signal.SIGINT) is before}))
"""


def test_a_second_ctrl_c_during_stop_does_not_leave_the_engine(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CALLER, str(tmp_path / "engine.log"), IGNORES_SIGTERM],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    pgid = lines[0]["pgid"] if lines else None
    try:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert pgid is not None and not group_alive(pgid)
        assert lines[1]["stop_s"] > 0.5, lines  # the SIGINT came while stop() was waiting
        assert lines[1]["handler_back"] is True  # the caller's own handler is back afterwards
    finally:
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


KILLED_CALLER = """
import json, sys, time
from pathlib import Path
from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port
cfg = EngineConfig(model="unused", port=free_port(), engine_cmd=(sys.executable, "-c", sys.argv[2]))
launcher = EngineLauncher(cfg, Path(sys.argv[1]), stop_timeout_s=1.5)
launcher.start()
print(json.dumps({"pgid": launcher.pid}), flush=True)
time.sleep(120)  # SIGKILLed here: no handler, no finally, no stop() runs
"""


def test_kvplan_killed_with_sigkill_does_not_leave_the_engine(tmp_path):
    """The OOM killer or a CI timeout sends SIGKILL: kvplan's own stop() never runs, and the engine (here
    one that ignores SIGTERM, as a wedged server would) must still end: the watchdog stops its group."""
    import time

    log = tmp_path / "engine.log"
    caller = subprocess.Popen([sys.executable, "-c", KILLED_CALLER, str(log), IGNORES_SIGTERM],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    pgid = None
    try:
        pgid = json.loads(caller.stdout.readline())["pgid"]
        deadline = time.monotonic() + 30
        while b"handler set" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b"handler set" in log.read_bytes()  # the engine runs, SIGTERM ignored
        caller.kill()
        caller.wait(10)
        deadline = time.monotonic() + 15  # the grace period (1.5 s), then SIGKILL
        while group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_alive(pgid)
    finally:
        caller.kill()
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
