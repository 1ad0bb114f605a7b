"""A small OpenAI-style streaming server on 127.0.0.1, run in a background thread.

Used for what a real engine cannot be made to do on demand (die in the middle of a stream) and
to pin the load generator's timing and connection behaviour with known delays. The engine's own
behaviour is always tested against the real vLLM CPU engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field


@dataclass
class FakeBehaviour:
    tokens: int = 4
    first_token_delay_s: float = 0.0
    token_gap_s: float = 0.0
    die_after_chunks: int | None = None  # close the connection abruptly after this many chunks
    chunk_padding: int = 0  # bytes of padding in each chunk's text (long SSE lines)
    metrics: bool = True
    cache_info: str | None = None  # labels of vllm:cache_config_info, e.g. 'num_gpu_blocks="17",block_size="32"'
    model_id: str = "fake"  # what /v1/models lists
    max_model_len: int | None = None  # what /v1/models says of it (vLLM's ModelCard), when set
    api_key: str | None = None  # require "Authorization: Bearer <api_key>" on /v1 (as vLLM --api-key)
    metrics_text: object = None  # a str, or a callable(scrape number) -> str, served as /metrics instead
    status: int = 200  # completions answer this status (an error body) when not 200
    raw_chunks: list | None = None  # completions stream these SSE data payloads (bytes) and [DONE]
    in_flight: int = 0
    max_in_flight: int = 0
    scrapes: int = 0
    auth_seen: list = field(default_factory=list)
    requests: int = 0
    bodies: list = field(default_factory=list)
    seen: list = field(default_factory=list)  # (path, {header: value}) of every request, in order
    echo_header: str | None = None  # with status != 200: the error message repeats this request header
    end_delay_s: float = 0.0  # pause between [DONE] and the end of the chunked body
    peers: set = field(default_factory=set)  # the client (host, port) of every request: one per connection
    load_peers: set = field(default_factory=set)  # the same, of the completion requests only (the load)
    redirect: dict = field(default_factory=dict)  # path -> (status, Location): answered with that redirect


METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="fake"}} {running}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="fake"}} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="fake"}} 0.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0",model_name="fake"}} 0.0
"""


class _LoopThread:
    """A server on an event loop of its own, in a daemon thread; ``with`` starts and stops it. A
    subclass's ``_run`` sets ``_loop`` and ``port``, then ``_ready``; ``_close`` stops serving."""

    def __init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            self._close()
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError


class _StreamServer(_LoopThread):
    """A raw asyncio stream server on 127.0.0.1; a subclass's ``_handle(reader, writer)`` serves."""

    _server = None

    def _close(self) -> None:
        """Stop listening, then end the handlers still waiting on kept-alive connections while the loop
        runs (left pending, they would close their transports on a closed loop when collected)."""
        async def shut() -> None:
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader, writer) -> None:
        raise NotImplementedError


