"""`kvplan size`'s "what would fit" from `kvplan fit`'s search (issue 10 item 3): scale out on the
asked GPU first, the same vendor before another, and the single changes (context cap, fp8 KV) kept.

Llama-3.1-70B: 141 GB of bf16 weights (70.6e9 parameters x 2 B, 131.4 GiB), 327,680 B of KV a token
(80 layers x 8 KV heads x 128 x 2 (K, V) x 2 B); 64 attention heads. An H100 SXM holds 79.18 GiB,
x 0.92 (vLLM's default utilization) = 72.85 GiB.
"""

from __future__ import annotations

import pytest

from kvplan.deploy import load_model, select_gpus
from kvplan.hardware.catalog import find_device
from kvplan.plan.overhead import load_overhead
from kvplan.plan.schema import Settings
from kvplan.plan.size import ModelRef, plan_size
from kvplan.vllm.rules import rules_for

GiB = 2**30
UTIL = 0.92
WEIGHTS = 70_553_706_496 * 2  # the model card's parameter count, bf16


@pytest.fixture(scope="module")
def llama70b():
    return load_model("meta-llama/Llama-3.1-70B", offline=True)


def plan(model, gpu: str, ctx: int, catalog_names: list[str] | None = None, **settings):
    from kvplan.hardware.catalog import load_catalog

    catalog = (list(load_catalog()[0].values()) if catalog_names is None
               else [find_device(n) for n in catalog_names])
    ref = ModelRef(model.config.name, model.config.source, model.config.detail, model.weights_total)
    return plan_size(ref, model.arch, select_gpus(gpu), Settings(max_model_len=ctx, **settings), rules_for("0.33.0"),
                     load_overhead(), catalog)


def test_the_facts_the_tests_rest_on(llama70b):
    assert llama70b.arch.params.total * llama70b.arch.model_dtype_bytes == WEIGHTS
    assert WEIGHTS / GiB == pytest.approx(131.4, abs=0.1)
    assert find_device("H100-SXM").cuda_total_bytes / GiB == pytest.approx(79.18, abs=0.01)
    assert llama70b.arch.num_attention_heads == 64
    assert rules_for("0.33.0").default_gpu_memory_utilization == UTIL


def test_a_70b_on_one_h100_is_told_two_h100s_with_tp_2(llama70b):
    """The issue's example. One H100 cannot hold 131.4 GiB of weights (72.85 GiB usable), so 2 GPUs
    is the fewest; at TP 2 each holds 65.7 GiB, and a 4k request's KV is 4,096 x 163,840 B = 0.625 GiB
    a GPU, within what is left. The other GPU offered needs fewer GPUs (one) and is NVIDIA."""
    p = plan(llama70b, "H100", 4096)
    assert not p.fits
    searched = [s for s in p.suggestions if "GPU" in s.change]
    assert searched[0].change == "tensor parallel 2 on 2 GPUs"
    assert searched[0].flags == "--gpu 2xH100-SXM --tp 2" and searched[0].fits
    assert searched[0].updates == {"gpu": "2xH100-SXM", "tensor_parallel_size": "2"}
    other = searched[1]
    assert other.change.startswith("a bigger GPU: 1 x ") and other.fits
    device = find_device(other.change.removeprefix("a bigger GPU: 1 x "))
    assert device.vendor == "nvidia" and device.cuda_total_bytes * UTIL > WEIGHTS
    # The suggested flags read back: that deployment fits.
    again = plan(llama70b, "2xH100-SXM", 4096, tensor_parallel_size=2)
    assert again.fits


def test_at_128k_scaling_out_needs_four(llama70b):
    """128k tokens: a request holds 131,072 x 327,680 B = 40 GiB of KV. At TP 2 a GPU keeps
    72.85 - 65.7 = 7.1 GiB before activations for its 20 GiB half: no. 3 GPUs do not split (TP must
    divide 64 heads; 3 replicas of one GPU cannot hold the weights). At TP 4: 72.85 - 32.9 = 39.9 GiB
    a GPU for 10 GiB: fits."""
    p = plan(llama70b, "H100", 131072)
    first = next(s for s in p.suggestions if "GPU" in s.change)
    assert first.change == "tensor parallel 4 on 4 GPUs" and first.flags == "--gpu 4xH100-SXM --tp 4" and first.fits


