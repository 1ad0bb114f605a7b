"""Bytes a prefill/decode disaggregated deployment moves per request over vLLM's NixlConnector. Pure.

Read in vLLM 0.32.0 (paths under vllm/distributed/kv_transfer/kv_connector/):

- ``NixlConnector`` is the pull connector (v1/nixl/connector.py:414): each decode rank READs from the prefill
  ranks it maps to, one NIXL transfer per (request, source rank) (``make_prepped_xfer("READ", ...)`` once per
  rank of ``plan.all_source_ranks``, v1/nixl/pull_worker.py:270, :546).
- What: every block the prefill allocated for the prompt, the last partial block whole (the prefill exports all
  its block ids, ``request_finished``, v1/nixl/pull_scheduler.py:274, and a descriptor is a whole block of one
  layer, ``_build_fa_remote``, v1/nixl/base_worker.py:2005), less the blocks the decode side already holds from
  its own prefix cache: the decode asks for the prompt minus its computed tokens
  (pull_scheduler.py:62) and the remote list is end-trimmed to the decode's unhashed blocks
  (``_apply_prefix_caching``, base_worker.py:3455).
- Per decode rank, per layer and block: its own page, whatever the TP on either side. The handshake asserts a
  prefill page is the decode page x prefill heads // decode heads (base_worker.py:2607), and the decode reads its
  whole local page split evenly over its source ranks (``local_block_len // num_reads``, base_worker.py:2047).
  So block size and layout change no byte count, only the rounding of the last block; heterogeneous TP needs the
  head-contiguous LBHNC layout (base_worker.py:2544), which the connector sets for non-MLA models
  (``get_required_kvcache_layout``, v1/nixl/connector.py:161).
- Which prefill ranks (``compute_tp_mapping``, v1/nixl/tp_mapping.py:98-108): with MLA or decode TP >= prefill TP,
  one: ``d x P // D``; with prefill TP > decode TP, the ``P // D`` ranks ``d x P//D ...``, each a slice of the
  heads. MLA's latent (and a GQA cache replicated on ranks beyond the KV heads) is read whole by every decode rank:
  D copies cross the network, one per decode rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model.layers import MLA, FullAttention
from kvplan.units import cdiv


@dataclass(frozen=True)
class RankRead:
    """What one decode rank reads for one request."""

    decode_rank: int
    sources: tuple[int, ...]  # prefill ranks it reads from, one NIXL READ each
    bytes: int  # all it reads, over every source


@dataclass(frozen=True)
class PDTransfer:
    """One request's KV moved from the prefill instance to the decode instance."""

    prompt_tokens: int
    decode_hit_tokens: int  # the decode's own prefix-cache hit (full blocks) that is not moved
    block_size: int
    blocks: int  # blocks moved per layer (the last partial block whole)
    prefill_tp: int
    decode_tp: int
    replicated: bool  # every decode rank reads a whole block (MLA, or KV heads fewer than the TP)
    decode_block_bytes: int  # one decode rank's block over all layers
    reads: tuple[RankRead, ...]

    @property
    def total_bytes(self) -> int:
        """Over all links: the sum of what every decode rank reads."""
        return sum(r.bytes for r in self.reads)

    @property
    def transfers(self) -> int:
        """NIXL READ transfers the request takes, one per (decode rank, source rank)."""
        return sum(len(r.sources) for r in self.reads)

    @property
    def sent_per_prefill_rank(self) -> tuple[int, ...]:
        """Bytes each prefill rank's NIC sends (several decode ranks may read the same prefill rank)."""
        sent = [0] * self.prefill_tp
        for r in self.reads:
            for p in r.sources:
                sent[p] += r.bytes // len(r.sources)
        return tuple(sent)

    def transfer_s(self, link_gb_per_s: float) -> float:
        """Seconds at ``link_gb_per_s`` (1e9 B/s) per rank NIC, one NIC per GPU on each side, reads in parallel and
        nothing else on the links: the busiest NIC, sending or receiving. A lower bound (no protocol overhead)."""
        if not link_gb_per_s > 0:
            raise KvplanError(f"invalid link rate {link_gb_per_s!r} GB/s", "give the rate of one link in GB/s, > 0")
        busiest = max(max(r.bytes for r in self.reads), max(self.sent_per_prefill_rank))
        return busiest / (link_gb_per_s * 1e9)


