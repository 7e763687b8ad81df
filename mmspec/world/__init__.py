"""The shapes world: seeded scenes of coloured shapes, their renders and captions.

Two kinds of scene: one-shape-grammar scenes (:func:`sample_scene`, short captions) and
detailed scenes (:func:`sample_detailed_scene`: 1-4 shapes acting in turn, passing behind
or in front of each other; 60-150-token captions that a checker parses back into facts).

Pure Python + numpy + PIL (PyAV only for writing video files). It feeds the
embedded toy model zoo and the benchmarks with data generated on the fly.
"""

from .captions import caption, describe, group_shapes
from .datasets import (
                       caption_corpus,
                       caption_prefix,
                       caption_token_cap,
                       captioner_examples,
                       detailed_examples,
                       example_seed,
                       examples,
                       heldout_prompts,
                       sample_detailed_example,
                       sample_example,
                       write_prompts_file,
)
from .detailed_captions import detailed_caption, estimate_tokens
from .detailed_facts import all_correct, check_caption, parse_facts, scene_facts, score_facts
from .detailed_scenes import LONG_FRAMES, DetailedScene, Interaction, event_slots, interactions, sample_detailed_scene
from .render import render_image, render_video, shape_state, write_video
from .scenes import BACKGROUNDS, COLOURS, DIRECTIONS, KINDS, MOTIONS, SIZES, Scene, Shape, region, sample_scene

__all__ = [
    "BACKGROUNDS", "COLOURS", "DIRECTIONS", "KINDS", "LONG_FRAMES", "MOTIONS", "SIZES", "DetailedScene", "Interaction",
    "Scene", "Shape", "all_correct", "check_caption", "detailed_caption", "detailed_examples", "estimate_tokens",
    "event_slots", "interactions", "parse_facts", "sample_detailed_example", "sample_detailed_scene", "scene_facts",
    "score_facts",
    "caption", "caption_corpus", "caption_prefix", "caption_token_cap", "captioner_examples", "describe",
    "example_seed", "examples",
    "group_shapes", "heldout_prompts", "region", "render_image", "render_video",
    "sample_example", "sample_scene", "shape_state", "write_prompts_file", "write_video",
]
