"""`mmspec transcribe`: speech to text (and subtitles) with hybrid decoding (fast draft + Whisper verification).

    mmspec transcribe talk.mp3                                 # text on stdout, whisper-tiny.en
    mmspec transcribe talk.mp3 --format srt --out talk.srt     # subtitles, written atomically
    mmspec transcribe recordings/ --format vtt --out subs/     # every audio file of a folder, one output each
    mmspec transcribe recordings/ --out transcripts.jsonl      # one JSON line per file, resumable (folder_runs)
    mmspec transcribe talk.mp3 --compute-type int8             # int8 products (exact: equals the int8 model's greedy)

By default the fastest exact method the model has runs: hybrid strict with its shipped fast decoder (for
whisper-tiny.en the self-drafter, also when the model is given as its package's folder), else greedy.
Start-up (importing the libraries, loading the model) is its own line on stderr, apart from the stats,
whose prefill is the decoder's (the encoder has its own figure).

In folder mode a file that fails (corrupt, empty, not audio, too short) is reported on its own line
and the others still run; the exit status is 2 when any failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from . import checks, choices, folder_runs, input_probes, outputs
from .collector import collector_paused
from .common import SharedFlags, set_threads, stats_json
from .model_checks import check_model
from .placement import add_placement_flags, placement_options
from .speech_languages import check_language

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".aac", ".wma", ".aif", ".aiff", ".webm",
                  ".mp4", ".mkv", ".mov"}


def register(commands: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = commands.add_parser("transcribe", parents=[flags.json, flags.threads],
                                 help="transcribe speech (text or subtitles) with hybrid decoding or greedy Whisper")
    parser.add_argument("path", help="audio file (any file PyAV decodes, or the audio track of a video), or a folder of them")
    parser.add_argument("--model", default=None,
                        help="zoo name, local folder (transformers or CTranslate2 / faster-whisper) or Hub id of a Whisper model "
                             "(default: whisper-tiny.en)")
    parser.add_argument("--fast-decoder", default=None,
                        help="ctc, ar, or a fast decoder folder (default: the model folder's fast_decoder/, else ar_fast_decoder/)")
    parser.add_argument("--method", choices=choices.TRANSCRIBE_METHODS, default=None, metavar="METHOD",
                        help="ar = plain greedy decoding, hybrid = fast draft + verification (default: hybrid if a fast "
                             "decoder exists, else ar)")
    parser.add_argument("--mode", choices=choices.HYBRID_MODES, default="strict", metavar="MODE",
                        help="strict = identical to greedy decoding; relaxed = accept highly ranked drafts (hybrid only)")
    parser.add_argument("--compute-type", choices=choices.COMPUTE_TYPES, default=None,
                        metavar="TYPE", help="float32 (default), int8 (int8 products in the encoder and decoder layers; "
                                             "CPU) or bfloat16; hybrid strict equals greedy decoding at that precision")
    parser.add_argument("--feature-padding", choices=choices.FEATURE_PADDINGS, default=None,
                        metavar="PADDING", help="how a window's log-mel features are padded to 30 s: log-mel (default; "
                                                "openai-whisper's and faster-whisper's zero frames) or audio "
                                                "(transformers' feature extractor: zero samples)")
    parser.add_argument("--language", default=None,
                        help="language code or name (default: detected; English-only models accept only en)")
    parser.add_argument("--max-new-tokens", type=checks.positive_int, default=None, help="per chunk (default: the decoder's limit)")
    parser.add_argument("--pack-seconds", type=checks.non_negative_float, default=None, metavar="S",
                        help="long audio: neighbouring speech regions are read together in windows of up to S seconds of "
                             "audio, one segment (subtitle cue) per window (default: the model's window, 30 s); 0: one "
                             "region per window, shorter cues")
    parser.add_argument("--condition-on-previous-text", action="store_true",
                        help="long audio: each window's decoder prompt starts with the text decoded so far (as "
                             "faster-whisper's default long-form transcription); windows are then decoded in order, "
                             "and each is still greedy decoding given its prompt")
    parser.add_argument("--timestamps", action="store_true", default=None,
                        help="decode with Whisper's timestamp tokens (as generate(return_timestamps=True) and "
                             "faster-whisper): small models drop fewer sentences of long windows; the text leaves the "
                             "timestamps out, and each window is still greedy decoding (with timestamps). Default: on "
                             "for a recording of more than one window (not with --batch-size or --compile), off for a "
                             "clip of one window")
    parser.add_argument("--no-timestamps", action="store_false", dest="timestamps",
                        help="decode every window without timestamp tokens")
    parser.add_argument("--format", choices=choices.TRANSCRIPT_FORMATS, default=None, metavar="FORMAT",
                        help="txt, json, srt or vtt (default: from --out's suffix, else txt; json with --json)")
    parser.add_argument("--out", default=None,
                        help="output file, written atomically (default: stdout); for a folder of audio: the output folder "
                             "(required), one FILE_STEM.FORMAT per audio file (FILE_NAME.FORMAT where stems collide), "
                             "or a FILE.jsonl: one JSON line per audio "
                             "file, resumable (a re-run skips files already in it)")
    parser.add_argument("--compile", action="store_true",
                        help="the static-shape compiled path (static decoder caches, fixed-width decoder steps, "
                             "torch.compile): the same transcripts; compiling takes a while once per run (one file at a "
                             "time: not with --batch-size)")
    parser.add_argument("--retry-failed", action="store_true",
                        help="with --out FILE.jsonl: run again the files whose line records an error")
    folder_runs.add_batch_size_flag(parser)
    add_placement_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    placement = placement_options(args)
    if args.timestamps and args.compile:
        raise MMSpecError("--timestamps: the compiled path decodes without timestamps; leave out --compile")
    if args.batch_size > 1 and args.compile:
        raise MMSpecError("--compile transcribes one file at a time; use --batch-size 1 with --compile")
    source = Path(args.path)
    if not source.exists():
        raise MMSpecError(f"audio file {args.path!r} does not exist" if not source.is_symlink() else checks.not_found(args.path))
    if checks.not_regular(args.path):
        raise MMSpecError(checks.not_regular(args.path))
    jsonl = None
    if args.out is not None and Path(args.out).suffix.lower() == ".jsonl":
        if args.format not in (None, "json"):
            raise MMSpecError(f"--out {args.out!r} holds JSON lines; --format {args.format} does not apply")
        jsonl = folder_runs.plan(args.path, args.out, AUDIO_SUFFIXES, args.retry_failed)
    elif args.retry_failed:
        raise MMSpecError("--retry-failed applies to --out FILE.jsonl (a results file that records each file's error)")
    if args.batch_size > 1 and jsonl is None:
        raise MMSpecError("--batch-size applies to a folder run into --out FILE.jsonl")
    if args.batch_size > 1 and args.condition_on_previous_text:
        raise MMSpecError("--condition-on-previous-text decodes each file's windows in order: use --batch-size 1")
    files = audio_files(source) if source.is_dir() else [source]
    if source.is_dir() and args.out is None:
        raise MMSpecError("a folder of audio needs --out DIR: one output file per audio file is written there")
    fmt = output_format(args)
    if args.out is not None and jsonl is None:  # before the model loads: an output that cannot be written fails now
        outputs.refuse_inputs(args.out, files)
        (outputs.check_folder if source.is_dir() else outputs.check_file)(args.out)
    if not source.is_dir() and jsonl is None:  # an empty or corrupt file fails now, before torch is imported
        input_probes.probe_audio(source)
    if (source.is_dir() or jsonl is not None) and not input_probes.any_readable(
            jsonl.files if jsonl is not None else files, input_probes.probe_audio):  # every file fails: no model needed
        if jsonl is not None:
            return jsonl.run(input_probes.refusal(input_probes.probe_audio), verb="transcribed", as_json=args.json)
        return transcribe_folder(input_probes.refusal(input_probes.probe_audio), files, Path(args.out), fmt, args)
    check_model(args.model, "ASR model", "speech")
    if args.fast_decoder not in (None, "ctc", "ar"):
        check_model(args.fast_decoder, "fast decoder", "fast-decoder")
    check_language(args.model, args.language)
    started = time.perf_counter()
    with collector_paused():  # the libraries' and the model's objects live until exit: nothing to collect yet
        from ..speech.models import DEFAULT_ASR_MODEL
        from ..speech.pipeline import TranscriptionPipeline

        imported = time.perf_counter() - started
        set_threads(args)
        if args.model is None:
            print(f"mmspec: using {DEFAULT_ASR_MODEL} (OpenAI Whisper tiny.en, English only; pass --model for another)",
                  file=sys.stderr)
        loading = time.perf_counter()
        pipe = TranscriptionPipeline.from_pretrained(
            args.model or DEFAULT_ASR_MODEL, fast_decoder=args.fast_decoder, compute_type=args.compute_type, **placement,
            **({} if args.feature_padding is None else {"feature_padding": args.feature_padding}))
    startup = time.perf_counter() - started
    print(f"mmspec: start-up {startup:.2f} s (import {imported:.2f} s, load {time.perf_counter() - loading:.2f} s; "
          f"compute type {pipe.compute_type})", file=sys.stderr)
    pipe.check_method(args.method)  # an unavailable method fails once, before any audio
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r}", file=sys.stderr)
    if args.batch_size > 1:
        pipe.check_batches(args.method, args.batch_size)  # a method that cannot batch fails once, before any audio
    if jsonl is not None:
        return jsonl.run(lambda path: transcript_record(pipe, path, args), verb="transcribed", as_json=args.json,
                         batch_size=args.batch_size, records_for=lambda paths: transcript_records(pipe, paths, args))
    if not source.is_dir():
        out = transcribe_one(pipe, source, args, progress=not args.json)
        emit(out, fmt, args.out, source, startup_s=startup)
        print(f"{out.stats.summary()}; encoder {out.encoder_time_s * 1e3:.0f} ms; {out.decoder_passes} decoder passes over "
              f"{len(out.chunks)} chunk(s)", file=sys.stderr)
        return 0
    return transcribe_folder(lambda path: transcribe_one(pipe, path, args, progress=True), files, Path(args.out), fmt, args)


def audio_files(folder: Path) -> list[Path]:
    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise MMSpecError(f"the folder {str(folder)!r} holds no audio files ({', '.join(sorted(AUDIO_SUFFIXES))})")
    return files


def output_format(args: argparse.Namespace) -> str:
    if args.format is not None:
        return args.format
    if args.out is not None and Path(args.out).suffix.lower().lstrip(".") in ("txt", "json", "srt", "vtt"):
        return Path(args.out).suffix.lower().lstrip(".")
    return "json" if args.json else "txt"


def transcribe_one(pipe: Any, path: Path, args: argparse.Namespace, progress: bool) -> Any:
    out = pipe(str(path), method=args.method, mode=args.mode, language=args.language, max_new_tokens=args.max_new_tokens,
               progress_bar=progress, pack_seconds=args.pack_seconds, compile=args.compile,
               condition_on_previous_text=args.condition_on_previous_text,
               timestamps=args.timestamps)
    if out.note:
        print(f"mmspec: {outputs.printable(path.name)}: {out.note}", file=sys.stderr)
    return out


def rendered(out: Any, fmt: str, source: Path, **extra: Any) -> str:
    from ..speech.subtitles import render

    stats = stats_json(out.stats, decoder_passes=out.decoder_passes, chunks=len(out.chunks),
                       transcription_time_s=out.total_time_s, encoder_time_s=out.encoder_time_s,
                       compute_type=out.compute_type, **extra)
    return render(out.segments, fmt, file=outputs.printable(source), text=out.text, method=out.method, mode=out.mode, model=out.model,
                  note=out.note, stats=stats)


def transcript_record(pipe: Any, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One line of a JSON-lines results file: the `--format json` object of the file (its "file" set by the folder run)."""
    record = json.loads(rendered(transcribe_one(pipe, path, args, progress=False), "json", path))
    record.pop("file", None)
    return record


