"""vLLM's native CPU offload tier (``--kv-offloading-size GiB``), sized as vLLM sizes it. Pure.

vLLM 0.32 (``VllmConfig._post_init_kv_transfer_config``, config/vllm.py; ``build_offloading_config``,
distributed/kv_transfer/kv_connector/v1/offloading/config.py; ``CPUOffloadingSpec.__init__``,
v1/kv_offload/cpu/spec.py): the native backend gets ``cpu_bytes_to_use = size x 2^30``, the total over
all ranks of one engine. One offload *chunk* is ``blocks_per_chunk`` (1 unless the connector's extra
config says) GPU blocks of every rank: a worker's bytes per block are its whole KV allocation over
its block count (every group's layers), times the ranks that hold a copy (the world size; one copy
for an MLA model on a TP-only single-node NVIDIA or XPU deployment, whose ranks hold identical
latents: ``replicated_layout``), rounded up to the host page (``mmap.PAGESIZE``, 4 KiB on x86-64).
``num_chunks = cpu_bytes_to_use // chunk``; the host memory is those chunks.

Tokens: a chunk holds ``blocks_per_chunk x block_size`` tokens of ONE KV cache group: offload keys
carry the group index, so on a model with several groups each group's block takes its own whole
chunk row (vllm#56871, https://github.com/vllm-project/vllm/issues/56871; vLLM reports a token
capacity only for one group, vllm#51615). kvplan gives the tokens for one group exactly and, with
several, the tokens if every group stores every block (sliding-window and recurrent groups may store
fewer, which kvplan does not model).

LMCache (``--kv-offloading-backend lmcache``): vLLM 0.32 passes no size (the LMCache server holds the
capacity), so kvplan sizes nothing.

By release (kvplan.vllm.rules ``offload_memory``; docs/vllm-accounting.md, "CPU offload tier"): 0.27+ on
NVIDIA allocate the chunks in one shared region, exactly (the arithmetic above). 0.19.1-0.26 have no page
alignment and no shared MLA copy, and each rank allocates pinned torch tensors, which PyTorch's host allocator
rounds up to a power of two (vllm#53042, https://github.com/vllm-project/vllm/issues/53042: 384 GiB for 200):
a rank holds one cross-layer tensor with one KV group (MLA from 0.24), else one per layer (or per layer slot
of a hybrid's groups), so the host memory is ``ranks x sum(pow2(tensor))``. 0.11.1's native tier never builds, and 0.12-0.18
were not read: both refused.

Reload vs recompute (`tier_reload`): a prompt whose prefix the tier holds is loaded back over each rank's own host
link instead of recomputed. vLLM loads it asynchronously (the connector's ``get_num_new_matched_tokens`` returns
``load_kv_async``; the request waits in ``WAITING_FOR_REMOTE_KVS``, then is scheduled for the rest of its prompt:
v1/core/sched/scheduler.py@0.32.0, distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py@0.32.0).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.layers import MLA
from kvplan.plan.steptime import chunk_step_time, prefill_time
from kvplan.units import GiB, cdiv

HOST_PAGE_BYTES = 4096  # mmap.PAGESIZE on x86-64 Linux; 64 KiB-page aarch64 kernels (some GH200) round more
MAX_OFFLOAD_GIB = 1 << 20  # 1 PiB: larger is a typo
BACKENDS = ("native", "lmcache")


@dataclass(frozen=True)
class OffloadTier:
    """The CPU tier of one engine (one replica)."""

    backend: str
    size_gib: float  # as asked: the total over the engine's ranks
    replicated_layout: bool  # one copy of an MLA block for all TP ranks
    copies: int  # ranks whose block a chunk holds
    blocks_per_chunk: int
    chunk_bytes: int  # one chunk, page-aligned, every copy
    num_chunks: int
    host_bytes: int  # what the tier takes in host memory (a /dev/shm region on CUDA), at least
    groups: int  # KV cache groups, each taking its own chunks
    tokens_per_chunk: int
    tokens: int  # tokens of context it holds (every group storing every block)
    gpu_pool_tokens: int  # the GPU pool's, for scale
    notes: tuple[str, ...] = ()
    reload: TierReload | None = None  # a tier hit's TTFT against recomputing it (kvplan size adds it)

    def describe(self) -> tuple[str, str]:
        """Two plain lines: the chunks, then the host memory and the tokens they hold."""
        copies = ("one copy for all TP ranks (MLA)" if self.replicated_layout
                  else f"the blocks of {self.copies} rank{'s' if self.copies != 1 else ''}")
        chunks = (f"{self.num_chunks:,} chunks of {self.chunk_bytes:,} B ({copies}, {self.tokens_per_chunk:,} tokens "
                  "each)")
        held = f"host memory: {self.host_bytes / GiB:,.2f} GiB; holds {self.tokens:,} tokens of context"
        if self.gpu_pool_tokens:
            held += f" ({self.tokens / self.gpu_pool_tokens:,.1f}x the GPU pool's {self.gpu_pool_tokens:,})"
        return chunks, held


def check_offloading_size(size_gib: float | None, backend: str) -> None:
    """Refuse what vLLM would refuse or what cannot be meant: a size <= 0, absurd, or not a number."""
    if backend not in BACKENDS:
        raise KvplanError(f"unknown KV offloading backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    if size_gib is None:
        return
    if not isinstance(size_gib, (int, float)) or isinstance(size_gib, bool) or not 0 < size_gib <= MAX_OFFLOAD_GIB:
        raise KvplanError(f"invalid --kv-offloading-size {size_gib!r} GiB",
                          f"give the CPU tier's size in GiB, > 0 and at most {MAX_OFFLOAD_GIB:,}")


def cpu_offload_tier(size_gib: float, backend: str, *, block_bytes_per_rank: int, block_size: int, groups: int,
                     tensor_parallel_size: int, pipeline_parallel_size: int, decode_context_parallel_size: int,
                     mla: bool, nvidia_or_xpu: bool, gpu_pool_tokens: int, blocks_per_chunk: int = 1,
                     memory: str = "region", tensor_pages: tuple[int, ...] = ()) -> OffloadTier | None:
    """The tier vLLM builds for ``--kv-offloading-size size_gib`` (None for LMCache: sized by its server);
    ``memory``: how the release allocates it (kvplan.vllm.rules ``offload_memory``); ``tensor_pages``: with
    "pinned", the bytes a block takes in each tensor a rank pins (`pinned_tensor_pages`)."""
    check_offloading_size(size_gib, backend)
    if backend == "lmcache":
        return None
    if memory == "none":
        raise KvplanError("kvplan sizes vLLM's native CPU offload tier from 0.19.1 (0.11.1's never builds: it is "
                          "given no CPU blocks; 0.12-0.18 were not read)", "plan vLLM 0.19.1 or newer")
    if pipeline_parallel_size > 1:
        raise KvplanError("kvplan does not size the CPU offload tier with pipeline parallelism (each stage's "
                          "ranks hold other layers)", "plan it without --pp, or drop --kv-offloading-size")
    world = tensor_parallel_size  # x pipeline (1 here) x prefill context parallel (not planned by kvplan)
    region = memory == "region"
    replicated = region and mla and tensor_parallel_size > 1 and decode_context_parallel_size == 1 and nvidia_or_xpu
    copies = 1 if replicated else world
    chunk = block_bytes_per_rank * copies * blocks_per_chunk
    if region:
        chunk = cdiv(chunk, HOST_PAGE_BYTES) * HOST_PAGE_BYTES
    num_chunks = int(size_gib * GiB) // chunk
    host = num_chunks * chunk
    if not region:  # each rank's pinned tensors, rounded up to a power of two by PyTorch's host allocator
        host = world * sum(_pow2(num_chunks * blocks_per_chunk * page) for page in tensor_pages or (chunk // world,))
    tokens_per_chunk = blocks_per_chunk * block_size * decode_context_parallel_size
    notes = []
    if groups > 1:
        notes.append(f"{groups} KV cache groups: each group's block takes a whole chunk (vllm#56871), so the tier "
                     f"holds {num_chunks:,} chunks of one group's {tokens_per_chunk:,} tokens; sliding-window and "
                     "recurrent groups may store fewer blocks than counted here")
    if mla and tensor_parallel_size > 1 and not replicated:
        notes.append("MLA at TP > 1 keeps one copy per rank here (vLLM shares one copy only on NVIDIA / XPU, TP-only)"
                     if region else "MLA at TP > 1: before 0.27 every rank stores its copy of the latent")
    return OffloadTier(backend=backend, size_gib=size_gib, replicated_layout=replicated, copies=copies,
                       blocks_per_chunk=blocks_per_chunk, chunk_bytes=chunk, num_chunks=num_chunks,
                       host_bytes=host, groups=groups, tokens_per_chunk=tokens_per_chunk,
                       tokens=num_chunks * tokens_per_chunk // groups, gpu_pool_tokens=gpu_pool_tokens,
                       notes=tuple(notes))


def _pow2(n: int) -> int:
    """PyTorch's pinned host allocator: a request rounded up to a power of two (`CachingHostAllocator`)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def pinned_tensor_pages(layout, mla: bool, rules) -> tuple[int, ...]:
    """The bytes a GPU block takes in each KV tensor a rank mirrors in pinned memory (0.19.1-0.26): one
    cross-layer tensor with a single KV group (MLA from 0.24), else one per layer, or per layer slot of a
    hybrid's groups (the tensors the groups share)."""
    if layout.packed or (layout.num_kv_groups == 1 and not layout.shared_block_table
                         and (not mla or rules.offload_cross_layer_mla)):
        return (layout.block_bytes,)
    if layout.shared_block_table:  # one group of unequal pages: a tensor per layer
        return tuple(spec.page_bytes(g.block_size, layout.dtype) for g in layout.groups for spec, n in g.layers
                     for _ in range(n))
    return (layout.page_bytes,) * layout.group_size


