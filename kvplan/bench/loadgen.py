"""Streaming load, closed loop (``concurrency`` streams, each sending its next request when the
previous one ends) or open loop (requests at ``rate`` per second, Poisson or gamma arrivals,
optionally capped at ``max_concurrency`` in flight), every timestamp on one monotonic clock.

Definitions (all times in seconds, measured by the client; the README states the same):

- **scheduled time**: when the request was meant to go out. Closed loop: the point's start for
  a stream's first request, the end of the stream's previous request after that. Open loop:
  the arrival drawn for it (the point's start + the sum of the inter-arrival gaps). Latencies
  count from here, not from when a connection or a concurrency slot happened to be free, so a
  slow client, pool or cap cannot hide server delay (no coordinated omission, vllm#54101).
- **sent time**: when the client actually handed the request to the connection (recorded per
  request as ``sent_s``; ``sent_s - scheduled_s`` is the point's ``send_lag``). A request resent
  after a stale keep-alive connection dropped it keeps its first send time (``retries`` says so).
- **TTFT** = arrival of the first streamed chunk carrying output - scheduled time (includes
  queueing for KV, as a user sees it).
- **ITL** = per output token: the gap between two successive *deliveries* of output (the
  events the client read in one go from the socket) divided by the tokens the later delivery
  carried. One event is one token unless it carries ``token_ids``; when the server's usage
  counts more tokens than events (speculative decoding, stream intervals), the extra tokens are
  spread evenly over the gaps. So a burst of tokens read together never shows as "0.0 ms".
- **TPOT** = (E2E - TTFT) / (output_tokens - 1), vLLM's definition (``vllm bench serve``);
  undefined for one output token.
- **E2E** = end of the stream (``[DONE]``) - scheduled time.
- **output tokens** = the server's ``usage.completion_tokens`` (else the chunks counted).
- **useful throughput** = output tokens of completed requests / the point's wall time.

aiohttp gets a connector limited to the concurrency and a stream reader of its own with a 16 MiB
line limit: aiohttp's 64 KiB default breaks SSE lines of long contexts (vllm#39963).

Connections are kept alive and reused (``keep_alive=False``: one connection per request, as
before). Reuse has one hazard: the server closes an idle keep-alive connection on a timer, and a
request written into it at that instant fails although the server never read it (uvicorn#824).
Two defences: the client drops a pooled connection after ``IDLE_KEEP_ALIVE_S``, well before
vLLM's API server would (see the constant), and a request that fails on a *reused* connection
before any response byte arrived is sent again, once, on a fresh connection. The retry keeps the
request's scheduled time, so what it cost shows in its latencies; ``RequestRecord.retries`` and
``LoadResult.retries`` count it. A failure on a fresh connection is never retried: the server is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from kvplan.bench.client import REDIRECT_HINT, Client, is_redirect
from kvplan.bench.route import Router
from kvplan.bench.workload import RequestSpec

READ_BUFSIZE = 1 << 24  # 16 MiB per connection; SSE lines of a 128k-token context fit

#: Seconds a pooled connection may sit idle before the client drops it. vLLM's API server closes an
#: idle keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds, 5 by default
#: (https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/envs.py, passed to uvicorn as
#: timeout_keep_alive in vllm/entrypoints/launchers/api_server/entry.py), counted from the moment
#: it finished the previous response (uvicorn arms the timer in on_response_complete and cancels it
#: when the next request's bytes arrive,
#: https://github.com/Kludex/uvicorn/blob/0.54.0/uvicorn/protocols/http/httptools_impl.py).
#: The client's idle clock starts a little later (when it read the end of that response) and the
#: server's loop may be late reading the next request, so the limit sits well below 5 s; a server
#: configured shorter, or a stalled one, is what the retry is for.
IDLE_KEEP_ALIVE_S = 2.0
# How early a scheduled send stops sleeping and starts yielding to the loop until its time
# (`_LoadContext.wait_until`): the loop's timers are late by up to ~1 ms, more when it is busy.
TIMER_SLACK_S = 0.002


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds since the point's start."""

    index: int
    stream: int
    scheduled_s: float
    sent_s: float = 0.0
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # one per delivery of output
    chunk_tokens: list[int] = field(default_factory=list)  # output tokens in each delivery (events, token_ids)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    max_tokens: int = 0
    ok: bool = False
    error: str | None = None
    retries: int = 0  # sent again on a fresh connection after a stale keep-alive one dropped it
    # usage.prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache (vLLM
    # reports it with --enable-prompt-tokens-details); None when the server does not say
    cached_tokens: int | None = None
    replica: int | None = None  # --url A --url B: which replica it went to (0-based, kvplan.bench.route); None: one URL

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.scheduled_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.scheduled_s

    @property
    def multi_token_chunks(self) -> bool:
        """Did some delivery carry more than one token (or usage count more tokens than events)?"""
        counted = sum(self._tokens())
        return any(k > 1 for k in self._tokens()) or (self.output_tokens > counted > 0)

    def _tokens(self) -> list[int]:
        if len(self.chunk_tokens) == len(self.chunk_times_s):
            return self.chunk_tokens
        return [1] * len(self.chunk_times_s)

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies, one per output token after the first delivery (see the module doc)."""
        t = self.chunk_times_s
        if len(t) < 2:
            return []
        tokens = self._tokens()
        later = sum(tokens[1:])
        extra = max(0, self.output_tokens - sum(tokens)) if self.output_tokens else 0
        scale = (later + extra) / later if later else 1.0
        out: list[float] = []
        for i in range(1, len(t)):
            k = tokens[i] * scale
            gap = (t[i] - t[i - 1]) / k
            out.extend([gap] * max(1, int(round(k))))
        return out

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
            **({"chunk_tokens": list(self.chunk_tokens)} if any(k != 1 for k in self.chunk_tokens) else {}),
            **({"retries": self.retries} if self.retries else {}),
            **({"cached_tokens": self.cached_tokens} if self.cached_tokens is not None else {}),
            **({"replica": self.replica} if self.replica is not None else {}),
        }


@dataclass
class LoadResult:
    records: list[RequestRecord]
    wall_s: float
    aborted: str | None = None  # why the point stopped early (server gone, engine dead)

    @property
    def retries(self) -> int:
        """Requests sent again after a reused connection dropped them unread (see the module doc)."""
        return sum(r.retries for r in self.records)


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


def run_stoppable(coro):
    """``asyncio.run(coro)``, where SIGINT/SIGTERM/SIGHUP while the loop runs cancel the work and
    reach the process's own handler only after the loop has closed. Raising KeyboardInterrupt from
    a handler inside the loop would leave tasks whose exception is never retrieved, and asyncio
    prints their tracebacks on the way out."""
    import signal

    wanted = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {signum: signal.getsignal(signum) for signum in wanted}
    received: list[int] = []

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        installed = []

        def stop(signum: int) -> None:
            received.append(signum)
            task.cancel()

        try:
            for signum in wanted:
                try:
                    loop.add_signal_handler(signum, stop, signum)
                    installed.append(signum)
                except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
                    break
            return await coro
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
                signal.signal(signum, previous[signum])

    try:
        result = asyncio.run(main())
    except BaseException:
        if not received:
            raise
    else:
        if not received:
            return result
    # hand the first signal to the handler that was there before (kvplan's: stop like Ctrl-C)
    handler = previous[received[0]]
    if callable(handler):
        handler(received[0], None)
    raise KeyboardInterrupt


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


async def stream_one(session, url: str, body: dict, rec: RequestRecord, clock: Callable[[], float],
                     request_kwargs: dict | None = None, fresh_session=None) -> None:
    """Send one streaming request and fill ``rec``; raise ServerGone when the server vanished.
    ``request_kwargs``: headers and proxy of the request (kvplan.bench.client.Client.aio_kwargs).
    ``fresh_session`` (one connection per request): where a request that a reused connection of
    ``session`` dropped unread is sent again (see the module doc); None: no retry."""
    import aiohttp

    rec.sent_s = clock()
    try:
        resp = await _post(session, url, body, rec, request_kwargs or {}, fresh_session)
        async with resp:
            if resp.status != 200:
                if is_redirect(resp.status):
                    rec.error = f"HTTP {resp.status}, a redirect: {REDIRECT_HINT}"
                else:
                    text = (await read_at_most(resp.content, ERROR_BODY_BYTES)).decode(errors="replace")
                    rec.error = f"HTTP {resp.status}: {text[:300]}".replace("\n", " ")
                rec.end_s = clock()
                return
            done = False
            buffer = b""
            streamed = 0  # output tokens delivered so far
            finished_s = None  # when the choice's finish_reason came, on a chunk with no text
            async for data_in in resp.content.iter_any():
                # Everything read in one go is one delivery: its events share one timestamp, and
                # the output tokens they carry count together (ITL per token, not per event).
                now = clock()
                buffer += data_in
                *lines, buffer = buffer.split(b"\n")
                if len(buffer) > READ_BUFSIZE:
                    rec.error = f"an SSE line longer than {READ_BUFSIZE >> 20} MiB"
                    break
                delivered = 0
                stop_reading = False
                for raw in lines:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        stop_reading = True
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        chunk = None
                    if not isinstance(chunk, dict):
                        rec.error = f"bad stream chunk: {data[:120]!r}"
                        stop_reading = True
                        break
                    if "error" in chunk and not chunk.get("choices"):
                        err = chunk["error"]
                        rec.error = f"server error: {err.get('message', err) if isinstance(err, dict) else err}"
                        stop_reading = True
                        break
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        rec.prompt_tokens = _count(usage.get("prompt_tokens"), rec.prompt_tokens)
                        rec.output_tokens = _count(usage.get("completion_tokens"), rec.output_tokens) or 0
                        details = usage.get("prompt_tokens_details")
                        if isinstance(details, dict):
                            rec.cached_tokens = _count(details.get("cached_tokens"), rec.cached_tokens)
                    choices = chunk.get("choices") or []
                    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                        if _has_output(choices[0]):
                            ids = choices[0].get("token_ids")
                            delivered += len(ids) if isinstance(ids, list) and ids else 1
                        elif choices[0].get("finish_reason") is not None and finished_s is None:
                            finished_s = now
                streamed += delivered
                if rec.error is None and rec.max_tokens and streamed > rec.max_tokens + 1:
                    rec.error = f"the server streamed more tokens than max_tokens {rec.max_tokens:,}: not trusted"
                    stop_reading = True  # an endless stream ends here, not at a timeout
                if delivered:
                    if rec.first_token_s is None:
                        rec.first_token_s = now
                    rec.chunk_times_s.append(now)
                    rec.chunk_tokens.append(delivered)
                if stop_reading:
                    break
            rec.end_s = clock()
            if not rec.output_tokens:
                rec.output_tokens = sum(rec.chunk_tokens)
            if done and not rec.chunk_tokens and finished_s is not None and rec.output_tokens:
                _all_in_final_chunk(rec, finished_s)
            if done and rec.error is None:
                rec.error = implausible(rec)
            if done and rec.error is None:
                rec.ok = True
                await _drain(resp)
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


class _Reuse:
    """Per-request trace context: did the connector hand this request a pooled connection?"""

    reused = False


async def _on_reuse(session, trace_ctx, params) -> None:
    trace_ctx.trace_request_ctx.reused = True


def implausible(rec: RequestRecord) -> str | None:
    """Why a finished stream's own figures cannot be true (a failed request, not a measurement): more
    output tokens than ``max_tokens`` allows (a lying ``usage``: 40,000,000 tokens for ``max_tokens`` 4
    would be a point at 1.3 G tokens/s), or ``[DONE]`` with no token before it (``max_tokens`` >= 1 and
    ``ignore_eos``: vLLM streams at least one)."""
    if rec.max_tokens and rec.output_tokens > rec.max_tokens:
        return (f"the server reported {rec.output_tokens:,} output tokens for max_tokens {rec.max_tokens:,}: "
                "not trusted")
    if rec.max_tokens and not rec.chunk_tokens:
        return "the stream ended ([DONE]) before any token"
    return None


#: The longest one request may take, start to end, however steadily the server sends bytes.
REQUEST_DEADLINE_S = 3600.0

#: How much of an error response is read (a server may send an endless body with its 500).
ERROR_BODY_BYTES = 4096


async def read_at_most(content, limit: int) -> bytes:
    """Up to ``limit`` bytes of an aiohttp stream, never more, whatever the server keeps sending."""
    parts, size = [], 0
    while size < limit:
        chunk = await content.read(limit - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


def reuse_tracer():
    """An aiohttp TraceConfig that marks a request's ``_Reuse`` context when its connection is reused."""
    import aiohttp

    tracer = aiohttp.TraceConfig()
    tracer.on_connection_reuseconn.append(_on_reuse)
    return tracer