def test_the_same_vendor_before_another(llama70b):
    """At 128k, with H200 and MI325X to choose from: one H200 cannot hold the weights
    (139.8 GiB x 0.92 = 128.6 < 131.4) but two can, fewer than the H100s' four; one MI325X (256 GB)
    would do alone, yet the H200s are offered (the asked GPU's vendor first). Without the H200
    the MI325X is."""
    h200 = find_device("H200")
    assert h200.cuda_total_bytes * UTIL < WEIGHTS
    p = plan(llama70b, "H100", 131072, ["H100-SXM", "H200", "MI325X"])
    changes = [s.change for s in p.suggestions if "GPU" in s.change]
    assert changes == ["tensor parallel 4 on 4 GPUs", f"a bigger GPU: 2 x {h200.name}, tensor parallel 2"]
    p = plan(llama70b, "H100", 131072, ["H100-SXM", "MI325X"])
    changes = [s.change for s in p.suggestions if "GPU" in s.change]
    assert changes == ["tensor parallel 4 on 4 GPUs", "a bigger GPU: 1 x MI325X"]


def test_single_changes_are_kept(llama70b):
    """2 x H100 at TP 2 and 8k: 8,192 x 163,840 B = 1.25 GiB of KV a GPU, just above what is left:
    a context cap or fp8 KV (half the bytes) fixes it without more GPUs, and both are offered."""
    p = plan(llama70b, "2xH100-SXM", 8192, tensor_parallel_size=2)
    assert not p.fits
    changes = [s.change for s in p.suggestions]
    assert "cap the context" in changes and "fp8 KV cache" in changes
    assert changes.index("fp8 KV cache") < changes.index("tensor parallel 4 on 4 GPUs")


def test_a_pinned_pool_gets_no_gpu_suggestion(llama70b):
    p = plan(llama70b, "2xH100-SXM", 8192, tensor_parallel_size=2, num_gpu_blocks_override=10)
    assert not any("GPU" in s.change for s in p.suggestions)


def test_every_suggested_command_line_plans_what_it_promised():
    """Each GPU suggestion's flags, run as given, must fit: a data-parallel suggestion carries `--tp 1`,
    since `--gpu 3xB300` alone means tensor parallel 3 (all GPUs / pp)."""
    import json
    import shlex
    import subprocess
    import sys

    base = ["meta-llama/Llama-3.1-8B-Instruct", "--ctx", "32k", "-c", "128", "--gpu", "H100"]

    def size(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kvplan", "size", *args, "--json"], capture_output=True,
                              text=True, timeout=120, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})

    first = size(*base)
    assert first.returncode == 1, first.stderr  # 128 x 32k does not fit one H100
    suggestions = [s for s in json.loads(first.stdout)["suggestions"] if s["flags"].startswith("--gpu")]
    assert any("replicas" in s["change"] for s in suggestions)
    for sug in suggestions:
        flags = shlex.split(sug["flags"])
        if "replicas" in sug["change"]:
            assert "--tp" in flags, sug
        again = size(*base[:-2], *flags)
        assert again.returncode == 0, (sug, again.stdout[-400:], again.stderr)


def _headroom(result: str) -> int:
    import re

    return int(re.search(r"\((\d+)% headroom\)", result).group(1))


@pytest.mark.parametrize("name,gpu,ctx", [("openai/gpt-oss-120b", "H100", 131072),
                                          ("meta-llama/Llama-3.1-8B", "4090", 65536),
                                          ("meta-llama/Llama-3.1-8B", "4090", 60000)])
def test_suggestions_keep_ten_percent_headroom_and_round_caps(name, gpu, ctx):
    """Issue 21 item 7: no suggestion at 0-1% headroom, context caps people write (multiples of 1,024)."""
    from kvplan.plan.size import MIN_SUGGESTED_HEADROOM

    assert MIN_SUGGESTED_HEADROOM == 0.10
    p = plan(load_model(name, offline=True), gpu, ctx)
    assert not p.fits and p.suggestions
    for s in p.suggestions:
        if s.fits and "headroom" in s.result:
            assert _headroom(s.result) >= 10, s
        if s.change == "cap the context":
            assert int(s.updates["max_model_len"]) % 1024 == 0, s


def test_a_datacenter_ask_is_never_offered_a_desktop_gpu():
    """Mixtral-8x7B (46.7e9 parameters, 87 GiB of bf16 weights) at 4k on one H100 (79.18 GiB): the smallest
    single GPU that holds it is a DGX Spark (GB10, 119.7 GiB), which kvplan offered before; a datacenter ask
    gets a datacenter part (H200: 139.8 GiB). A 4090 ask may still get desktop parts."""
    from kvplan.hardware.catalog import find_device

    model = load_model("mistralai/Mixtral-8x7B-v0.1", offline=True)
    offered = [s.change.split(" x ", 1)[1].split(",")[0] for s in plan(model, "H100", 4096).suggestions
               if "GPU:" in s.change]
    assert offered and all(find_device(o).gpu_class == "datacenter" for o in offered), offered
    assert find_device("GB10").gpu_class == "desktop" and find_device("4090").gpu_class == "desktop"
    desktop = plan(load_model("meta-llama/Llama-3.1-8B", offline=True), "4090", 65536)
    assert any("RTX 5090" in s.change for s in desktop.suggestions)  # the asked class first
