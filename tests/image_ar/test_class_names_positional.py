"""The README's `pipe("red circle", callback_on_round=...)`: a class name (or names) in the first argument is
taken as the class, and a first argument that is no label at all is one MMSpecError."""

from __future__ import annotations

import pytest

from mmspec.errors import MMSpecError
from mmspec.zoo import entries

needs_zoo = pytest.mark.skipif(not any(e.name == "shapes-image-ar" for e in entries()), reason="needs the zoo")


@pytest.fixture(scope="module")
def pipe():
    from mmspec.image_ar.pipeline import SpeculativeImagePipeline

    return SpeculativeImagePipeline.from_pretrained("shapes-image-ar")


@needs_zoo
def test_a_class_name_in_the_first_argument_is_the_class(pipe):
    rounds = []
    out = pipe("red circle", method="ar", temperature=0, progress_bar=False, callback_on_round=lambda i, info: rounds.append(i))
    assert out.class_labels == [pipe.class_id("red circle")] and rounds
    assert pipe.resolve_labels(["red circle", "blue square"], None, 1) == [pipe.class_id("red circle"),
                                                                            pipe.class_id("blue square")]


@needs_zoo
@pytest.mark.parametrize("labels", [{"a": 1}, [object()], [[1, 2], [3]]])
def test_a_first_argument_that_is_no_label_is_one_error(pipe, labels):
    with pytest.raises(MMSpecError, match="class"):
        pipe.resolve_labels(labels, None, 1)
