"""Start, watch and stop an engine's OpenAI-compatible server (vLLM's: the engine door, kvplan.engines, gives its
command and reads back the capacity it reports).

The engine runs as a subprocess in its **own process group** (``start_new_session``), so one
``killpg`` reaches the API server, the EngineCore and its workers, and a Ctrl-C typed at the
terminal reaches kvplan only: kvplan decides when the engine stops. ``stop()`` sends SIGTERM to
the group, waits, then SIGKILLs whatever is left. On Linux the API server also gets
``PR_SET_PDEATHSIG`` so it is told to stop even if kvplan itself is killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.bench.client import Client
from kvplan.bench.store import _open_nofollow
from kvplan.engines import engine_named
from kvplan.errors import KvplanError
from kvplan.paths import open_user_file
from kvplan.vllm.args import EngineArgs
from kvplan.vllm.startup_log import redact


class EngineError(KvplanError):
    """The engine did not start, or died; carries the tail of its log."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail

    def __str__(self) -> str:
        if not self.log_tail:
            return self.message
        return f"{self.message}; last log lines:\n{self.log_tail}"


@dataclass(frozen=True)
class EngineConfig:
    """What `vllm serve` is given: the engine arguments (kvplan.vllm.args.EngineArgs, ``None`` leaving vLLM's
    default) and how to launch it."""

    model: str
    args: EngineArgs = EngineArgs()
    engine: str = "vllm"  # the registered engine (kvplan.engines) whose server this launches
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    engine_cmd: tuple[str, ...] = ()  # replaces the launcher prefix (`python -m ...`)
    env: tuple[tuple[str, str], ...] = ()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def build_command(cfg: EngineConfig, prefix: list[str] | None = None) -> list[str]:
    """The full engine command line: the engine's server (after ``prefix``, else found by the engine) with its
    planned flags (kvplan.engines: ``Engine.server_command``), then the pass-through args."""
    server = engine_named(cfg.engine).server_command(cfg.model, cfg.host, cfg.port, cfg.served_model_name, cfg.args,
                                                      prefix)
    return server + list(cfg.extra_args)


# Engine flags whose value is a secret -> the environment variable vLLM (or huggingface_hub) reads instead.
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}


def secret_args_to_env(args) -> tuple[list[str], dict[str, str]]:
    """``--api-key K`` / ``--hf-token=T`` taken out of the engine's arguments into its environment,
    so vLLM neither shows them in ``ps`` nor prints them in its "non-default args" log line."""
    out: list[str] = []
    env: dict[str, str] = {}
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        flag, eq, value = arg.partition("=")
        name = SECRET_FLAGS.get(flag.replace("_", "-"))
        if name and eq:
            env[name] = value
        elif name and i + 1 < len(items):
            env[name] = items[i + 1]
            i += 1
        else:
            out.append(arg)
        i += 1
    return out, env


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    except (OSError, UnicodeError) as exc:  # socket.gaierror: an unresolvable --host
        raise KvplanError(f"cannot listen on host {host!r}: {getattr(exc, 'strerror', None) or exc}",
                          "pass --host with an address of this machine, e.g. 127.0.0.1") from None