async def _post(session, url: str, body: dict, rec: RequestRecord, request_kwargs: dict, fresh_session):
    """POST and return the response once its status line arrived. A reused keep-alive connection that
    the server closed as the request went out (nothing came back) gets the request once more on a
    fresh connection: the server never read it, so resending cannot run it twice."""
    import aiohttp

    reuse = _Reuse()
    try:
        return await session.post(url, json=body, trace_request_ctx=reuse, **request_kwargs)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError) as exc:
        # A connect failure (ClientConnectorError is a ClientOSError) is on a new connection: no retry.
        if fresh_session is None or not reuse.reused or isinstance(exc, aiohttp.ClientConnectorError):
            raise
    rec.retries += 1
    return await fresh_session.post(url, json=body, **request_kwargs)


async def _drain(resp, limit: int = 1 << 16, wait_s: float = 0.1) -> None:
    """Read what follows [DONE] (the chunked body's terminator, a separate write of the server's):
    aiohttp closes a connection whose response is released before the body's end instead of
    reusing it. A server that sends more than ``limit`` bytes after [DONE], or takes longer than
    ``wait_s`` to end the body, only loses the connection; the request is complete either way."""
    import aiohttp

    left = limit
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        while left > 0 and (data := await asyncio.wait_for(resp.content.readany(), wait_s)):
            left -= len(data)