def offload_tier_for(cap, size_gib: float, backend: str = "native") -> OffloadTier | None:
    """The tier for one planned deployment (a kvplan.plan.capacity.Capacity)."""

    layout = cap.layout
    s = cap.settings
    if cap.has_state and cap.mamba_cache_mode != "align":
        # resolve_kv_cache_block_sizes (v1/core/kv_cache_utils.py@0.32.0): a Mamba group outside "align" mode (its
        # block is then max_model_len) makes the hash block the LCM of the groups' blocks, which the attention
        # groups' blocks are not multiples of, and build_offloading_config asserts they are (every such twin).
        raise KvplanError("vLLM refuses the CPU offload tier on a hybrid model whose recurrent state is not in "
                          f"the \"align\" cache mode (here: {cap.mamba_cache_mode!r})",
                          "turn prefix caching on (--enable-prefix-caching), or drop --kv-offloading-size")
    mla = any(isinstance(g.spec, MLA) for g in layout.groups)
    return cpu_offload_tier(
        size_gib, backend, block_bytes_per_rank=layout.block_bytes, block_size=layout.min_block_size,
        groups=layout.num_kv_groups, tensor_parallel_size=s.tensor_parallel_size,
        pipeline_parallel_size=s.pipeline_parallel_size, decode_context_parallel_size=s.decode_context_parallel_size,
        mla=mla, nvidia_or_xpu=cap.device.vendor == "nvidia", gpu_pool_tokens=cap.kv_cache_tokens_reported,
        memory=cap.rules.offload_memory, tensor_pages=pinned_tensor_pages(layout, mla, cap.rules))