def pd_transfer(cap, decode_tp: int, prompt_tokens: int, decode_hit_tokens: int = 0) -> PDTransfer:
    """The transfer of one prompt of ``prompt_tokens`` from the prefill deployment ``cap`` (a
    kvplan.plan.capacity.Capacity) to a decode instance at ``decode_tp``, of the same model, KV dtype and block
    size; ``decode_hit_tokens``: tokens the decode instance already holds in its prefix cache."""
    s = cap.settings
    layout = cap.layout
    prefill_tp = s.tensor_parallel_size
    if s.pipeline_parallel_size > 1:
        # 0.32 refuses PP only for hybrid layouts (base_worker.py:763) and the push consumer; the rest not read.
        raise KvplanError("kvplan does not model P/D transfers with pipeline parallelism",
                          "plan the prefill instance without --pp")
    if s.decode_context_parallel_size > 1:
        raise KvplanError("kvplan does not model P/D transfers with decode context parallelism (vLLM reads DCP "
                          "shards by dcp_source_ranks, kv_connector/utils.py:544)", "plan it without --dcp")
    specs = {type(g.spec) for g in layout.groups}
    if layout.num_kv_groups != 1 or len(layout.groups) != 1 or not specs <= {FullAttention, MLA}:
        # 0.32 moves sliding-window groups clipped to the window (base_scheduler.py:149, :283) and Mamba state
        # slots (clip_ssm_state_blocks; the prompt backs off one token, base_scheduler.py:379): not modelled.
        raise KvplanError("kvplan models P/D transfers for one group of full attention or MLA only (vLLM 0.32 "
                          "also moves sliding-window and Mamba groups, clipped: not modelled)",
                          "size the transfer of a hybrid model by hand from its groups")
    if decode_tp < 1 or (decode_tp % prefill_tp and prefill_tp % decode_tp):
        raise KvplanError(f"vLLM's NixlConnector needs one TP size to divide the other (prefill {prefill_tp}, "
                          f"decode {decode_tp}: TransferTopology.tp_ratio, kv_connector/utils.py:495)",
                          "pick a decode TP that divides or is a multiple of the prefill's")
    if prompt_tokens < 1 or not 0 <= decode_hit_tokens <= prompt_tokens:
        raise KvplanError("a P/D transfer needs a prompt of 1 token or more and a decode hit within it")
    mla = isinstance(layout.groups[0].spec, MLA)
    if mla:
        heads = 1  # the latent is one replicated "head" (register_kv_caches: total_num_kv_heads=1)
        prefill_heads = decode_heads = 1
    else:
        heads = next(x.num_kv_heads for x in cap.arch.layers if isinstance(x, FullAttention))
        prefill_heads, decode_heads = max(1, heads // prefill_tp), max(1, heads // decode_tp)
        if prefill_tp > decode_tp and prefill_tp > heads:
            # _validate_remote_agent_handshake asserts not (tp_ratio < 0 and is_kv_replicated), base_worker.py:2449
            raise KvplanError(f"vLLM's NixlConnector refuses a prefill TP ({prefill_tp}) above both the decode TP "
                              f"and the {heads} KV heads", f"use a prefill TP of at most {heads}, or >= the decode TP")
    block = layout.min_block_size
    hit = min(decode_hit_tokens, prompt_tokens - 1) // block * block  # full blocks, at most prompt - 1 tokens
    blocks = cdiv(prompt_tokens, block) - hit // block  # (get_computed_blocks, v1/core/kv_cache_manager.py:295)
    decode_block_bytes = layout.block_bytes * decode_heads // prefill_heads  # base_worker.py:2607
    per_rank = blocks * decode_block_bytes
    reads = []
    for d in range(decode_tp):
        if mla or decode_tp >= prefill_tp:
            sources = (d * prefill_tp // decode_tp,)  # tp_mapping.py:98
        else:
            ratio = prefill_tp // decode_tp  # tp_mapping.py:105; heads distinct, as prefill TP <= KV heads here
            sources = tuple(range(d * ratio, (d + 1) * ratio))
        reads.append(RankRead(d, sources, per_rank))
    replicated = mla or decode_tp > heads
    return PDTransfer(prompt_tokens=prompt_tokens, decode_hit_tokens=hit,
                      block_size=block, blocks=blocks, prefill_tp=prefill_tp, decode_tp=decode_tp,
                      replicated=replicated, decode_block_bytes=decode_block_bytes, reads=tuple(reads))
