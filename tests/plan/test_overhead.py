"""The overhead model's form (kvplan/plan/overhead.py), with hand-set coefficients.

Whether the shipped coefficients are what the fit gives is tests/validate/test_fit.py.
"""

import json

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.overhead import Estimate, OverheadModel, load_overhead, overhead_from_dict
from kvplan.units import GiB

MODEL = OverheadModel(
    sampler_bytes_per_logit=40.0, sampler_spread_low=0.5, sampler_spread_high=0.1,
    non_torch_bytes_single=100, non_torch_bytes_multi=500, non_torch_spread_bytes=30,
    cudagraph_bytes=(1, 2, 3), source="test",
)


def test_activation_is_sampler_plus_retained_hidden_states():
    # 1,024 rows x 128,256 vocab x 40 B = 5,253,365,760; 8,192 tokens x 4,096 x 2 B = 67,108,864.
    est = MODEL.activation(1024, 128_256, 8192, 4096, 2)
    assert est.bytes == 5_253_365_760 + 67_108_864
    # low: sampler x (1 - 0.5) = 2,626,682,880; high: x 1.1 = 5,778,702,336.
    assert est.low == 2_626_682_880 + 67_108_864
    assert est.high == 5_778_702_336 + 67_108_864


def test_a_stage_before_the_last_runs_no_sampler():
    assert MODEL.activation(1024, 128_256, 8192, 4096, 2, samples=False) == Estimate.exact(67_108_864)


def test_the_forward_pass_peaks_when_the_sampler_is_small():
    # V0 profiled max_model_len tokens at once: Llama-3.1-8B at 20,000 tokens holds
    # [T, 2 x 14,336] + [T, 14,336] MLP activations and 3 x [T, 4,096] hidden states in bf16:
    # 20,000 x (3 x 14,336 + 3 x 4,096) x 2 = 2,211,840,000 B = 2.06 GiB (the log: 2.07 GiB).
    est = MODEL.activation(256, 128_256, 20_000, 4096, 2, mlp_width=14_336)
    assert est == Estimate.exact(2_211_840_000)
    # With 8,192 tokens the sampler's 1,024 x 128,256 logits dominate again.
    big = MODEL.activation(1024, 128_256, 8192, 4096, 2, mlp_width=14_336)
    assert big.bytes == 5_253_365_760 + 67_108_864


def test_sampler_rows_are_min_of_batched_tokens_and_max_num_seqs():
    # gpu_model_runner.py::_dummy_run@0.11.0: num_reqs = min(num_tokens, max_num_seqs).
    assert OverheadModel.sampler_logits(1024, 8192, 1000) == 1024 * 1000
    assert OverheadModel.sampler_logits(1024, 512, 1000) == 512 * 1000


def test_non_torch_by_world_size_and_cuda_graphs():
    assert MODEL.non_torch(1) == Estimate(100, 70, 130)
    assert MODEL.non_torch(2) == Estimate(500, 470, 530)
    assert MODEL.non_torch(8) == Estimate(500, 470, 530)
    assert MODEL.cudagraphs() == Estimate(2, 1, 3)
    assert MODEL.sampler_relative_spread == 0.5


def test_a_calibration_shifts_non_torch_and_names_itself():
    cal = MODEL.calibrated(-40, "H100, vLLM 0.11.0, llama")
    assert cal.non_torch(1).bytes == 60 and cal.non_torch(4).bytes == 460
    assert cal.calibration == "H100, vLLM 0.11.0, llama"
    assert cal.activation(1, 10, 1, 1, 2) == MODEL.activation(1, 10, 1, 1, 2)


def test_the_file_format(tmp_path):
    doc = {"source": "x", "sampler_bytes_per_logit": 38.5, "sampler_spread": [0.5, 0.01],
           "non_torch_gib_single": 0.125, "non_torch_gib_multi": 0.5, "non_torch_spread_gib": 0.0625,
           "cudagraph_gib": [0.25, 0.5, 1.0]}
    m = overhead_from_dict(doc, "f")
    assert m.non_torch_bytes_single == GiB // 8 and m.non_torch_spread_bytes == GiB // 16
    assert m.cudagraph_bytes == (GiB // 4, GiB // 2, GiB)
    f = tmp_path / "o.json"
    f.write_text(json.dumps(doc))
    assert load_overhead(str(f)) == m.__class__(**{**m.__dict__, "source": "x"})
    bad = tmp_path / "bad.json"
    bad.write_text('{"sampler_bytes_per_logit": 1}')
    with pytest.raises(KvplanError, match="overhead model"):
        load_overhead(str(bad))


def test_shipped_model_says_where_it_came_from():
    m = load_overhead()
    assert "kvplan.validate.fit" in m.source
    # The physical form: bytes per logit must be at least the fp32 logits themselves (4 B).
    assert m.sampler_bytes_per_logit > 4
    assert m.non_torch_bytes_multi > m.non_torch_bytes_single > 0
