"""`mmspec transcribe`: speech to text with hybrid decoding (fast draft + Whisper verification)."""

from __future__ import annotations

import argparse
import json
import sys

from .common import LazyChoices, SharedFlags, stats_json


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("transcribe", parents=[flags.json],
                                 help="transcribe speech with hybrid decoding (fast draft + Whisper verification)")
    parser.add_argument("path", help="audio file (any file PyAV decodes, or the audio track of a video)")
    parser.add_argument("--model", default=None,
                        help="zoo name, local folder (transformers or CTranslate2 / faster-whisper) or Hub id of a Whisper model "
                             "(default: whisper-tiny.en)")
    parser.add_argument("--fast-decoder", default=None,
                        help="ctc, ar, or a fast decoder folder (default: the model folder's fast_decoder/, else ar_fast_decoder/)")
    parser.add_argument("--method", choices=LazyChoices("mmspec.speech.pipeline", "METHODS"), default=None, metavar="METHOD",
                        help="ar = plain greedy decoding, hybrid = fast draft + verification (default: hybrid if a fast "
                             "decoder exists, else ar)")
    parser.add_argument("--mode", choices=LazyChoices("mmspec.speech.hybrid", "MODES"), default="strict", metavar="MODE",
                        help="strict = identical to greedy decoding; relaxed = accept highly ranked drafts (hybrid only)")
    parser.add_argument("--language", default=None,
                        help="language code or name (default: detected; English-only models accept only en)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="per chunk (default: the decoder's limit)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..speech.models import DEFAULT_ASR_MODEL
    from ..speech.pipeline import TranscriptionPipeline

    if args.model is None:
        print(f"mmspec: using {DEFAULT_ASR_MODEL} (OpenAI Whisper tiny.en, English only; pass --model for another)",
              file=sys.stderr)
    pipe = TranscriptionPipeline.from_pretrained(args.model or DEFAULT_ASR_MODEL, fast_decoder=args.fast_decoder)
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r}", file=sys.stderr)
    out = pipe(args.path, method=args.method, mode=args.mode, language=args.language, max_new_tokens=args.max_new_tokens,
               progress_bar=not args.json)
    if out.note:
        print(f"mmspec: {out.note}", file=sys.stderr)
    if args.json:
        stats = stats_json(out.stats, decoder_passes=out.decoder_passes, chunks=len(out.chunks),
                           transcription_time_s=out.total_time_s)
        print(json.dumps({"text": out.text, "method": out.method, "mode": out.mode, "model": out.model, "note": out.note,
                          "stats": stats}, indent=2))
    else:
        print(out.text)
        print(f"{out.stats.summary()}; {out.decoder_passes} decoder passes over {len(out.chunks)} chunk(s)", file=sys.stderr)
    return 0