# --------------------------------------------------------------------------- reload vs recompute

#: Host -> GPU copies of pinned memory reach about this share of the link's rate in one direction: a prior from
#: published nvbandwidth / bandwidthTest runs: A100 SXM4 25.13 of 31.5 GB/s (0.80,
#: https://github.com/NVIDIA/nvbandwidth/issues/42), RTX 4090 23.9-26.4 (0.76-0.84,
#: https://github.com/NVIDIA/nvbandwidth/issues/15), GH200 346 of 450 (0.77,
#: https://github.com/NVIDIA/nvbandwidth/issues/23); one H100 system measured 35.2 of 63 (0.56), reported there
#: as an anomaly (https://github.com/NVIDIA/nvbandwidth/issues/24). Copies in both directions at once get less.
HOST_COPY_EFFICIENCY = 0.8


@dataclass(frozen=True)
class ReloadRow:
    prompt_tokens: int
    reloaded_tokens: int  # the prompt's full blocks but its last token (vLLM computes the last token always)
    reload_ttft_s: float  # the prefix loaded from the tier, the rest computed
    recompute_ttft_s: float  # the whole prompt computed


@dataclass(frozen=True)
class TierReload:
    """TTFT of a prompt whose prefix the tier holds, reloaded or recomputed, on an otherwise idle engine.

    reload: one step's overhead (the load is issued in a step that computes nothing of this request) + the
    transfer of the prefix over the rank's link at ``efficiency`` x its rate + the rest of the prompt computed
    after it; recompute: the whole prompt's chunked prefill (kvplan.plan.steptime.prefill_time). The request
    overhead outside the engine (API server) is the same for both and left out. Every rank moves its own pages
    over its own link at once (GPUs sharing a PCIe switch's uplink get less)."""

    link: str  # e.g. "PCIe 5.0 x16"
    link_gbps: float  # the link's rate, one direction, GB/s
    efficiency: float
    bytes_per_token: float  # a rank's pages per token: what its link moves
    rows: tuple[ReloadRow, ...]
    crossover_tokens: int | None  # the shortest prompt a reload serves sooner (None: none up to the longest)
    step_model: str  # "prior" or "calibrated"
    notes: tuple[str, ...] = ()

    @property
    def transfer_s_per_token(self) -> float:
        return self.bytes_per_token / (self.link_gbps * 1e9 * self.efficiency)


