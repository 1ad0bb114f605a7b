"""EngineLauncher.stop() under a second Ctrl-C: the process group still ends.

The "engine" is a Python process that ignores SIGTERM (as a wedged server would), so stop()
waits its whole stop_timeout_s and then needs SIGKILL; a SIGINT sent to the test's own process
in the middle of that wait used to raise KeyboardInterrupt out of stop() and leave it running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from bench_helpers import group_alive

from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port

IGNORES_SIGTERM = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "print('hand' + 'ler set', flush=True)\n"  # not in the command line the log header shows
                   "time.sleep(120)\n")


def test_a_second_ctrl_c_during_stop_does_not_leave_the_engine(tmp_path):
    cfg = EngineConfig(model="unused", port=free_port(), engine_cmd=(sys.executable, "-c", IGNORES_SIGTERM))
    launcher = EngineLauncher(cfg, tmp_path / "engine.log", stop_timeout_s=1.5)
    launcher.start()
    pgid = launcher.pid
    try:
        deadline = time.monotonic() + 30
        while b"handler set" not in (tmp_path / "engine.log").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)  # the child has installed its SIGTERM handler
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        before = signal.getsignal(signal.SIGINT)
        launcher.stop()  # raises KeyboardInterrupt here if the SIGINT is not held off
        timer.join()
        assert not group_alive(pgid)
        assert signal.getsignal(signal.SIGINT) is before  # the caller's handler is back
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