def _count(value, default: int | None) -> int | None:
    """A token count from the server's usage: a non-negative int, else the previous value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 1 << 40:
        return default
    return value


def _all_in_final_chunk(rec: RequestRecord, finished_s: float) -> None:
    """Record a stream whose only output was its final chunk, textless, as one delivery of the tokens ``usage``
    counted. vLLM merges the outputs its API server has not yet sent into one (``RequestOutputCollector``,
    https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/engine/output_processor.py) and sends a chunk per
    merged output (completion/serving.py, chat_completion/serving.py@0.32.0): a busy server can send tokens whose
    text is empty (special tokens, skipped) as one chunk whose finish_reason is set, the first output the client sees.
    A final chunk whose tokens ``usage`` does not count stays what it was, a stream with no token."""
    rec.first_token_s = finished_s
    rec.chunk_times_s.append(finished_s)
    rec.chunk_tokens.append(rec.output_tokens)


def _has_output(choice: dict) -> bool:
    if choice.get("text") or choice.get("token_ids"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))
    return choice.get("finish_reason") is None and "text" in choice


def arrival_times(rate: float, count: int | None, duration_s: float | None, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Scheduled send times (seconds from the point's start) of an open-loop point: gaps drawn from a
    gamma distribution of mean ``1 / rate`` and shape ``burstiness`` (1: Poisson arrivals; < 1
    burstier, > 1 more regular), as ``vllm bench serve --burstiness``. The first request goes at 0.
    Stops after ``count`` requests or at ``duration_s``, whichever comes first."""
    import random

    if not rate > 0 or not burstiness > 0:
        raise ValueError("rate and burstiness must be > 0")
    if count is None and duration_s is None:
        raise ValueError("an open-loop point needs a request count or a duration")
    rng = random.Random(f"arrivals:{seed}:{rate!r}:{burstiness!r}")
    theta = 1.0 / (rate * burstiness)
    out: list[float] = []
    t = 0.0
    while count is None or len(out) < count:
        if duration_s is not None and t >= duration_s:
            break
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
        if len(out) >= 10_000_000:
            break
    return out


