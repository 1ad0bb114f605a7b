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
    assert format_tokens(1024**2) == "1m" and format_tokens(3 * 1024**2) == "3m"  # not "1,024k"
    assert format_tokens(1536 * 1024) == "1,536k"
    for n in (1024**2, 131072, 1536 * 1024, 20000):  # what it prints reads back as the same count
        assert parse_tokens(format_tokens(n)) == n
    assert cdiv(127, 32) == 4 and cdiv(128, 32) == 4 and cdiv(129, 32) == 5


def test_one_rule_for_shares_of_the_pool():
    """Used shares round up, free shares down: one pool's two figures add up to 100%, and a float's last bit
    does not move a whole percent (0.19 x 100 = 19.000000000000004)."""
    from kvplan.units import format_share

    assert (format_share(0.875, free=False), format_share(0.125, free=True)) == ("88%", "12%")
    assert (format_share(0.19, free=False), format_share(0.81, free=True)) == ("19%", "81%")
    assert (format_share(0.8125, free=True), format_share(0.1875, free=False)) == ("81%", "19%")
    assert (format_share(1.25, free=False), format_share(-0.25, free=True)) == ("125%", "-25%")
    assert format_share(None, free=True) == "-" and format_share(12, free=False) == ">999%"
