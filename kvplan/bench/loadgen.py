"""Closed-loop streaming load: ``concurrency`` streams, each sending its next request when the
previous one ends, with every timestamp taken on one monotonic clock.

Definitions (all times in seconds, measured by the client; the README states the same):

- **scheduled time**: when the request was meant to go out: the point's start for a stream's
  first request, the end of the stream's previous request after that. Latencies count from
  here, not from when a connection happened to be free, so a slow client or pool cannot hide
  server delay (no coordinated omission, vllm#54101). The connection pool holds as many
  connections as there are streams, so in practice send time = scheduled time.
- **TTFT** = arrival of the first streamed chunk carrying output - scheduled time (includes
  queueing for KV, as a user sees it).
- **ITL** = gaps between successive output chunks of one request (vLLM streams one chunk per
  generated token without speculative decoding).
- **TPOT** = (E2E - TTFT) / (output_tokens - 1), vLLM's definition (``vllm bench serve``);
  undefined for one output token.
- **E2E** = end of the stream (``[DONE]``) - scheduled time.
- **output tokens** = the server's ``usage.completion_tokens`` (else the chunks counted).
- **useful throughput** = output tokens of completed requests / the point's wall time.

aiohttp gets a connector limited to the concurrency, one connection per request (no keep-alive
race with the server), and a large read buffer: the 64 KiB default breaks SSE lines of long
contexts (vllm#39963).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvplan.bench.workload import RequestSpec

READ_BUFSIZE = 1 << 24  # 16 MiB per connection; SSE lines of a 128k-token context fit


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds since the point's start."""

    index: int
    stream: int
    scheduled_s: float
    sent_s: float = 0.0
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    max_tokens: int = 0
    ok: bool = False
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.scheduled_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.scheduled_s

    @property
    def itl_s(self) -> list[float]:
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        return {
            "index": self.index,
            "stream": self.stream,
            "ok": self.ok,
            "error": self.error,
            "scheduled_s": round(self.scheduled_s, 6),
            "sent_s": round(self.sent_s, 6),
            "first_token_s": None if self.first_token_s is None else round(self.first_token_s, 6),
            "end_s": None if self.end_s is None else round(self.end_s, 6),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "max_tokens": self.max_tokens,
            "chunk_times_s": [round(t, 6) for t in self.chunk_times_s],
        }


@dataclass
class LoadResult:
    records: list[RequestRecord]
    wall_s: float
    aborted: str | None = None  # why the point stopped early (server gone, engine dead)


class StopSignal(asyncio.Event):
    """An asyncio.Event that also says why the point was stopped."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.set()


class ServerGone(Exception):
    """The connection failed in a way that means the server is not there any more."""


def completion_body(spec: RequestSpec, model: str, api: str) -> dict:
    body: dict = {
        "model": model,
        "max_tokens": spec.max_tokens,
        "ignore_eos": True,  # vLLM extension: exactly max_tokens tokens come back
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt_text or ""}]
    else:
        body["prompt"] = list(spec.prompt_token_ids) if spec.prompt_token_ids is not None else spec.prompt_text
    return body


async def stream_one(session, url: str, body: dict, rec: RequestRecord, clock: Callable[[], float]) -> None:
    """Send one streaming request and fill ``rec``; raise ServerGone when the server vanished."""
    import aiohttp

    rec.sent_s = clock()
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300].replace("\n", " ")
                rec.error = f"HTTP {resp.status}: {text}"
                rec.end_s = clock()
                return
            done = False
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                now = clock()
                try:
                    chunk = json.loads(data)
                except ValueError:
                    chunk = None
                if not isinstance(chunk, dict):
                    rec.error = f"bad stream chunk: {data[:120]!r}"
                    break
                if "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"]
                    rec.error = f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
                    break
                usage = chunk.get("usage")
                if isinstance(usage, dict):
                    rec.prompt_tokens = _count(usage.get("prompt_tokens"), rec.prompt_tokens)
                    rec.output_tokens = _count(usage.get("completion_tokens"), rec.output_tokens) or 0
                choices = chunk.get("choices") or []
                if isinstance(choices, list) and choices and isinstance(choices[0], dict) and _has_output(choices[0]):
                    if rec.first_token_s is None:
                        rec.first_token_s = now
                    rec.chunk_times_s.append(now)
            rec.end_s = clock()
            if not rec.output_tokens:
                rec.output_tokens = len(rec.chunk_times_s)
            if done and rec.error is None:
                rec.ok = True
            elif rec.error is None:
                rec.error = "stream ended before [DONE]"
                raise ServerGone(rec.error)
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
            aiohttp.ClientOSError, ConnectionResetError) as exc:
        rec.end_s = clock()
        rec.error = f"{type(exc).__name__}: {exc}".strip()
        raise ServerGone(rec.error) from None
    except asyncio.TimeoutError:
        rec.end_s = clock()
        rec.error = "timed out waiting for the server"


def _count(value, default: int | None) -> int | None:
    """A token count from the server's usage: a non-negative int, else the previous value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 1 << 40:
        return default
    return value