async def run_closed_loop(
    base_url: str,
    model: str,
    api: str,
    concurrency: int,
    requests_per_stream: int | None,
    spec_for: Callable[[int], RequestSpec],
    first_index: int = 0,
    request_timeout_s: float = 300.0,
    stop: StopSignal | None = None,
    on_request_done: Callable[[RequestRecord], None] | None = None,
    keep_alive: bool = True,
    api_key: str | None = None,
    total_requests: int | None = None,
    duration_s: float | None = None,
    client: Client | None = None,
    router: Router | None = None,
) -> LoadResult:
    """``concurrency`` streams. With ``requests_per_stream``: each stream sends that many, request
    ``k`` of stream ``s`` being number ``first_index + k * concurrency + s`` of the run. Otherwise
    the streams share a budget of ``total_requests`` (numbered in the order they go out) and/or
    stop sending new requests once ``duration_s`` has passed (requests in flight finish).
    ``api_key`` is sent as ``Authorization: Bearer`` (vLLM's --api-key); it is never part of a record.
    ``client`` (instead of ``api_key``): the key, extra headers and the proxy decision of the run.
    ``router`` (kvplan.bench.route): each request goes to the replica it picks (``base_url`` is then unused).

    Whatever goes wrong inside one request (a malformed stream, a client error, a bug) makes that
    request a failed one with the reason; it never escapes as an unretrieved task exception."""
    if requests_per_stream is None and total_requests is None and duration_s is None:
        raise ValueError("a closed-loop point needs requests per stream, a request count or a duration")
    taken = [0]

    async def body(ctx: _LoadContext) -> None:
        async def stream_worker(stream: int) -> None:
            scheduled = 0.0
            k = 0
            while not ctx.stop.is_set():
                if requests_per_stream is not None:
                    if k >= requests_per_stream:
                        return
                    number = first_index + k * concurrency + stream
                else:
                    if total_requests is not None and taken[0] >= total_requests:
                        return
                    number = first_index + taken[0]
                    taken[0] += 1
                if duration_s is not None and ctx.clock() >= duration_s:
                    return
                k += 1
                await ctx.one(number, stream, scheduled)
                scheduled = ctx.clock()

        await ctx.run_tasks([asyncio.create_task(stream_worker(s)) for s in range(concurrency)])

    return await _run_load(base_url, model, api, concurrency, spec_for, request_timeout_s, stop, on_request_done,
                           keep_alive, client or Client(api_key=api_key), body, router)