def transcript_records(pipe: Any, paths: list[Path], args: argparse.Namespace) -> list[dict[str, Any] | Exception]:
    """The lines of a batch of files (`--batch-size`): each file is loaded alone (one that fails to load gets its
    error), then the others are transcribed in one batch."""
    from ..speech.audio import load_audio
    from ..speech.pipeline import check_duration

    results: list[dict[str, Any] | Exception | None] = [None] * len(paths)
    loaded = []
    for index, path in enumerate(paths):
        try:
            samples = load_audio(path, pipe.sampling_rate)
            check_duration(samples, pipe.sampling_rate, f"audio {str(path)!r}")
        except MMSpecError as error:
            results[index] = error
            continue
        loaded.append((index, samples))
    if loaded:
        outs = pipe([samples for _, samples in loaded], sampling_rate=pipe.sampling_rate, method=args.method,
                    mode=args.mode, language=args.language, max_new_tokens=args.max_new_tokens, progress_bar=False,
                    batch_size=len(loaded), pack_seconds=args.pack_seconds,
                    condition_on_previous_text=args.condition_on_previous_text, timestamps=args.timestamps)
        for (index, _), out in zip(loaded, outs):
            path = paths[index]
            if out.note:
                print(f"mmspec: {outputs.printable(path.name)}: {out.note}", file=sys.stderr)
            record = json.loads(rendered(out, "json", path))
            record.pop("file", None)
            results[index] = record
    return results  # type: ignore[return-value]  # every slot is filled


