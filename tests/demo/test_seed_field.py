"""The demo's seed fields: a number no generator takes (1e30, -1, 2.5, inf, nan) is a clear message in the page."""

from __future__ import annotations

import math

import pytest

gr = pytest.importorskip("gradio")


@pytest.mark.parametrize("seed", [1e30, -1, 2.5, math.inf, math.nan, 2.0**64])
def test_a_seed_no_generator_takes_is_a_clear_message(seed):
    from mmspec.demo.caption_tab import caption
    from mmspec.demo.image_tab import generate

    with pytest.raises(gr.Error, match=r"seed must be a whole number in 0\.\.18446744073709551615"):
        list(caption(None, "shapes-video-captioner", "ar", 4, 0, seed, False, progress=gr.Progress()))
    with pytest.raises(gr.Error, match=r"seed must be a whole number in 0\.\.18446744073709551615"):
        generate("shapes-image-ar", "red circle", "ar", seed, progress=gr.Progress())


def test_an_empty_or_ordinary_seed_is_taken():
    from mmspec.demo.fields import checked_seed

    assert checked_seed(None) == 0 and checked_seed(7.0) == 7 and checked_seed(2**64 - 1) == 2**64 - 1


def test_an_error_stays_in_the_page_until_closed():
    from mmspec.demo.caption_tab import caption
    from mmspec.demo.image_tab import generate

    with pytest.raises(gr.Error) as error:
        list(caption(None, "shapes-video-captioner", "ar", 4, 0, 0, False, progress=gr.Progress()))
    assert error.value.duration is None  # a corrupt upload's message does not vanish after 10 s
    with pytest.raises(gr.Error) as error:
        generate("shapes-image-ar", "", "ar", 0, progress=gr.Progress())
    assert error.value.duration is None