async def run_open_loop(
    base_url: str,
    model: str,
    api: str,
    rate: float,
    spec_for: Callable[[int], RequestSpec],
    first_index: int = 0,
    total_requests: int | None = None,
    duration_s: float | None = None,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    seed: int = 0,
    request_timeout_s: float = 300.0,
    stop: StopSignal | None = None,
    on_request_done: Callable[[RequestRecord], None] | None = None,
    keep_alive: bool = True,
    api_key: str | None = None,
    client: Client | None = None,
    router: Router | None = None,
) -> LoadResult:
    """Requests at ``rate`` per second (see ``arrival_times``), each sent at its scheduled time, or
    when one of ``max_concurrency`` slots frees up; latencies still count from the scheduled time
    (the wait for a slot is the server's delay as a user sees it). ``stream`` of a record is the
    order of its arrival."""
    times = arrival_times(rate, total_requests, duration_s, burstiness, seed)
    limit = max_concurrency or max(1, min(len(times), 4096))

    async def body(ctx: _LoadContext) -> None:
        slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        tasks: list[asyncio.Task] = []

        async def send(i: int, at: float) -> None:
            if not await ctx.wait_until(at):
                return
            if slots is None:
                await ctx.one(first_index + i, i, at)
                return
            async with slots:
                if not ctx.stop.is_set():
                    await ctx.one(first_index + i, i, at)

        for i, at in enumerate(times):
            if not await ctx.dispatch_before(at):
                break
            tasks.append(asyncio.create_task(send(i, at)))
        if tasks:
            await ctx.run_tasks(tasks)

    return await _run_load(base_url, model, api, limit, spec_for, request_timeout_s, stop, on_request_done,
                           keep_alive, client or Client(api_key=api_key), body, router)


@dataclass(frozen=True)
class SessionSend:
    """When a replay sends request ``number``: at ``at_s`` (seconds from the start), or ``think_s``
    after request ``after`` (the previous turn of its session) has ended."""

    number: int
    session: int
    at_s: float | None = None
    after: int | None = None
    think_s: float = 0.0