def tail(path: Path, lines: int = 15, width: int = 300) -> str:
    """The last lines of a log file (each cut to ``width`` characters)."""

    try:
        with open_user_file(path, "", limit=None) as fh:  # the end only: a huge log is never read whole
            size = fh.seek(0, 2)
            fh.seek(max(0, size - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except (OSError, KvplanError):
        return ""
    kept = [redact(line[:width]) for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept)


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort, not Linux/glibc
        pass


def http_get(url: str, timeout_s: float = 2.0, api_key: str | None = None,
             headers: tuple[tuple[str, str], ...] = ()) -> tuple[int, str]:
    """(status, body) of a GET to an engine kvplan started (reached directly, never through a proxy);
    status 0 when nothing answered. ``api_key`` and ``headers`` are sent as the load generator sends them."""

    return Client(api_key=api_key, headers=tuple(headers), use_env_proxy=False).get(url, timeout_s)


#: The watchdog beside every engine kvplan starts: it waits for EOF on a pipe only kvplan holds, which
#: the kernel closes however kvplan ends (SIGKILL by the OOM killer or a CI timeout included), then stops
#: the engine's process group as ``EngineLauncher.stop`` would: SIGTERM, the grace period, SIGKILL.
#: (PR_SET_PDEATHSIG alone reaches only the group leader, with a SIGTERM a wedged server may ignore.)
_WATCHDOG = """
import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
signal.signal(signal.SIGINT, signal.SIG_IGN)
sys.stdin.buffer.read()
def alive():
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
if alive():
    try:
        os.killpg(pgid, signal.SIGTERM)
    except OSError:
        pass
    end = time.monotonic() + grace
    while alive() and time.monotonic() < end:
        time.sleep(0.1)
    if alive():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
"""


def _start_watchdog(pgid: int, grace_s: float) -> subprocess.Popen | None:
    try:
        return subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(pgid), str(grace_s)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:  # pragma: no cover - no process to spare: stop() and PR_SET_PDEATHSIG remain
        return None


def _end_watchdog(watchdog: subprocess.Popen | None) -> None:
    """After ``stop()``: the group is gone, so the watchdog finds nothing to stop and exits."""
    if watchdog is None:
        return
    with contextlib.suppress(OSError):
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        watchdog.kill()


@dataclass
class EngineLauncher:
    """One engine subprocess: ``start()``, ``wait_ready()``, ``stop()``; also a context manager."""

    cfg: EngineConfig
    log_path: Path
    startup_timeout_s: float = 900.0
    stop_timeout_s: float = 20.0
    api_key: str | None = field(default=None, repr=False)  # the engine requires it; the probe sends it
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # --header: the probe sends them
    proc: subprocess.Popen | None = field(default=None, init=False)
    command: list[str] = field(default_factory=list, init=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        if not port_is_free(self.cfg.host, self.cfg.port):
            raise KvplanError(
                f"port {self.cfg.port} on {self.cfg.host} is taken",
                "stop what listens there, pick another --port, or attach to it with --url",
            )
        prefix = list(self.cfg.engine_cmd) or None  # None: the engine's own server, found in this environment
        args, secret_env = secret_args_to_env(self.cfg.extra_args)
        self.command = build_command(dataclasses.replace(self.cfg, extra_args=tuple(args)), prefix)
        env = dict(os.environ)
        env.update(dict(self.cfg.env))
        if self.api_key and "VLLM_API_KEY" not in secret_env:
            secret_env["VLLM_API_KEY"] = self.api_key
        self.api_key = secret_env.get("VLLM_API_KEY") or None  # --engine-arg=--api-key=K: the probe sends K
        env.update(secret_env)  # the engine reads them from its environment: never on its command line or in its log
        self.log_path.parent.mkdir(parents=True, exist_ok=True)

        log = os.fdopen(_open_nofollow(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")

        log.write(f"# kvplan: {redact(shlex.join(self.command))}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,  # noqa: PLW1509
            )
        except OSError as exc:
            log.close()
            raise KvplanError(f"cannot start the engine ({self.command[0]}): {exc.strerror or exc}") from None
        self._log = log
        self._watchdog = _start_watchdog(self.proc.pid, self.stop_timeout_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, on_tick=None) -> float:
        """Block until ``/health`` and ``/v1/models`` answer 200; seconds it took."""
        assert self.proc is not None
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise EngineError(
                    f"the engine exited with code {code} before it was ready (log: {self.log_path})",
                    tail(self.log_path),
                )
            elapsed = time.monotonic() - start
            if elapsed > self.startup_timeout_s:
                raise EngineError(
                    f"the engine was not ready after {self.startup_timeout_s:.0f} s (log: {self.log_path})",
                    tail(self.log_path),
                )
            if (http_get(self.cfg.base_url + "/health", api_key=self.api_key, headers=self.headers)[0] == 200
                    and http_get(self.cfg.base_url + "/v1/models", api_key=self.api_key, headers=self.headers)[0] == 200):
                return elapsed
            if on_tick:
                on_tick(elapsed)
            time.sleep(0.5)

    def stop(self) -> int | None:
        """Stop the whole process group: SIGTERM, wait, SIGKILL. Returns the exit code. A second
        Ctrl-C meanwhile is ignored (the stop is bounded: stop_timeout_s + 10 s), so that no caller's
        interrupt can leave the engine behind."""
        if self.proc is None:
            return None
        with no_interrupts():
            return self._stop()

    def _stop(self) -> int | None:
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        while time.monotonic() < deadline and _group_alive(pgid):
            self.proc.poll()
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and _group_alive(pgid):
                self.proc.poll()
                time.sleep(0.05)
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        log = getattr(self, "_log", None)
        if log and not log.closed:
            log.close()
        _end_watchdog(getattr(self, "_watchdog", None))
        return code

    def yield_cpu_to_front_end(self, niceness: int = 19) -> int:
        """Lower the priority of every thread of the engine's own processes (EngineCore, its workers),
        not of the API server that leads the group; returns how many processes were reniced.

        Why: vLLM's CPU backend pins its worker's OpenMP threads and keeps one core for the EngineCore,
        whose busy-poll loop never sleeps while requests run (vllm/utils/ompmultiprocessing.py@0.32.0:
        "TODO: make scheduler proc sleep when idle"). On a 2-core host that leaves the API server and
        the load generator the scraps: a wave of requests then reaches the engine tens of steps apart,
        and what is measured is the host, not the KV pool. With the engine niced, the front end runs
        first whenever it has work, so requests sent together are scheduled together."""
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil ships with vLLM
            return 0
        if self.proc is None:
            return 0
        count = 0
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return 0
        for child in children:
            # Every thread, not the process: on Linux a nice value belongs to one thread, and the
            # threads started before this call (the EngineCore's socket threads, the worker's OpenMP
            # threads: 59 of 61 measured on the CPU build 0.32.0) would otherwise keep nice 0.
            try:
                threads = child.threads()
            except psutil.Error:
                continue
            reniced = False
            for thread in threads:
                try:
                    os.setpriority(os.PRIO_PROCESS, thread.id, max(os.getpriority(os.PRIO_PROCESS, thread.id), niceness))
                    reniced = True
                except OSError:  # the thread ended meanwhile
                    continue
            count += reniced
        return count

    def __enter__(self) -> EngineLauncher:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class no_interrupts:
    """Ignore Ctrl-C, SIGTERM and SIGHUP while an engine is being stopped and results written (a
    second signal must not leave an engine behind or a summary unwritten); restored afterwards.
    A Python no-op handler, not SIG_IGN: nothing about it is inherited by a process started later."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")

    def __enter__(self) -> None:
        self._old: dict[int, object] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._old[sig] = signal.signal(sig, _ignore_signal)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _ignore_signal(signum, frame) -> None:
    return None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of our own child excluded)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(…, 0) also succeeds for an unreaped zombie leader; look for a live member.
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil ships with vLLM
        return True
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False
