"""vLLM ``Request`` objects for a traffic's turns, as the block-pool parity tests drive vLLM's own KVCacheManager
(tests/vllm_facing/test_block_pool_parity.py, test_hybrid_pool_parity.py): the prompt's token ids as the bench
sends them, and the output tokens sampled since, whose blocks then get hashed."""

from __future__ import annotations

from kvplan.traffic.model import Traffic
from kvplan.traffic.tokens import prompt_token_ids, token_ids


class VllmRequests:
    """Each turn's vLLM Request, made once and grown to the tokens the simulator says it holds."""

    def __init__(self, traffic: Traffic, block_hasher):
        from vllm.sampling_params import SamplingParams

        self.traffic, self.hasher, self.reqs = traffic, block_hasher, {}
        self.params = SamplingParams(max_tokens=1 << 16)

    def request(self, number: int, num_tokens: int):
        from vllm.v1.request import Request

        req = self.reqs.get(number)
        if req is None:
            ids = prompt_token_ids(self.traffic.turns[number], nonce="parity")
            req = self.reqs[number] = Request(request_id=str(number), prompt_token_ids=ids,
                                              sampling_params=self.params, pooling_params=None,
                                              block_hasher=self.hasher)
        outputs = token_ids(f"out:{number}", num_tokens - req.num_prompt_tokens)
        for tok in outputs[req.num_output_tokens:]:  # the tokens sampled since: their blocks get hashed
            req.append_output_token_ids(tok)
        assert req.num_tokens == num_tokens
        return req

    def preempt(self, mgr, number: int) -> None:
        """`Scheduler._preempt_request`: its blocks freed, back to no computed tokens, waiting again."""
        from vllm.v1.request import RequestStatus

        req = self.reqs[number]
        mgr.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED

    def finish(self, mgr, number: int) -> None:
        mgr.free(self.reqs.pop(number))


def free_queue(mgr) -> list[int]:
    """vLLM's free block queue, head (evicted first) to tail."""
    return [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