async def run_sessions(
    base_url: str,
    model: str,
    api: str,
    sends: list[SessionSend],
    spec_for: Callable[[int], RequestSpec],
    request_timeout_s: float = 300.0,
    stop: StopSignal | None = None,
    on_request_done: Callable[[RequestRecord], None] | None = None,
    keep_alive: bool = True,
    client: Client | None = None,
) -> LoadResult:
    """Replay sessions: each request goes at its timestamp, or its think time after the previous turn
    of its session ended (a turn whose previous one failed is not sent: its history would be a lie).
    Latencies count from the scheduled time; ``stream`` of a record is its session. A session's
    turns run one after the other, sessions side by side."""
    by_session: dict[int, list[SessionSend]] = {}
    for send in sends:
        by_session.setdefault(send.session, []).append(send)
    connections = max(1, min(len(by_session), 4096))

    async def body(ctx: _LoadContext) -> None:
        async def session_worker(turns: list[SessionSend]) -> None:
            ended: float | None = None
            for send in turns:
                at = send.at_s if send.at_s is not None else (ended or 0.0) + send.think_s
                if not await ctx.wait_until(at):  # (the first turn: dispatched just before its time)
                    return
                rec = await ctx.one(send.number, send.session, at)
                if not rec.ok:
                    return
                ended = rec.end_s

        # One dispatcher starts each session at its first turn's time (as the open loop sends requests),
        # so only the sessions under way hold a task and a timer: a trace of 10,000 sessions is not
        # 10,000 sleepers on one event loop.
        starts = sorted(by_session.values(), key=lambda turns: turns[0].at_s or 0.0)
        tasks: list[asyncio.Task] = []
        for turns in starts:
            if not await ctx.dispatch_before(turns[0].at_s or 0.0):
                break
            tasks.append(asyncio.create_task(session_worker(turns)))
        if tasks:
            await ctx.run_tasks(tasks)

    return await _run_load(base_url, model, api, connections, spec_for, request_timeout_s, stop, on_request_done,
                           keep_alive, client or Client(), body)


class _LoadContext:
    """What the closed and the open loop share: the session, the clock, one request, the stop."""

    def __init__(self, session, url: str, model: str, api: str, spec_for, stop: StopSignal, records: list,
                 clock, on_request_done, request_kwargs: dict | None = None, fresh_session=None,
                 router: Router | None = None, targets: list[tuple[str, dict]] | None = None) -> None:
        self.session, self.url, self.model, self.api = session, url, model, api
        self.fresh_session = fresh_session
        self.request_kwargs = request_kwargs or {}
        self.router, self.targets = router, targets or []  # a fleet: (url, request kwargs) of each replica
        self.spec_for, self.stop, self.records, self.clock = spec_for, stop, records, clock
        self.on_request_done = on_request_done

    async def wait_until(self, at: float) -> bool:
        """Sleep until ``at`` (seconds on the point's clock), waking early on a stop; False when stopped.
        The loop's timers fire late by up to a millisecond and more (epoll's timeout is whole milliseconds,
        rounded up, and other callbacks run first), so the sleep ends ``TIMER_SLACK_S`` early and the rest
        is spent yielding to the loop (responses keep being read) until the clock reaches ``at``."""
        await self._sleep_until(at - TIMER_SLACK_S)
        while self.clock() < at and not self.stop.is_set():
            await asyncio.sleep(0)
        return not self.stop.is_set()

    async def dispatch_before(self, at: float) -> bool:
        """Sleep until ``TIMER_SLACK_S`` before ``at`` (no yielding after); False when stopped. A dispatcher waits
        so, then starts the task that sends at ``at``, which waits for it itself (`wait_until`): its send then
        follows the clock with no turn of the loop between. A task started at ``at`` runs one turn later, behind
        every callback ready then (responses being read): the replay's send skew p99 was about 1 ms at 500
        requests/s (benchmarks/bench_replay_skew.py)."""
        await self._sleep_until(at - TIMER_SLACK_S)
        return not self.stop.is_set()

    async def _sleep_until(self, at: float) -> None:
        wait = at - self.clock()
        if wait > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), wait)

    async def one(self, number: int, stream: int, scheduled: float) -> RequestRecord:
        rec = RequestRecord(number, stream, scheduled)
        self.records.append(rec)
        url, request_kwargs, server = self.url, self.request_kwargs, "the server"
        if self.router is not None:
            rec.replica = self.router.pick()
            url, request_kwargs = self.targets[rec.replica]
            server = f"replica {self.router.names[rec.replica]}"
        try:
            spec = self.spec_for(number)
            rec.index, rec.max_tokens = spec.index, spec.max_tokens
            await stream_one(self.session, url, completion_body(spec, self.model, self.api), rec, self.clock,
                             request_kwargs, self.fresh_session)
        except ServerGone as exc:
            self.stop.stop(f"{server} went away ({exc})")
        except Exception as exc:  # noqa: BLE001 - one request's failure, recorded as such
            rec.ok = False
            rec.error = rec.error or f"{type(exc).__name__}: {exc}"[:500]
            if rec.end_s is None:
                rec.end_s = self.clock()
        finally:
            if self.router is not None:
                self.router.release(rec.replica)
        if rec.ok is False and rec.error is None:
            rec.error = "the request did not complete"
        if self.on_request_done:
            with contextlib.suppress(Exception):  # a display callback never stops the load
                self.on_request_done(rec)
        return rec

    async def run_tasks(self, tasks: list[asyncio.Task]) -> None:
        stopper = asyncio.create_task(self.stop.wait())
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