def tier_reload(layout, link: str, link_gbps: float, step_model, chunk_tokens: int, max_prompt_tokens: int,
                lengths: tuple[int, ...] = (1024, 8192, 32768, 131072), notes: tuple[str, ...] = ()) -> TierReload:
    """Reload vs recompute for one KV group's layout (kvplan.plan.layout.KVLayout): ``lengths`` (up to
    ``max_prompt_tokens``, which is added) and the crossover: the shortest prompt whose reload is sooner,
    over every prompt of whole blocks + 1 token (the lengths whose reload a block more serves)."""
    if link_gbps <= 0 or chunk_tokens < 1 or max_prompt_tokens < 2:
        raise KvplanError("reload vs recompute needs a host link rate > 0, a prefill chunk and prompts of 2 tokens or more")
    block = layout.min_block_size
    per_token = layout.block_bytes / block
    rate = link_gbps * 1e9 * HOST_COPY_EFFICIENCY
    full_chunks = [0.0]  # full_chunks[j]: seconds of a prompt's first j chunks (prompts are scanned in order)

    def recompute(prompt: int) -> float:
        j = (prompt - 1) // chunk_tokens
        while len(full_chunks) <= j:
            i = len(full_chunks) - 1
            full_chunks.append(full_chunks[i] + chunk_step_time(step_model, chunk_tokens, i * chunk_tokens))
        return full_chunks[j] + chunk_step_time(step_model, prompt - j * chunk_tokens, j * chunk_tokens)

    def row(prompt: int) -> ReloadRow:
        hit = (prompt - 1) // block * block  # full blocks, at most prompt - 1 tokens (get_num_new_matched_tokens)
        reload = step_model.overhead_s + hit * per_token / rate + prefill_time(step_model, prompt - hit,
                                                                              chunk_tokens, context=hit)
        return ReloadRow(prompt, hit, reload, recompute(prompt))

    # Every length, not a bisection: recompute minus reload is not monotone (it jumps by a step's cost at each
    # chunk boundary and falls between them where moving a token costs more than computing it).
    crossover = None
    for blocks in range(1, (max_prompt_tokens - 1) // block + 1):
        r = row(blocks * block + 1)
        if r.reload_ttft_s < r.recompute_ttft_s:
            crossover = r.prompt_tokens
            break
    prompts = sorted({n for n in lengths if n <= max_prompt_tokens} | {max_prompt_tokens})
    return TierReload(link=link, link_gbps=link_gbps, efficiency=HOST_COPY_EFFICIENCY, bytes_per_token=per_token,
                      rows=tuple(row(n) for n in prompts), crossover_tokens=crossover,
                      step_model=step_model.source, notes=notes)