def _has_output(choice: dict) -> bool:
    if choice.get("text") or choice.get("token_ids"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))
    return choice.get("finish_reason") is None and "text" in choice


async def run_closed_loop(
    base_url: str,
    model: str,
    api: str,
    concurrency: int,
    requests_per_stream: int,
    spec_for: Callable[[int], RequestSpec],
    first_index: int = 0,
    request_timeout_s: float = 300.0,
    stop: StopSignal | None = None,
    on_request_done: Callable[[RequestRecord], None] | None = None,
    keep_alive: bool = False,
    api_key: str | None = None,
) -> LoadResult:
    """``concurrency`` streams x ``requests_per_stream`` requests; request ``k`` of stream ``s``
    is number ``first_index + k * concurrency + s`` of the run. ``api_key`` is sent as
    ``Authorization: Bearer`` (vLLM's --api-key); it is never part of a record.

    Whatever goes wrong inside one request (a malformed stream, a client error, a bug) makes that
    request a failed one with the reason; it never escapes as an unretrieved task exception."""
    import aiohttp

    from kvplan.bench.engine import auth_headers, split_credentials

    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    base_url, basic = split_credentials(base_url)
    url = base_url.rstrip("/") + path
    headers = auth_headers(api_key, basic)
    stop = stop or StopSignal()
    records: list[RequestRecord] = []
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    # One connection per request (force_close): a closed loop sends the next request the moment the
    # previous response ends, which is exactly the race in which uvicorn's keep-alive timer drops a
    # connection holding a new request (uvicorn#824; seen here as "Server disconnected" seconds after
    # sending). A loopback connect costs ~0.1 ms and counts in TTFT, as it does for a new user.
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency,
                                     force_close=not keep_alive)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFSIZE,
                                     headers=headers) as session:

        async def stream_worker(stream: int) -> None:
            scheduled = 0.0
            for k in range(requests_per_stream):
                if stop.is_set():
                    return
                number = first_index + k * concurrency + stream
                rec = RequestRecord(number, stream, scheduled)
                records.append(rec)
                try:
                    spec = spec_for(number)
                    rec.index, rec.max_tokens = spec.index, spec.max_tokens
                    await stream_one(session, url, completion_body(spec, model, api), rec, clock)
                except ServerGone as exc:
                    stop.stop(f"the server went away ({exc})")
                except Exception as exc:  # noqa: BLE001 - one request's failure, recorded as such
                    rec.ok = False
                    rec.error = rec.error or f"{type(exc).__name__}: {exc}"[:500]
                    if rec.end_s is None:
                        rec.end_s = clock()
                if rec.ok is False and rec.error is None:
                    rec.error = "the request did not complete"
                if on_request_done:
                    with contextlib.suppress(Exception):  # a display callback never stops the load
                        on_request_done(rec)
                scheduled = clock()

        tasks = [asyncio.create_task(stream_worker(s)) for s in range(concurrency)]
        stopper = asyncio.create_task(stop.wait())
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
            if stopper in done:
                # Stopped from outside (engine dead, Ctrl-C): give in-flight requests a moment to fail.
                _, still = await asyncio.wait(pending, timeout=2.0) if pending else (set(), set())
                for task in still:
                    task.cancel()
                await asyncio.gather(*still, return_exceptions=True)
                break
        stopper.cancel()
        await asyncio.gather(stopper, *tasks, return_exceptions=True)  # no task exception left unretrieved
    for rec in records:
        if rec.end_s is None and rec.error is None:
            rec.error = "cancelled"
    wall = clock()
    return LoadResult(records, wall, stop.reason if stop.is_set() else None)