@contextlib.contextmanager
def young_collections_only() -> Iterator[None]:
    """While a load runs, the cyclic collector passes over its youngest generation only (`gc.set_threshold`: the
    older two never come due), as it was after. Why: a pass over an older generation stops the event loop (about
    1 ms for the middle one, 45 ms for a full one in a 10,000-request replay at 500/s), and the sends due meanwhile
    go late. Reference counting frees nearly all a load makes (that replay with the collector off left 2,066
    objects in cycles), and the young passes still free the cycles that die young."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], 1 << 30, 1 << 30)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


async def _run_load(base_url, model, api, connections, spec_for, request_timeout_s, stop, on_request_done,
                    keep_alive, client: Client, body, router: Router | None = None) -> LoadResult:
    import aiohttp

    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    url, request_kwargs = client.aio_kwargs(base_url.rstrip("/") + path)
    # Each replica's URL carries its own credentials (Client.request splits them off per URL).
    targets = [client.aio_kwargs(u.rstrip("/") + path) for u in router.urls] if router is not None else None
    stop = stop or StopSignal()
    records: list[RequestRecord] = []
    t0 = time.perf_counter()

    def clock() -> float:
        return time.perf_counter() - t0

    # A byte every few seconds forever (a slowloris server) never trips sock_read: a request also ends
    # after REQUEST_DEADLINE_S in all (vLLM's own benchmark client allows 6 h; a longer --request-timeout wins).
    timeout = aiohttp.ClientTimeout(total=max(REQUEST_DEADLINE_S, request_timeout_s), sock_connect=10,
                                    sock_read=request_timeout_s)

    def session(reuse: bool):
        # A connection per request costs a connect (~0.1 ms on loopback, more for a first wave of many
        # at once) inside TTFT; reuse keeps connections alive for IDLE_KEEP_ALIVE_S (module doc).
        # trust_env stays off: the proxy is the one Client.aio_kwargs chose, as for urllib (kvplan.bench.client).
        connector = aiohttp.TCPConnector(limit=connections, limit_per_host=connections, force_close=not reuse,
                                         keepalive_timeout=IDLE_KEEP_ALIVE_S if reuse else None)
        return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                     trace_configs=[reuse_tracer()] if reuse else None)

    async with contextlib.AsyncExitStack() as sessions:
        main = await sessions.enter_async_context(session(keep_alive))
        fresh = await sessions.enter_async_context(session(False)) if keep_alive else None
        ctx = _LoadContext(main, url, model, api, spec_for, stop, records, clock, on_request_done, request_kwargs,
                           fresh, router, targets)
        with young_collections_only():
            await body(ctx)
    for rec in records:
        if rec.end_s is None and rec.error is None:
            rec.error = "cancelled"
    wall = clock()
    return LoadResult(records, wall, stop.reason if stop.is_set() else None)
