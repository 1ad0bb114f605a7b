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
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.layers import MLA
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
    host_bytes: int  # what the tier takes in host memory (a /dev/shm region on CUDA)
    groups: int  # KV cache groups, each taking its own chunks
    tokens_per_chunk: int
    tokens: int  # tokens of context it holds (every group storing every block)
    gpu_pool_tokens: int  # the GPU pool's, for scale
    notes: tuple[str, ...] = ()

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
                     mla: bool, nvidia_or_xpu: bool, gpu_pool_tokens: int, blocks_per_chunk: int = 1) -> OffloadTier | None:
    """The tier vLLM builds for ``--kv-offloading-size size_gib`` (None for LMCache: sized by its server)."""
    check_offloading_size(size_gib, backend)
    if backend == "lmcache":
        return None
    if pipeline_parallel_size > 1:
        raise KvplanError("kvplan does not size the CPU offload tier with pipeline parallelism (each stage's "
                          "ranks hold other layers)", "plan it without --pp, or drop --kv-offloading-size")
    world = tensor_parallel_size  # x pipeline (1 here) x prefill context parallel (not planned by kvplan)
    replicated = (mla and tensor_parallel_size > 1 and decode_context_parallel_size == 1 and nvidia_or_xpu)
    copies = 1 if replicated else world
    chunk = cdiv(block_bytes_per_rank * copies * blocks_per_chunk, HOST_PAGE_BYTES) * HOST_PAGE_BYTES
    num_chunks = int(size_gib * GiB) // chunk
    tokens_per_chunk = blocks_per_chunk * block_size * decode_context_parallel_size
    notes = []
    if groups > 1:
        notes.append(f"{groups} KV cache groups: each group's block takes a whole chunk (vllm#56871), so the tier "
                     f"holds {num_chunks:,} chunks of one group's {tokens_per_chunk:,} tokens; sliding-window and "
                     "recurrent groups may store fewer blocks than counted here")
    if mla and tensor_parallel_size > 1 and not replicated:
        notes.append("MLA at TP > 1 keeps one copy per rank here (vLLM shares one copy only on NVIDIA / XPU, TP-only)")
    return OffloadTier(backend=backend, size_gib=size_gib, replicated_layout=replicated, copies=copies,
                       blocks_per_chunk=blocks_per_chunk, chunk_bytes=chunk, num_chunks=num_chunks,
                       host_bytes=num_chunks * chunk, groups=groups, tokens_per_chunk=tokens_per_chunk,
                       tokens=num_chunks * tokens_per_chunk // groups, gpu_pool_tokens=gpu_pool_tokens,
                       notes=tuple(notes))


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
    return cpu_offload_tier(
        size_gib, backend, block_bytes_per_rank=layout.block_bytes, block_size=layout.min_block_size,
        groups=layout.num_kv_groups, tensor_parallel_size=s.tensor_parallel_size,
        pipeline_parallel_size=s.pipeline_parallel_size, decode_context_parallel_size=s.decode_context_parallel_size,
        mla=any(isinstance(g.spec, MLA) for g in layout.groups), nvidia_or_xpu=cap.device.vendor == "nvidia",
        gpu_pool_tokens=cap.kv_cache_tokens_reported)
