"""`mmspec bench speech`: greedy vs hybrid decoding vs transformers' assisted generation vs faster-whisper on held-out
clips, at a chosen compute type."""

from __future__ import annotations

import argparse

from ..errors import MMSpecError
from . import checks, choices
from .common import SharedFlags, add_size_flag, emit, set_threads
from .model_checks import check_model


def register(benches: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = benches.add_parser("speech", parents=[flags.repeats, flags.threads, flags.json],
                                help="greedy vs hybrid decoding (CTC / AR fast decoder) vs transformers assisted "
                                     "generation on held-out clips")
    parser.add_argument("--model", default="whisper-tiny.en", help="zoo name, local folder or Hub id of a Whisper model")
    parser.add_argument("--data", default=None, help="folder with metadata.jsonl + clips (default: the zoo model's heldout/)")
    add_size_flag(parser, 20, "clips to use (the first N listed)", "--n")
    parser.add_argument("--fast-decoder", default=None, help="CTC fast decoder folder (default: the model folder's fast_decoder/)")
    parser.add_argument("--ar-fast-decoder", default=None,
                        help="AR fast decoder folder (default: the model folder's ar_fast_decoder/)")
    parser.add_argument("--feature-drafter", default=None,
                        help="feature drafter folder (default: the model folder's feature_drafter/)")
    parser.add_argument("--chain", type=checks.chain_lengths, default=(), metavar="K[,K...]",
                        help="also run the AR fast decoder as a chain drafter: re-draft K tokens every round, and the "
                             "feature drafter with K drafts a round (one row per K)")
    parser.add_argument("--batch-size", type=checks.batch_sizes, default=None, metavar="B[,B...]",
                        help="decode the clips in batches of each size (e.g. 1,4,8): plain batched generate vs mmspec's "
                             "methods that decode batches, tokens/s per batch size")
    parser.add_argument("--compute-type", choices=choices.COMPUTE_TYPES, default=None,
                        metavar="TYPE", help="precision of mmspec's rows and of the greedy reference: float32 (default), "
                                             "int8 or bfloat16")
    parser.add_argument("--feature-padding", choices=choices.FEATURE_PADDINGS, default=None,
                        metavar="PADDING", help="how mmspec's rows pad a clip's log-mel features to 30 s: log-mel "
                                                "(default, as faster-whisper does) or audio (transformers' extractor)")
    parser.add_argument("--no-peers", dest="peers", action="store_false",
                        help="leave out the faster-whisper rows (run by default when faster_whisper is installed)")
    parser.add_argument("--rows", type=lambda text: tuple(t.strip() for t in text.split(",") if t.strip()), default=None,
                        metavar="NAME[,NAME...]", help="run only these rows (plain-greedy, the reference, always runs), "
                                                        "e.g. greedy-loop,hybrid-strict-ar,faster-whisper-int8")
    parser.add_argument("--compile", action="store_true",
                        help="a twin row (' compiled') for greedy-loop and the strict hybrid rows on mmspec's static-shape "
                             "path (static decoder caches, fixed-width decoder steps, torch.compile); compiled before "
                             "timing, compile time in the notes")
    long = parser.add_mutually_exclusive_group()
    long.add_argument("--long-audio-minutes", type=checks.positive_float, default=None, metavar="N",
                      help="instead of the clips: one recording of about N minutes built from them (pauses between), "
                           "mmspec transcribe's long-audio path vs faster-whisper's own long-form paths (VAD, greedy), "
                           "interleaved, wall and CPU time, WER against the clips' texts")
    long.add_argument("--long-audio", default=None, metavar="FILE",
                      help="the same with your recording (WER against FILE's .txt sibling, when present)")
    long.add_argument("--startup", action="store_true",
                      help="instead of the clips: a one-off `mmspec transcribe CLIP` as a whole process (import, load, "
                           "transcribe a ~5 s clip) vs a Python script doing the same with faster-whisper, alternating, "
                           "wall and CPU time")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    mode = "--startup" if args.startup else "--long-audio" if args.long_audio_minutes is not None or args.long_audio else None
    if mode is not None:
        given = [flag for flag, value in (("--rows", args.rows), ("--batch-size", args.batch_size), ("--chain", args.chain),
                                          ("--compile", args.compile),
                                          ("--feature-drafter", args.feature_drafter),
                                          ("--feature-padding", args.startup and args.feature_padding)) if value]
        if given:
            raise MMSpecError(f"{', '.join(given)} applies to the clip rows, not to {mode}")
    check_inputs(args)
    set_threads(args)
    if args.startup:
        from ..speech.startup_bench import run_startup_bench

        emit(run_startup_bench(args.model, data=args.data, repeats=args.repeats, compute_type=args.compute_type,
                               threads=args.threads, peers=args.peers, progress=not args.json), args)
        return 0
    if args.long_audio_minutes is not None or args.long_audio is not None:
        from ..speech.long_bench import run_long_audio_bench

        emit(run_long_audio_bench(args.model, minutes=args.long_audio_minutes, audio=args.long_audio, data=args.data,
                                  repeats=args.repeats, compute_type=args.compute_type, peers=args.peers,
                                  feature_padding=args.feature_padding, progress=not args.json), args)
        return 0
    from ..speech.bench import run_speech_bench

    report = run_speech_bench(args.model, data=args.data, n=args.num_samples, repeats=args.repeats, fast_decoder=args.fast_decoder,
                              ar_fast_decoder=args.ar_fast_decoder, progress=not args.json, batch_sizes=args.batch_size,
                              chain_tokens=tuple(args.chain), feature_drafter=args.feature_drafter,
                              compute_type=args.compute_type, peers=args.peers, only=args.rows,
                              feature_padding=args.feature_padding, compile=args.compile)
    emit(report, args)
    return 0


def check_inputs(args: argparse.Namespace) -> None:
    """Row names, the data folder and the model folders, checked before torch is imported."""
    from ..speech.clip_folder import read_clip_folder

    unknown = [name for name in args.rows or () if not choices.speech_bench_row(name)]
    if unknown:
        raise MMSpecError(f"no row {', '.join(map(repr, unknown))} in any speech bench; its rows: "
                          f"{', '.join(choices.SPEECH_BENCH_ROWS)}, {', '.join(p + 'K' for p in choices.SPEECH_BENCH_NUMBERED_ROWS)} "
                          "(K: a --chain length); with --compile also "
                          f"{', '.join(r + choices.SPEECH_BENCH_COMPILED_SUFFIX for r in choices.SPEECH_BENCH_COMPILED_ROWS)}")
    if args.batch_size and (args.chain or args.feature_drafter is not None):  # as run_speech_bench says it
        raise MMSpecError("the --chain and --feature-drafter rows decode one recording at a time: they do not combine "
                          "with --batch-size")
    if args.data is not None and args.long_audio is None:
        read_clip_folder(args.data)
    check_model(args.model, "ASR model", "speech")
    for flag, value in (("fast decoder", args.fast_decoder), ("AR fast decoder", args.ar_fast_decoder)):
        check_model(value, flag, "fast-decoder")
    check_model(args.feature_drafter, "Whisper feature drafter", "feature-drafter")
