"""The acceptance chart's positions read in order (1, 2, ..., 10, 11, 12), however the chart sorts its labels."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("gradio")


def test_positions_sort_in_numeric_order():
    from mmspec.demo.display import acceptance_frame

    frame = acceptance_frame(SimpleNamespace(per_position_acceptance=[0.5] * 12))
    labels = list(frame["draft position"])
    assert sorted(labels) == labels and len(labels) == 12
    assert [int(label) for label in labels] == list(range(1, 13))
