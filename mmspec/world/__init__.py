"""The shapes world: seeded scenes of coloured shapes, their renders and captions.

Pure Python + numpy + PIL (PyAV only for writing video files). It feeds the
embedded toy model zoo and the benchmarks with data generated on the fly.
"""

from .captions import caption, describe, group_shapes
from .datasets import (caption_corpus, caption_prefix, example_seed, examples, heldout_prompts,
                       sample_example, write_prompts_file)
from .render import render_image, render_video, shape_state, write_video
from .scenes import (BACKGROUNDS, COLOURS, DIRECTIONS, KINDS, MOTIONS, SIZES, Scene, Shape, region,
                     sample_scene)

__all__ = [
    "BACKGROUNDS", "COLOURS", "DIRECTIONS", "KINDS", "MOTIONS", "SIZES", "Scene", "Shape",
    "caption", "caption_corpus", "caption_prefix", "describe", "example_seed", "examples",
    "group_shapes", "heldout_prompts", "region", "render_image", "render_video",
    "sample_example", "sample_scene", "shape_state", "write_prompts_file", "write_video",
]