def emit(out: Any, fmt: str, destination: str | None, source: Path, **extra: Any) -> None:
    from ..speech.subtitles import write_atomically

    text = rendered(out, fmt, source, **extra)
    if destination is None:
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    else:
        write_atomically(destination, text)
        print(f"mmspec: wrote {destination}", file=sys.stderr)


def transcribe_folder(transcribe: Callable[[Path], Any], files: list[Path], out_dir: Path, fmt: str,
                      args: argparse.Namespace) -> int:
    """Each file on its own (`transcribe(path)`): a failure is reported for that file and the rest still run."""
    from ..speech.subtitles import write_atomically

    if out_dir.exists() and not out_dir.is_dir():
        raise MMSpecError(f"--out {str(out_dir)!r} is a file; a folder of audio needs an output folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    names = outputs.distinct_names(files, fmt)
    for index, path in enumerate(files, 1):
        print(f"mmspec: [{index}/{len(files)}] {outputs.printable(path.name)}", file=sys.stderr)
        target = out_dir / names[path]
        try:
            out = transcribe(path)
            write_atomically(target, rendered(out, fmt, path))
            results.append({"file": str(path), "output": str(target), "error": None})
        except MMSpecError as error:
            print(f"mmspec: error: {outputs.printable(path.name)}: {error}", file=sys.stderr)
            results.append({"file": str(path), "output": None, "error": str(error)})
    failed = [r for r in results if r["error"]]
    print(f"mmspec: transcribed {len(results) - len(failed)} of {len(results)} file(s) into {out_dir}"
          + (f"; failed: {', '.join(outputs.printable(Path(r['file']).name) for r in failed)}" if failed else ""), file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=2))
    return 2 if failed else 0
