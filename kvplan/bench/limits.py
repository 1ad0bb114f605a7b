"""What one bench run may ask for: bounds on every load option, checked when the configuration is built
(from the command line, or from a run.json on ``--resume``: the same values either way), so no option
can make kvplan hold gigabytes or wait forever (issue 28). Each bound is far above any real run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvplan.errors import KvplanError
from kvplan.paths import MAX_RUN_NUMBER

if TYPE_CHECKING:
    from kvplan.bench.config import BenchConfig

MAX_CONCURRENCY = 100_000  # streams, sessions or requests in flight at once
MAX_LEVELS = 1_000  # points of one sweep
MAX_REQUESTS_PER_POINT = 1_000_000  # a request's record is ~1 KB: a point stays under ~1 GB
MIN_RATE, MAX_RATE = 0.001, 100_000.0  # requests/s: one every ~17 minutes .. the most a client sends
MAX_DURATION_S = 7 * 86_400
MIN_BURSTINESS = 0.01  # gamma shape: 1e-300 makes one gap longer than the universe's age
MAX_TOKENS_PER_REQUEST = 1 << 24  # prompt or output (kvplan.traffic.loaders.MAX_TRACE_TOKENS)


def _refuse(what: str, value, bound: str, source: str) -> KvplanError:
    return KvplanError(f"invalid {what} {value!r}{source}: {bound}")


def check_bench_bounds(cfg: BenchConfig, source: str = "") -> None:
    """Raise KvplanError (exit 2) when ``cfg`` asks for more than the bounds above."""
    levels = list(cfg.sweep or [])
    if len(levels) > MAX_LEVELS:
        raise _refuse("--sweep", f"{len(levels)} levels", f"at most {MAX_LEVELS:,} levels", source)
    for name, value in (("--sweep", max(levels, default=None)), ("--max-concurrency", cfg.max_concurrency),
                        ("--max-concurrency", cfg.rate_max_concurrency)):
        if value is not None and not 1 <= value <= MAX_CONCURRENCY:
            raise _refuse(name, value, f"1 to {MAX_CONCURRENCY:,} at once", source)
    if cfg.requests is not None and not 1 <= cfg.requests <= MAX_REQUESTS_PER_POINT:
        raise _refuse("--requests", cfg.requests, f"1 to {MAX_REQUESTS_PER_POINT:,} a point", source)
    top = max(levels or [cfg.max_concurrency or 1])
    if cfg.requests_per_stream is not None and cfg.requests_per_stream * top > MAX_REQUESTS_PER_POINT:
        raise _refuse("--requests-per-stream", cfg.requests_per_stream,
                      f"x {top:,} streams is over {MAX_REQUESTS_PER_POINT:,} requests a point", source)
    if cfg.duration_s is not None and not 0 < cfg.duration_s <= MAX_DURATION_S:
        raise _refuse("--duration", cfg.duration_s, f"over 0 and at most {MAX_DURATION_S:,} s", source)
    rates = list(cfg.rates or [])
    if cfg.rate_search is not None:
        rates.append(cfg.rate_search.start)
    for rate in rates:
        if not MIN_RATE <= rate <= MAX_RATE:
            raise _refuse("--rate", rate, f"{MIN_RATE:g} to {MAX_RATE:,.0f} requests/s", source)
        if cfg.duration_s is not None and rate * cfg.duration_s > MAX_REQUESTS_PER_POINT:
            raise _refuse("--rate", rate, f"x --duration {cfg.duration_s:g} s is over {MAX_REQUESTS_PER_POINT:,} "
                          "requests a point", source)
    if not MIN_BURSTINESS <= cfg.burstiness <= 1000:
        raise _refuse("--burstiness", cfg.burstiness, f"{MIN_BURSTINESS:g} to 1000", source)
    w = cfg.workload or {}
    for key, flag in (("prompt_tokens", "--prompt"), ("output_tokens", "--output")):
        value = w.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS_PER_REQUEST:
            raise _refuse(flag, value, f"at most {MAX_TOKENS_PER_REQUEST:,} tokens", source)
    seed = w.get("seed")
    if isinstance(seed, int) and not abs(seed) <= MAX_RUN_NUMBER:  # run.json must read back (kvplan.paths)
        raise _refuse("--seed", seed, f"-{MAX_RUN_NUMBER:,} to {MAX_RUN_NUMBER:,}", source)
    if cfg.traffic is not None and cfg.traffic.sessions and max(cfg.traffic.sessions) > MAX_CONCURRENCY:
        raise _refuse("--sessions", max(cfg.traffic.sessions), f"1 to {MAX_CONCURRENCY:,}", source)
