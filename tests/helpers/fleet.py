"""A stand-in vLLM replica for the fleet tests (``kvplan bench --url A --url B``): the suite's CI budget holds one real
CPU engine, not two, so the second replica is this one, said so in each test that uses it.

``PoolReplica`` is a real loopback HTTP server (tests/helpers/fake_server.py: OpenAI streaming completions, one
token every ``token_gap_s``) whose /metrics is vLLM 0.32.0's own text recorded on the CPU engine
(tests/fixtures/vllm-0.32.0-cpu-metrics.txt), with the figures kvplan reads moved by the requests it serves, through
a pool of ``num_blocks`` blocks of ``block_size`` tokens (block 0 the null block, as vLLM counts it):

- a request of P prompt and M output tokens peaks at ``ceil((P + M - 1) / B)`` blocks; ``fit = usable // peak``
  requests run at once, the others wait (``num_requests_waiting`` and its ``capacity`` reason);
- a request that arrives while ``fit`` already run is counted as a preemption (the pool cannot hold it with the
  others at their peak: vLLM preempts one of them), so the replica first preempts at ``fit + 1`` in flight;
- ``kv_cache_usage_perc`` = running x peak / usable; prompt, generation and prefix-query tokens count every request
  served (prefix hits stay 0: kvplan's prompts are unique).

Written apart from kvplan's block rule on purpose: the tests compare kvplan's prediction with what this server does.
"""

from __future__ import annotations

import re
from pathlib import Path

from helpers.fake_server import FakeBehaviour, FakeServer

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-cpu-metrics.txt"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class PoolReplica(FakeServer):
    def __init__(self, num_blocks: int, block_size: int = 32, model_id: str = "fake", token_gap_s: float = 0.002,
                 **behaviour):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.peak_blocks = 1
        self.recorded = RECORDED.read_text().replace('model_name="tests/fixtures/tiny-llama"', f'model_name="{model_id}"')
        super().__init__(FakeBehaviour(model_id=model_id, token_gap_s=token_gap_s,
                                       metrics_text=lambda _scrape: self.metrics(), **behaviour))

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    @property
    def fit(self) -> int:
        return self.usable // self.peak_blocks

    async def _completions(self, request):
        body = await request.json()  # aiohttp keeps the body: the server's handler reads it again
        prompt, output = len(body.get("prompt") or []), int(body.get("max_tokens") or 1)
        self.peak_blocks = _ceil(prompt + output - 1, self.block_size)
        if self.behaviour.in_flight >= self.fit:
            self.preemptions += 1
        self.prompt_tokens += prompt
        try:
            return await super()._completions(request)
        finally:
            self.generation_tokens += output

    def metrics(self) -> str:
        in_flight = self.behaviour.in_flight
        running = min(in_flight, self.fit)
        values = {
            "vllm:num_requests_running{": running,
            "vllm:num_requests_waiting{": in_flight - running,
            'vllm:num_requests_waiting_by_reason{engine="0",model_name=': None,  # per reason, below
            "vllm:kv_cache_usage_perc{": running * self.peak_blocks / self.usable,
            "vllm:num_preemptions_total{": self.preemptions,
            "vllm:prompt_tokens_total{": self.prompt_tokens,
            "vllm:generation_tokens_total{": self.generation_tokens,
            "vllm:prefix_cache_queries_total{": self.prompt_tokens,
            "vllm:prefix_cache_hits_total{": 0,
        }
        out = []
        for line in self.recorded.splitlines():
            if line.startswith("vllm:num_requests_waiting_by_reason{"):
                line = _with_value(line, in_flight - running if 'reason="capacity"' in line else 0)
            elif line.startswith("vllm:cache_config_info{"):
                line = re.sub(r'num_gpu_blocks="\d+"', f'num_gpu_blocks="{self.num_blocks}"', line)
                line = re.sub(r'num_gpu_blocks_override="\d+"', f'num_gpu_blocks_override="{self.num_blocks}"', line)
                line = re.sub(r'kv_cache_size_tokens="\d+"',
                              f'kv_cache_size_tokens="{self.num_blocks * self.block_size}"', line)
                line = re.sub(r'(?<![_a-z])block_size="\d+"', f'block_size="{self.block_size}"', line)
            else:
                for prefix, value in values.items():
                    if value is not None and line.startswith(prefix):
                        line = _with_value(line, value)
                        break
            out.append(line)
        return "\n".join(out) + "\n"


def _with_value(line: str, value: float) -> str:
    return line.rsplit(" ", 1)[0] + f" {float(value)!r}"
