"""The values of the CLI's choice flags, as plain constants.

The pipelines own these lists, but importing a pipeline imports torch and transformers (seconds): a typo in
`--method` must be refused at once. `tests/test_fast_refusals.py` checks that each list equals the registry
it copies, so they cannot drift apart.
"""

from __future__ import annotations

import re

# mmspec.speech: pipeline.METHODS, hybrid.MODES, precision.COMPUTE_TYPES, features.FEATURE_PADDINGS, subtitles.FORMATS
TRANSCRIBE_METHODS = ("hybrid", "ar")
HYBRID_MODES = ("strict", "relaxed")
COMPUTE_TYPES = ("float32", "int8", "bfloat16")
FEATURE_PADDINGS = ("audio", "log-mel")
TRANSCRIPT_FORMATS = ("txt", "json", "srt", "vtt")
# mmspec.vision.pipeline.METHODS
CAPTION_METHODS = ("ar", "text", "std", "msd", "flash")
# mmspec.image_ar.pipeline.IMAGE_METHODS
IMAGE_METHODS = ("ar", "sd", "sjd", "gsd", "lantern", "code", "cspd")

# Every row `mmspec bench speech` can have (mmspec.speech.bench, speech.peers); which of them run depends on the
# fast decoders and peers the model has, known once it loads. A name outside these is a typo, refused at once.
SPEECH_BENCH_ROWS = ("plain-greedy", "greedy-loop", "hybrid-strict", "hybrid-relaxed", "hybrid-strict-ar",
                     "hybrid-strict-ar-f32head", "hybrid-strict-ar-whole", "hybrid-strict-ar-redraft", "hf-assisted-ar",
                     "faster-whisper-float32", "faster-whisper-int8")
SPEECH_BENCH_NUMBERED_ROWS = ("hybrid-strict-ar-chain", "feature-chain")  # followed by the --chain length
# mmspec.speech.bench_compiled.TWINNED_ROWS / SUFFIX: the rows `--compile` adds a compiled twin of, and its suffix
SPEECH_BENCH_COMPILED_ROWS = ("greedy-loop", "hybrid-strict", "hybrid-strict-ar")
SPEECH_BENCH_COMPILED_SUFFIX = " compiled"


def speech_bench_row(name: str) -> bool:
    """Whether `name` is a row some model could have in `mmspec bench speech`."""
    if name in SPEECH_BENCH_ROWS:
        return True
    if name.endswith(SPEECH_BENCH_COMPILED_SUFFIX) and name[:-len(SPEECH_BENCH_COMPILED_SUFFIX)] in SPEECH_BENCH_COMPILED_ROWS:
        return True
    return any(re.fullmatch(re.escape(prefix) + r"[1-9][0-9]*", name) for prefix in SPEECH_BENCH_NUMBERED_ROWS)

# mmspec.vision.distill_data.DISTILL_FORMAT: the "format" of a distillation data folder's metadata.json
DISTILL_FORMAT = "mmspec-distill-v1"
