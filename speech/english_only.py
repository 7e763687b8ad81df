"""What an English-only Whisper (tiny.en, ...) accepts, torch-free: the loaded model's check
(`target.check_language_and_task`) and the CLI's check before torch is imported give the same refusal."""

from __future__ import annotations

from ..errors import MMSpecError

ENGLISH = ("en", "english", "<|en|>")


def english_only(language: str | None, task: str | None) -> tuple[None, None]:
    """An English-only model transcribes English: language "en" and task "transcribe" are what it does anyway (its
    prompt names neither), anything else is refused."""
    if language is not None and language.lower() not in ENGLISH:
        raise MMSpecError(f"this model is English-only: it cannot transcribe language {language!r} (use a multilingual "
                          "Whisper, or leave the language out)")
    if task is not None and task != "transcribe":
        raise MMSpecError(f"this model is English-only: it cannot {task} (only task 'transcribe')")
    return None, None
