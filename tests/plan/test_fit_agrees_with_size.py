"""`kvplan fit` and `kvplan size` give the same verdict for the same deployment, on every bundled
profile (issue 21: fit priced quantized checkpoints at bf16 and found NOTHING FITS for DeepSeek-V3 on
H200s, where size fits 8 x H200 with 95% headroom)."""

from __future__ import annotations

import pytest

from kvplan.deploy import load_model, plan_deployment, select_gpus
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import find_device
from kvplan.model.source import bundled_names
from kvplan.plan.fit import FitRequest, search
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.vllm.rules import rules_for

GPUS = ("H100", "L40S")
CONTEXTS = (8192, 32768)
TPS = (1, 2, 4, 8)


def _size_plan(model, gpu: str, tp: int, ctx: int, kv_dtype: str):
    """size's plan for tp GPUs of one replica (its verdict: what would fit instead is `fit`'s search again, left out);
    None if size refuses the deployment."""
    try:
        plan = plan_deployment(model, select_gpus(f"{tp}x{gpu}"), Settings(tensor_parallel_size=tp, max_model_len=ctx,
                                                                            kv_cache_dtype=kv_dtype),
                               overhead=load_overhead(), use_calibration=False, suggest=False)
    except KvplanError:
        return None
    return plan


@pytest.mark.parametrize("name", bundled_names())
def test_fit_and_size_agree_on_every_single_replica_deployment(name):
    model = load_model(name, None, "bundled", True, {})
    rules, overhead = rules_for(None), load_overhead()
    limit = model.arch.max_model_len_limit
    checked = 0
    for gpu in GPUS:
        device = find_device(gpu)
        for ctx in sorted({min(c, limit) if limit else c for c in CONTEXTS}):
            res = search(model.arch, [device], FitRequest(ctx=ctx, concurrency=1), rules, overhead, model.weights_total)
            fitting = {(c.tp, c.kv_dtype): c for c in res.fitting if c.pp == 1 and c.dp == 1 and c.ctx == ctx}
            for tp in TPS:
                resolved: dict[str, str] = {}  # the KV dtype vLLM ends up with -> the first asked one giving it
                for kv_dtype in ("auto", "fp8"):
                    plan = _size_plan(model, gpu, tp, ctx, kv_dtype)
                    if plan is None:  # size refuses the deployment (TP does not divide the heads...)
                        assert (tp, kv_dtype) not in fitting, (gpu, ctx, tp, kv_dtype)
                        continue
                    if plan.kv_cache_dtype in resolved:  # "fp8" is what "auto" already gave: fit lists it once
                        assert (tp, kv_dtype) not in fitting, (gpu, ctx, tp, kv_dtype, plan.kv_cache_dtype)
                        continue
                    resolved[plan.kv_cache_dtype] = kv_dtype
                    fits = plan.fits
                    assert ((tp, kv_dtype) in fitting) == fits, (
                        f"{name} on {tp} x {gpu} at {ctx:,} ({kv_dtype}): size says {'FITS' if fits else 'does not fit'}, "
                        f"fit {'lists' if (tp, kv_dtype) in fitting else 'rejects'} it "
                        f"(fit's reasons: {res.rejected_reasons})")
                    if fits:  # the same plan: the same blocks of the same pool (the same weights)
                        cand = fitting[(tp, kv_dtype)]
                        assert f"{cand.blocks_needed:,} of {cand.usable_blocks:,} usable" in plan.verdict, (cand, plan.verdict)
                    checked += 1
    assert checked > 0
