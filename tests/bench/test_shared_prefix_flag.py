"""`--shared-prefix` means the same in `kvplan bench` as in `kvplan size`: tokens (or, for prompts of
varying length, a share of each prompt written with %)."""

import pytest

from kvplan.cli.bench_cmd import shared_prefix_share
from kvplan.errors import KvplanError


def test_tokens_of_a_fixed_prompt_and_shares():
    assert shared_prefix_share("256", 512, fixed=True) == 0.5
    assert shared_prefix_share("1k", 4096, fixed=True) == 0.25
    assert shared_prefix_share("25%", 512, fixed=False) == 0.25
    assert shared_prefix_share(None, 512, fixed=True) == 0.0 and shared_prefix_share("0", 512, fixed=False) == 0.0


@pytest.mark.parametrize("text, fixed, message", [
    ("0.5", True, "give tokens"),  # a bare fraction was the old meaning: refused, not read as 0 tokens
    ("512", True, "not shorter than the prompt"),
    ("64", False, "needs prompts of one length"),
    ("100%", True, "--shared-prefix"),
    ("x%", True, "25%"),
])
def test_what_is_refused(text, fixed, message):
    with pytest.raises(KvplanError) as err:
        shared_prefix_share(text, 512, fixed=fixed)
    assert message in str(err.value) + str(err.value.hint or "")
