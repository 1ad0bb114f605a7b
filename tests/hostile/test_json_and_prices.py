"""Issue 28, data: `--json` is strict JSON whatever a figure holds, and a price that would overflow the
cost columns is refused at parse time."""

from __future__ import annotations

import json

import pytest
from helpers.harness import invoke

from kvplan.cli.common import print_json
from kvplan.errors import KvplanError
from kvplan.paths import parse_json_text


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


@pytest.mark.parametrize(("text", "kwargs", "said"), [
    ('{"a": NaN}', {}, "f.json: NaN is not a number kvplan accepts"),
    ('[1, -Infinity]', {}, "f.json: -Infinity is not a number kvplan accepts"),
    ("\ufeff{}", {}, "f.json:1: not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) (column 1)"),
    ('{"a": 1,\n "b": }', {}, "f.json:2: not valid JSON: Expecting value (column 7)"),
    ('{"a": NaN}', {"max_number": 10.0}, "f.json: NaN is not a number kvplan accepts"),
    ('{"a": 11}', {"max_number": 10.0}, "f.json: the number 11 is past 10.0, more than any figure kvplan writes"),
])
def test_the_json_reader_names_what_it_refuses(text, kwargs, said):
    """`parse_json_text` with its one prepared decoder (the usual read) and with one made for the call (bounds,
    a byte-order mark) says the same things."""
    with pytest.raises(KvplanError) as caught:
        parse_json_text(text, "f.json", **kwargs)
    assert caught.value.message == said
    assert parse_json_text('{"a": [1, 2.5, "x"]}', "f.json", **kwargs) == {"a": [1, 2.5, "x"]}
    assert parse_json_text("[NaN]", "f.json", allow_nonfinite=True)[0] != 0
