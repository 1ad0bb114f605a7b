"""A signal while a point's event loop runs: the work is cancelled, the process's own handler runs
after the loop has closed, and asyncio has no orphaned task exception to print (CI once showed a
"Task exception was never retrieved" traceback when KeyboardInterrupt was raised inside aiohttp)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from kvplan.bench.loadgen import run_stoppable


async def _busy_workers(started: asyncio.Event | None = None, n: int = 32):
    async def worker():
        while True:
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(worker()) for _ in range(n)]

    async def signal_self():
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    tasks.append(asyncio.create_task(signal_self()))
    await asyncio.gather(*tasks)


def test_a_signal_inside_the_loop_reaches_the_handler_after_the_loop(caplog):
    seen: list[tuple[int, bool]] = []

    def handler(signum, frame):
        seen.append((signum, _loop_running()))
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(KeyboardInterrupt):
            run_stoppable(_busy_workers())
        assert seen == [(signal.SIGTERM, False)]
        assert signal.getsignal(signal.SIGTERM) is handler  # put back after the loop
        assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_without_a_signal_the_result_comes_back():
    async def answer():
        await asyncio.sleep(0)
        return 42

    assert run_stoppable(answer()) == 42


def test_an_error_inside_the_loop_is_raised_as_itself():
    async def boom():
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        run_stoppable(boom())


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
