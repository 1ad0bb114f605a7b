"""The block rule, against the CPU engine observations in the engine fact sheet."""

import pytest

from kvplan.errors import KvplanError
from kvplan.plan.blocks import BlockRule


def test_fact_sheet_example_onsets():
    # 17 blocks of 32, prompt 64, output 64: usable 16; admission cdiv(64, 32) = 2 blocks;
    # peak cdiv(64 + 64 - 1, 32) = 4 blocks. 4 x 4 = 16 fits; 5 requests admitted (5 x 2 <= 16)
    # grow to 20 > 16 blocks: the first preemption and the first wait are both at 5.
    rule = BlockRule(num_blocks=17, block_size=32, prompt_tokens=64, output_tokens=64, max_num_seqs=128)
    assert (rule.usable_blocks, rule.admit_blocks, rule.peak_blocks) == (16, 2, 4)
    assert rule.first_kv_wait == 5 and rule.first_preemption == 5
    assert [rule.preempts(c) for c in (4, 5, 8, 16)] == [False, True, True, True]
    assert rule.label(4) == "neither" and rule.label(5) == "KV-limited"
    assert rule.kv_fill(2) == 0.5 and rule.kv_fill(8) == 1.0


def test_waiting_without_preemption_when_output_stays_in_the_prompt_blocks():
    # prompt 60, output 4: admission cdiv(60, 32) = 2 = peak cdiv(63, 32): requests never grow
    # after admission, so the 9th waits (9 x 2 > 16) and nobody is ever preempted.
    rule = BlockRule(17, 32, 60, 4, 128)
    assert rule.first_kv_wait == 9 and rule.first_preemption is None


def test_admission_limited_by_max_num_seqs():
    rule = BlockRule(1001, 16, 100, 100, max_num_seqs=4)
    assert rule.first_kv_wait is None and rule.label(8) == "admission-limited"


def test_first_chunk_admission_before_0_19():
    # Only the first chunk (max_num_batched_tokens) had to fit before 0.19.1.
    rule = BlockRule(101, 16, 4096, 16, 256, admit_full_prompt=False, max_num_batched_tokens=512)
    assert rule.admit_blocks == 32


def test_invalid_rule():
    with pytest.raises(KvplanError):
        BlockRule(1, 16, 10, 10, 4)
