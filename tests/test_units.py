import pytest

from kvplan.errors import KvplanError
from kvplan.units import GiB, MiB, cdiv, format_bytes, format_tokens, parse_bytes, parse_fraction, parse_tokens


@pytest.mark.parametrize(
    "text, expected",
    [("32k", 32768), ("32K", 32768), ("32768", 32768),
     ("32,768", 32768), ("128k", 131072), ("1m", 1048576), ("0.5k", 512), (4096, 4096)],
)
def test_parse_tokens(text, expected):
    assert parse_tokens(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "32q", "-5", "0", "1.5", "32 kk", "k"])
def test_parse_tokens_rejects_nonsense(text):
    with pytest.raises(KvplanError):
        parse_tokens(text)


@pytest.mark.parametrize(
    "text, expected",
    [("24GiB", 24 * GiB), ("24GB", 24 * 10**9), ("512MiB", 512 * MiB), ("1.5GiB", int(1.5 * GiB)), ("67108864", 67108864),
     ("80 gb", 80 * 10**9)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["24XB", "GiB", "-3GiB", "0", "twelve", "", "24", "80"])
def test_parse_bytes_rejects_nonsense(text):
    with pytest.raises(KvplanError):
        parse_bytes(text)


def test_parse_fraction():
    assert parse_fraction("0.9") == 0.9
    assert parse_fraction("90%") == 0.9
    for bad in ("1.5", "0", "abc", "-0.1"):
        with pytest.raises(KvplanError):
            parse_fraction(bad)


def test_formatting_and_cdiv():
    assert format_bytes(14.99 * GiB) == "14.99 GiB"
    assert format_bytes(2 * MiB) == "2.00 MiB"
    assert format_tokens(131072) == "128k"
    assert format_tokens(20000) == "20,000"
    assert cdiv(127, 32) == 4 and cdiv(128, 32) == 4 and cdiv(129, 32) == 5