class FakeServer(_LoopThread):
    def __init__(self, behaviour: FakeBehaviour | None = None, ssl_context=None):
        super().__init__()
        self.behaviour = behaviour or FakeBehaviour()
        self._runner = None
        self._ssl = ssl_context  # an ssl.SSLContext: serve https

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self.port}"

    def _close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)

    def _run(self) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        behaviour = self.behaviour

        @web.middleware
        async def record(request, handler):
            behaviour.seen.append((request.path, dict(request.headers)))
            peer = request.transport.get_extra_info("peername") if request.transport else None
            behaviour.peers.add(peer)
            if request.path.endswith("/completions"):
                behaviour.load_peers.add(peer)
            if request.path in behaviour.redirect:
                status, location = behaviour.redirect[request.path]
                return web.Response(status=status, headers={"Location": location})
            return await handler(request)

        app = web.Application(middlewares=[record])
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", getattr(self, "_port_wanted", 0), ssl_context=self._ssl)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _health(self, request):
        from aiohttp import web

        return web.Response(text="")

    def _denied(self, request):
        from aiohttp import web

        self.behaviour.auth_seen.append(request.headers.get("Authorization"))
        key = self.behaviour.api_key
        if key and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return None

    async def _models(self, request):
        from aiohttp import web

        denied = self._denied(request)
        if denied is not None:
            return denied
        card = {"id": self.behaviour.model_id, "object": "model"}
        if self.behaviour.max_model_len is not None:
            card["max_model_len"] = self.behaviour.max_model_len
        return web.json_response({"object": "list", "data": [card]})

    async def _metrics(self, request):
        from aiohttp import web

        if not self.behaviour.metrics:
            return web.Response(status=404)
        self.behaviour.scrapes += 1
        custom = self.behaviour.metrics_text
        if custom is not None:
            return web.Response(text=custom(self.behaviour.scrapes) if callable(custom) else custom)
        text = METRICS.format(running=float(self.behaviour.in_flight))
        if self.behaviour.cache_info:
            text += f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{self.behaviour.cache_info}}} 1.0\n"
        return web.Response(text=text)

    async def _completions(self, request):
        from aiohttp import web

        b = self.behaviour
        denied = self._denied(request)
        if denied is not None:
            return denied
        if b.status != 200:
            echo = f" (you sent {request.headers.get(b.echo_header)!r})" if b.echo_header else ""
            return web.json_response({"error": {"message": "boom" + echo}}, status=b.status)
        body = await request.json()
        b.bodies.append(body)
        b.requests += 1
        b.in_flight += 1
        b.max_in_flight = max(b.max_in_flight, b.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = int(body.get("max_tokens") or b.tokens)
            await asyncio.sleep(b.first_token_delay_s)
            if b.raw_chunks is not None:
                for raw in b.raw_chunks:
                    await resp.write(b"data: " + raw + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            for i in range(n):
                if i:
                    await asyncio.sleep(b.token_gap_s)
                if b.die_after_chunks is not None and i >= b.die_after_chunks:
                    request.transport.abort()  # the server dies mid-stream
                    return resp
                chunk = {"choices": [{"index": 0, "text": "x" * (1 + b.chunk_padding), "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"prompt_tokens": len(body.get("prompt") or []), "completion_tokens": n}}
            await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            await asyncio.sleep(b.end_delay_s)
            await resp.write_eof()
            return resp
        finally:
            b.in_flight -= 1


class CountingProxy(_StreamServer):
    """A forwarding HTTP proxy on 127.0.0.1 (absolute-form requests, as clients send to an HTTP proxy),
    in a background thread: counts what went through it by path, and keeps each request's
    Proxy-Authorization. Responses (SSE streams too) are piped back as they arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []
        self.proxy_auth: list[str | None] = []

    async def _handle(self, reader, writer) -> None:
        from urllib.parse import urlsplit

        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
            length = next((int(v) for k, v in headers if k.strip().lower() == "content-length"), 0)
            body = await reader.readexactly(length) if length else b""
            url = urlsplit(target)
            self.paths.append(url.path)
            self.proxy_auth.append(next((v.strip() for k, v in headers if k.strip().lower() == "proxy-authorization"),
                                        None))
            up_reader, up_writer = await asyncio.open_connection(url.hostname, url.port or 80)
            keep = [(k, v) for k, v in headers if k.strip().lower() not in ("proxy-authorization", "connection",
                                                                             "proxy-connection", "keep-alive")]
            out = f"{method} {url.path}{'?' + url.query if url.query else ''} HTTP/1.1\r\n"
            out += "".join(f"{k}:{v}\r\n" for k, v in keep) + "Connection: close\r\n\r\n"
            up_writer.write(out.encode("latin-1") + body)
            await up_writer.drain()
            while True:
                data = await up_reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            up_writer.close()
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


class KeepAliveDropServer(_StreamServer):
    """A raw HTTP/1.1 completions server on 127.0.0.1 that answers the first ``serve`` requests of
    every connection (short SSE streams, kept alive) and closes the connection, unanswered, when the
    next one arrives on it: a keep-alive timer firing just as the client reuses the connection
    (uvicorn#824). ``drop_delay_s``: how long it holds the unread request before closing;
    ``serve=0``: every request's connection is closed unanswered (a server that stopped serving)."""

    def __init__(self, drop_delay_s: float = 0.0, serve: int = 1) -> None:
        super().__init__()
        self.drop_delay_s, self.serve = drop_delay_s, serve
        self.connections = 0
        self.answered = 0
        self.dropped = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader, writer) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                               if k.strip().lower() == "content-length"), 0)
                body = json.loads(await reader.readexactly(length)) if length else {}
                if served >= self.serve:
                    await asyncio.sleep(self.drop_delay_s)
                    self.dropped += 1
                    writer.transport.abort()
                    return
                served += 1
                n = int(body.get("max_tokens") or 1)
                events = [{"choices": [{"index": 0, "text": "x", "finish_reason": None}]} for _ in range(n)]
                events.append({"choices": [], "usage": {"prompt_tokens": len(body.get("prompt") or []),
                                                        "completion_tokens": n}})
                payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                data = payload.encode()
                self.answered += 1  # before the write: a client that has read the answer sees it counted
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def main(argv: list[str] | None = None) -> None:
    """Run as a stand-in engine (``--engine-cmd "python tests/helpers/fake_server.py"``): takes vLLM's
    --model/--host/--port (other flags are ignored), requires $VLLM_API_KEY when set, prints its
    own command line (as vLLM logs its args), and on SIGTERM takes ``--stop-delay`` seconds to exit."""
    import os
    import signal
    import sys
    import time

    args = list(sys.argv[1:] if argv is None else argv)

    def opt(name: str, default: str) -> str:
        return args[args.index(name) + 1] if name in args else default

    delay = float(opt("--stop-delay", "0"))
    behaviour = FakeBehaviour(model_id=opt("--model", "fake"), api_key=os.environ.get("VLLM_API_KEY") or None,
                              token_gap_s=float(opt("--token-gap", "0.01")))
    print("fake engine args:", " ".join(args), flush=True)
    stopping = threading.Event()

    def on_term(signum, frame):
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    server = FakeServer(behaviour)
    server._port_wanted = int(opt("--port", "0"))
    server.__enter__()
    print(f"fake engine listening on {server.url}", flush=True)
    while not stopping.wait(0.1):
        pass
    time.sleep(delay)  # a slow shutdown: kvplan must keep waiting, whatever signals it gets meanwhile
    server.__exit__(None, None, None)


if __name__ == "__main__":
    main()
