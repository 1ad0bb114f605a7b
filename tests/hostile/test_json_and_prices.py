"""Issue 28, data: `--json` is strict JSON whatever a figure holds, and a price that would overflow the
cost columns is refused at parse time."""

from __future__ import annotations

import json

import pytest
from helpers.harness import invoke

from kvplan.cli.common import print_json


def bad(*argv: str) -> str:
    r = invoke(*argv)
    assert r.code == 2, (r.code, r.stderr[-2000:])
    return r.one_line_error()


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("price", ["1e308", "inf", "nan", "-1", "1000001"])
def test_fit_refuses_a_price_out_of_range(price):
    line = bad("fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--price", f"H100={price}", "--json")
    assert "--price" in line and "1,000,000" in line


def test_fit_with_the_highest_price_still_prints_strict_json():
    r = invoke("fit", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--price", "H100=1000000", "--json")
    assert r.code in (0, 1), r.stderr
    _strict(r.stdout)


def test_print_json_writes_a_non_finite_figure_as_null(capsys):
    print_json({"a": float("inf"), "b": [1.5, float("nan")], "c": {"d": -float("inf")}, "e": 2})
    assert _strict(capsys.readouterr().out) == {"a": None, "b": [1.5, None], "c": {"d": None}, "e": 2}
