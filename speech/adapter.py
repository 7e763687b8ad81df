"""What the speech adapter registers with the core: the `mmspec.adapters` entry point loads this module (the
package itself imports its parts on first use, so reading audio or a folder stays torch-free)."""

from ..static_target import register_static_target
from ..targets import Target
from .target import WhisperTarget  # noqa: F401 (importing it registers it for the "whisper" model type)


def static_whisper_target(target: Target, widths: tuple[int, ...], backend: str) -> Target:
    """`compile=True`'s target for a Whisper model (`speech/static_target.py`, imported when first used)."""
    from .static_target import static_whisper_target as make

    return make(target, widths, backend)


register_static_target("whisper", static_whisper_target)
