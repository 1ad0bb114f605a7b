"""`kvplan size --engine sglang|all`: one engine's pool, or the engines side by side with the terms that differ."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from kvplan.engines import EnginePool
from kvplan.term import make_console
from kvplan.units import GiB, format_tokens


def render_pool(pool: EnginePool) -> None:
    """One engine's pool: the deployment, its budget terms per GPU, the pool, what the engine prints, the verdict."""
    console = make_console()
    console.soft_wrap = True
    gpus = f"{pool.gpu_count}x {pool.gpu}" if pool.gpu_count > 1 else pool.gpu
    par = f"TP {pool.tensor_parallel_size}" + (f", {pool.replicas} replicas" if pool.replicas > 1 else "")
    console.print(f"[bold]{escape(pool.model)}[/] on [bold]{escape(gpus)}[/] ({par}), {escape(pool.engine_label)} rules")
    console.print(f"  KV dtype {pool.kv_cache_dtype}; page {pool.page_tokens} token(s); context {format_tokens(pool.max_model_len)}")
    console.print(f"KV bytes per token per GPU: [bold]{pool.kv_bytes_per_token_per_gpu:,}[/]")
    table = Table(title="KV budget per GPU", title_justify="left", show_edge=False)
    for name in ("term", "GiB", "range", "how"):
        table.add_column(name, justify="right" if name in ("GiB", "range") else "left", overflow="fold")
    for t in pool.memory_terms:
        sign = "-" if t.sign < 0 else ""
        table.add_row(escape(t.name), f"{sign}{t.bytes / GiB:,.2f}", f"{t.low_bytes / GiB:,.2f}-{t.high_bytes / GiB:,.2f}",
                      escape(t.how))
    table.add_row("[bold]KV pool[/]", f"[bold]{pool.kv_memory_bytes_per_gpu / GiB:,.2f}[/]", "", "")
    console.print(table)
    console.print(f"Pool: {pool.pool_tokens:,} tokens in {pool.pool_pages:,} pages; {pool.requests_at_context:,.2f} "
                  f"requests of {pool.max_model_len:,} tokens at once; at most {pool.max_running_requests:,} running")
    if len(pool.pool_split) > 1:
        console.print("  pools: " + "; ".join(
            f"{escape(name)} {tokens:,}" + (f" ({pool.pool_bytes_per_gpu[key] / GiB:,.2f} GiB)"
                                            if (key := name.split('_')[0]) in pool.pool_bytes_per_gpu else "")
            for name, tokens in pool.pool_split.items()))
    for line in pool.startup_lines:
        console.print(f"  {escape(pool.engine_label.split()[0])} would print: {escape(line)}")
    style = "bold green" if pool.fits else "bold red"
    console.print(f"[{style}]{escape(pool.verdict)}[/]")
    for note in pool.notes:
        console.print(f"  note: {escape(note)}")
    console.print(f"{escape(pool.engine_label.split()[0])} command:")
    console.print(escape(pool.launch_command), soft_wrap=True)


#: The rows of `--engine all`: (label, the figure of a pool).
_ROWS = (
    ("KV dtype", lambda p: p.kv_cache_dtype),
    ("page (tokens)", lambda p: f"{p.page_tokens:,}"),
    ("KV bytes / token / GPU", lambda p: f"{p.kv_bytes_per_token_per_gpu:,}"),
    ("KV memory / GPU (GiB)", lambda p: f"{p.kv_memory_bytes_per_gpu / GiB:,.2f}"),
    ("pool (tokens)", lambda p: f"{p.pool_tokens:,}"),
    ("pools", lambda p: "; ".join(f"{k} {v:,}" for k, v in p.pool_split.items()) if len(p.pool_split) > 1 else "-"),
    ("requests at context", lambda p: f"{p.requests_at_context:,.2f}"),
    ("max running requests", lambda p: f"{p.max_running_requests:,}"),
    ("fits", lambda p: "yes" if p.fits else "no"),
)


def render_side_by_side(pools: list[EnginePool], refused: dict[str, str] | None = None) -> None:
    """The engines in columns; a row whose figures differ is marked (*), then each engine's budget terms and
    command, and the engines that do not size this deployment with their reason."""
    console = make_console()
    console.soft_wrap = True
    first = pools[0]
    gpus = f"{first.gpu_count}x {first.gpu}" if first.gpu_count > 1 else first.gpu
    console.print(f"[bold]{escape(first.model)}[/] on [bold]{escape(gpus)}[/] (TP {first.tensor_parallel_size}), "
                  f"context {format_tokens(first.max_model_len)}")
    table = Table(show_edge=False)
    table.add_column("per replica", overflow="fold")
    for p in pools:
        table.add_column(escape(p.engine_label), justify="right", overflow="fold")
    for label, figure in _ROWS:
        cells = [figure(p) for p in pools]
        if label == "pools" and set(cells) == {"-"}:
            continue  # no engine splits this model's pool (SGLang's hybrids do)
        mark = " *" if len(set(cells)) > 1 else ""
        table.add_row(label + mark, *cells)
    console.print(table)
    console.print("* the engines differ")
    for p in pools:
        terms = "; ".join(f"{t.name} {'-' if t.sign < 0 else ''}{t.bytes / GiB:,.2f}" for t in p.memory_terms)
        console.print(f"{escape(p.engine_label)}: {escape(terms)} -> KV {p.kv_memory_bytes_per_gpu / GiB:,.2f} GiB")
        console.print(f"  {escape(p.verdict)}")
        console.print(f"  {escape(p.launch_command)}", soft_wrap=True)
    for name, why in (refused or {}).items():
        console.print(f"[bold]{escape(name)}[/]: not sized: {escape(why)}")
