"""The step log (kvplan.plan.steplog): a decode run kept as one entry reads back as the steps it stands for."""

from __future__ import annotations

import pytest

from kvplan.plan.steplog import StepBatch, StepLog


def test_a_decode_run_reads_back_step_by_step():
    log = StepLog()
    first, last = StepBatch(64, 1, 65, 2, 2144), StepBatch(8, 2, 40, 3, 200)
    log.add(first, 1.5, 0.25)
    log.add_decode_run(3, 10, [2.0, 2.5, 3.0], [0.25, 0.25, 0.5])  # kv 10, 13, 16: three more tokens a step
    log.add(last, 4.0, 0.5)
    expected = [first, StepBatch(0, 3, 10, 3, 10), StepBatch(0, 3, 13, 3, 13), StepBatch(0, 3, 16, 3, 16), last]
    assert len(log) == len(log.batches) == len(log.kv_fill) == 5
    assert list(log.batches) == expected and log.batches == expected and expected == log.batches
    assert [log.batches[i] for i in range(5)] == expected and log.batches[-2] == expected[3]
    assert log.batches[1:4] == expected[1:4] and log.batches[::2] == expected[::2]
    assert list(log.kv_fill) == [(0, 1.5, 0.25), (1, 2.0, 0.25), (2, 2.5, 0.25), (3, 3.0, 0.5), (4, 4.0, 0.5)]
    assert log.kv_fill[3] == (3, 3.0, 0.5) and log.kv_fill[-1] == (4, 4.0, 0.5)
    assert log.batches != expected[:4] and log.batches != [*expected[:4], first]
    with pytest.raises(IndexError):
        log.batches[5]
    with pytest.raises(IndexError):
        log.kv_fill[-6]
    with pytest.raises(IndexError):
        log.batch(5)  # (past the run: not a step it stands for)
    assert repr(log.batches) == "<Batches of 5 steps>"


def test_an_empty_log():
    log = StepLog()
    assert len(log.batches) == 0 and list(log.kv_fill) == [] and log.batches == []
