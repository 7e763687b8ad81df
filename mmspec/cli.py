"""The `mmspec` command line: a thin face over the pipelines and the bench harness."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import MMSpecError


def add_generation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="shapes-caption-lm", help="zoo name, local folder or Hub id of the target")
    parser.add_argument("--drafter", default="shapes-caption-drafter", help="zoo name, local folder or Hub id of the drafter")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-draft-tokens", "-k", type=int, default=5)


def cmd_generate(args: argparse.Namespace) -> int:
    import torch

    from .decoding import speculative_generate
    from .drafters import PromptLookupDrafter
    from .policies import make_policy
    from .zoo import load_causal_lm

    target, tokenizer = load_causal_lm(args.model, "target")
    if tokenizer is None:
        raise MMSpecError(f"{args.model!r} has no tokenizer; `mmspec generate` needs one to read the prompt")
    drafter = PromptLookupDrafter() if args.drafter == "prompt-lookup" else load_causal_lm(args.drafter, "drafter")[0]
    if not args.prompt.strip():
        raise MMSpecError("the prompt is empty")
    input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    generator = torch.Generator().manual_seed(args.seed)
    out = speculative_generate(
        target, drafter, input_ids, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator,
        policy=make_policy(args.policy, args.num_draft_tokens),
    )
    text = tokenizer.decode(out.sequences[0], skip_special_tokens=True)
    if args.json:
        print(json.dumps({"text": text, "tokens": out.sequences[0].tolist(), "stats": out.stats.to_dict()}, indent=2))
    else:
        print(text)
        print(out.stats.summary(), file=sys.stderr)
    return 0


def read_prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts:
        path = Path(args.prompts)
        if not path.is_file():
            raise MMSpecError(f"prompts file not found: {path}")
        prompts = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if not prompts:
            raise MMSpecError(f"prompts file {path} has no non-empty line")
        return prompts[: args.num_prompts]
    from .world import heldout_prompts

    return heldout_prompts(args.num_prompts, seed=args.seed)


def set_threads(args: argparse.Namespace) -> None:
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)


def emit(report, args: argparse.Namespace) -> None:
    print(report.to_json() if args.json else report.to_table())


def cmd_bench_text(args: argparse.Namespace) -> int:
    from .bench.text import bench_text
    from .zoo import load_causal_lm

    set_threads(args)
    target, tokenizer = load_causal_lm(args.model, "target")
    drafter, _ = load_causal_lm(args.drafter, "drafter")
    if tokenizer is None:
        raise MMSpecError(f"{args.model!r} has no tokenizer; bench text needs one to encode prompts")
    prompts = [tokenizer(p, return_tensors="pt").input_ids for p in read_prompts(args)]
    report = bench_text(
        target, drafter, prompts, max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens,
        repeats=args.repeats, title=f"bench text: {args.model} + {args.drafter}", progress=not args.json,
    )
    emit(report, args)
    return 0


def cmd_bench_overhead(args: argparse.Namespace) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from .bench.text import bench_text, inert_layer_pair

    set_threads(args)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=args.hidden, intermediate_size=3 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=512, eos_token_id=None)
    target, drafter = inert_layer_pair(LlamaForCausalLM(config), drafter_layers=1)
    prompts = [torch.randint(1, 1000, (1, 24), generator=torch.Generator().manual_seed(i)) for i in range(args.num_prompts)]
    report = bench_text(
        target, drafter, prompts, max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens,
        policies=("fixed",), include_lookup=False, repeats=args.repeats, progress=not args.json,
        title=f"bench overhead: {args.layers}-layer target (all but 1 inert) + its 1-layer prefix as drafter",
    )
    emit(report, args)
    return 0


def cmd_bench_vision(args: argparse.Namespace) -> int:
    from .vision.bench import CaptionInput, bench_vision
    from .vision.feature_methods import load_checked, parse_drafter_spec
    from .vision.pipeline import CaptionPipeline
    from .world import examples, render_video

    set_threads(args)
    pipe = CaptionPipeline.from_pretrained(args.model, drafter=args.drafter)
    feature = dict(pipe.feature_drafters)  # the model's own msd / flash drafters, when it has them
    for spec in args.extra_drafter:
        label, kind, path = parse_drafter_spec(spec)
        if label in feature:
            raise MMSpecError(f"--extra-drafter label {label!r} is used twice (msd / flash name the model's own drafters)")
        feature[label] = load_checked(kind, path, pipe.model)
    frames, size = pipe.card.get("frames", 8), pipe.card.get("frame_size", 96)
    items = []
    # held-out videos like the ones the captioner was trained on (its card says how many shapes a scene has)
    max_shapes = pipe.card.get("max_shapes", 3)
    for scene, _caption in examples(args.num_videos, seed=args.seed, split="heldout", max_shapes=max_shapes):
        inputs = pipe.prepare_inputs(video=render_video(scene, num_frames=frames, size=size))
        items.append(CaptionInput(input_ids=inputs.pop("input_ids"), model_inputs=inputs))
    std = tuple(tuple(int(x) for x in setting.split(",")) for setting in args.std)
    report, extras = bench_vision(pipe.model, items, drafter=pipe.drafter_model, feature_drafters=feature,
                                  max_new_tokens=args.max_new_tokens,
                                  num_draft_tokens=args.num_draft_tokens, std_settings=std, repeats=args.repeats,
                                  progress=not args.json, title=f"bench vision: {args.model} on {len(items)} held-out videos")
    if args.json:
        print(json.dumps({**report.to_dict(), "extras": extras}, indent=2))
        return 0
    print(report.to_table())
    print(f"visual tokens {extras['visual_tokens']} of {extras['prompt_tokens']} prompt tokens; one decode step: "
          f"{extras['step_ms_full_cache']:.2f} ms over the full cache, {extras['step_ms_text_cache']:.2f} ms over text KV only "
          f"(visual attention share {extras['visual_attention_share']:.0%}, measured)")
    if extras.get("decode_phase"):
        print("decode phase alone (median wall time minus prefill, all videos; prefill = vision tower + prompt, the same "
              "work for every method):")
        for name, row in extras["decode_phase"].items():
            print(f"  {name:<26} prefill {row['prefill_s']:.3f} s  decode {row['decode_s']:.3f} s  "
                  f"decode speed-up {row['decode_speed_up']:.2f}x vs greedy-loop")
    print("modelled memory-bound speed-up (bytes of weights + KV read per committed token, plain / method; a GPU-like "
          "regime, NOT measured here):")
    for name, value in extras["modelled_memory_bound_speed_up"].items():
        print(f"  {name:<26} {value:.2f}x")
    for note in extras.get("notes", []):
        print(f"note: {note}")
    return 0


def announce_zoo_default(name: str, what: str, trained_on: str) -> None:
    """With no --model: use the zoo's toy model and say so, or fail clearly if this install lacks it."""
    from .zoo import entries

    if name not in {e.name for e in entries()}:
        raise MMSpecError(f"the toy {what} {name!r} is not in this install's zoo; pass --model ID|PATH")
    print(f"mmspec: using the embedded toy {what} {name!r} (trained on {trained_on}; pass --model for a real checkpoint)",
          file=sys.stderr)


def stats_json(stats) -> dict:
    """The stats fields every `--json` output shares."""
    return {"new_tokens": stats.new_tokens, "target_forwards": stats.target_forwards, "mean_accepted_length": stats.tau,
            "acceptance_rate": stats.alpha, "wall_time_s": stats.total_time, "tokens_per_s": stats.tokens_per_second,
            "drafter_forwards": stats.drafter_forwards}


IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def cmd_caption(args: argparse.Namespace) -> int:
    import torch

    from .vision.pipeline import DEFAULT_CAPTIONER, CaptionPipeline

    if args.model is None:
        announce_zoo_default(DEFAULT_CAPTIONER, "captioner", "synthetic videos of one moving shape")
    # --drafter names the drafter of the chosen method: a feature drafter folder for msd / flash, else the text LM.
    feature = {args.method: args.drafter} if args.method in ("msd", "flash") and args.drafter else None
    pipe = CaptionPipeline.from_pretrained(args.model or DEFAULT_CAPTIONER, drafter=None if feature else args.drafter,
                                           feature_drafters=feature, num_draft_tokens=args.num_draft_tokens)
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r} (fastest lossless method available for this model)", file=sys.stderr)
    media = {"image": args.path} if Path(args.path).suffix.lower() in IMAGE_SUFFIXES else {"video": args.path}
    generator = torch.Generator().manual_seed(args.seed)
    out = pipe(**media, prompt=args.prompt, max_new_tokens=args.max_new_tokens, method=args.method, num_frames=args.frames,
               fps=args.fps, do_sample=args.temperature is not None, temperature=args.temperature or 1.0,
               generator=generator, progress_bar=not args.json)
    s = out.stats
    if args.json:
        print(json.dumps({
            "text": out.text, "method": out.method, "model": out.model,
            "stats": {**stats_json(s), "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
                      "prefill_time_s": s.prefill_time, "draft_time_s": s.draft_time, "verify_time_s": s.verify_time},
        }, indent=2))
    else:
        print(out.text)
        print(s.summary(), file=sys.stderr)
    return 0


def cmd_transcribe(args: argparse.Namespace) -> int:
    from .speech.pipeline import DEFAULT_ASR_MODEL, TranscriptionPipeline

    if args.model is None:
        announce_zoo_default(DEFAULT_ASR_MODEL, "ASR model", "synthetic speech")
    pipe = TranscriptionPipeline.from_pretrained(args.model or DEFAULT_ASR_MODEL, fast_decoder=args.fast_decoder)
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r}", file=sys.stderr)
    out = pipe(args.path, method=args.method, mode=args.mode, language=args.language, max_new_tokens=args.max_new_tokens,
               progress_bar=not args.json)
    s = out.stats
    if out.note:
        print(f"mmspec: {out.note}", file=sys.stderr)
    if args.json:
        print(json.dumps({
            "text": out.text, "method": out.method, "mode": out.mode, "model": out.model, "note": out.note,
            "stats": {**stats_json(s), "decoder_passes": out.decoder_passes, "chunks": len(out.chunks),
                      "transcription_time_s": out.total_time_s},
        }, indent=2))
    else:
        print(out.text)
        print(f"{s.summary()}; {out.decoder_passes} decoder passes over {len(out.chunks)} chunk(s)", file=sys.stderr)
    return 0


IMAGE_METHOD_OPTIONS = ("lantern_delta", "lantern_k", "lantern_lam", "gsd_window", "gsd_prob_threshold",
                        "gsd_distance_threshold", "gsd_latents")


def optional_float(value: str) -> float | None:
    """A float, or None for "none" / "off" (a GSD filter turned off)."""
    if value.lower() in ("none", "off"):
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or none, got {value!r}") from None


def parse_gsd_setting(setting: str, given: list[str]) -> tuple:
    """GROUP,PROB,DIST[,LATENTS] -> (int, float | None, float | None[, str]) for an extra `bench image` GSD row."""
    usage = (f"--gsd settings are GROUP,PROB,DIST[,LATENTS] such as 7,0.15,0.5 or 7,0.3,1.0,codebook "
             f"(none = filter off; LATENTS: embeddings or codebook); got {given}")
    parts = setting.split(",")
    if len(parts) not in (3, 4) or parts[0] == "none":
        raise MMSpecError(usage)
    try:
        values = (int(parts[0]), *(None if v == "none" else float(v) for v in parts[1:3]))
    except ValueError:
        raise MMSpecError(usage) from None
    if len(parts) == 4:
        if parts[3] not in ("embeddings", "codebook"):
            raise MMSpecError(usage)
        values += (parts[3],)
    return values


def cmd_generate_image(args: argparse.Namespace) -> int:
    import torch

    from .image_ar.pipeline import DEFAULT_IMAGE_MODEL, SpeculativeImagePipeline

    if args.out and (Path(args.out).suffix.lower() not in IMAGE_SUFFIXES or not Path(args.out).parent.is_dir()):
        raise MMSpecError(f"cannot write {args.out}: use an existing folder and an image suffix ({', '.join(sorted(IMAGE_SUFFIXES))})")
    if args.model is None:
        announce_zoo_default(DEFAULT_IMAGE_MODEL, "image model", "class-conditional shapes images")
    pipe = SpeculativeImagePipeline.from_pretrained(args.model or DEFAULT_IMAGE_MODEL, drafter=args.drafter)
    if pipe.conditioning == "text":  # text-to-image (Janus): the prompt is free text
        condition, described = {"prompt": args.prompt}, {"prompt": args.prompt}
        stem = "_".join("".join(c if c.isalnum() else " " for c in args.prompt).split())[:48] or "image"
    else:
        by_id = args.prompt.strip().isdigit()
        label = int(args.prompt) if by_id else pipe.class_id(args.prompt)
        name = pipe.class_names[label] if pipe.class_names and label < len(pipe.class_names) else None
        condition, described = {"class_labels": label}, {"class": name, "class_id": label}
        stem = (name or f"class-{label}").replace(" ", "_")
    out_path = Path(args.out or f"{stem}.png")
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r}", file=sys.stderr)
    # Only the method options given on the command line; the rest come from the model card (else the authors').
    options = {name: getattr(args, name) for name in IMAGE_METHOD_OPTIONS if hasattr(args, name)}
    out = pipe(**condition, method=args.method, guidance_scale=args.guidance_scale, temperature=args.temperature,
               top_k=args.top_k, generator=torch.Generator().manual_seed(args.seed), progress_bar=not args.json,
               **options)
    out.images[0].save(out_path)
    s = out.stats
    if args.json:
        print(json.dumps({"method": out.method, "model": out.model, **described, "out": str(out_path),
                          "settings": out.settings, "stats": {**stats_json(s), "step_compression": s.step_compression}},
                         indent=2))
    else:
        print(out_path)
        print(f"{s.summary()}; step compression {s.step_compression:.2f}", file=sys.stderr)
    return 0


def cmd_bench_image(args: argparse.Namespace) -> int:
    from .image_ar.bench import bench_image, default_methods
    from .image_ar.pipeline import DEFAULT_IMAGE_MODEL, SpeculativeImagePipeline
    from .image_ar.rules import LANTERN_DELTA, LANTERN_K
    from .sampling import SamplingConfig

    set_threads(args)
    if args.n < 1:
        raise MMSpecError(f"--n must be >= 1, got {args.n}")
    if args.grid_out and Path(args.grid_out).suffix.lower() not in IMAGE_SUFFIXES:
        raise MMSpecError(f"--grid-out needs an image suffix ({', '.join(sorted(IMAGE_SUFFIXES))}), got {args.grid_out}")
    lantern = None
    if args.lantern is not None:
        try:
            lantern = [(float(d), int(k)) for d, k in (setting.split(",") for setting in args.lantern)]
        except ValueError:
            raise MMSpecError(f"--lantern settings are DELTA,K pairs such as 0.1,16; got {args.lantern}") from None
    gsd = [parse_gsd_setting(setting, args.gsd) for setting in args.gsd]
    if args.model is None:
        announce_zoo_default(DEFAULT_IMAGE_MODEL, "image model", "class-conditional shapes images")
    name = args.model or DEFAULT_IMAGE_MODEL
    pipe = SpeculativeImagePipeline.from_pretrained(name, drafter=args.drafter)
    if lantern is None:  # the model's LANTERN default (its card's, else the authors')
        card = pipe.lantern_settings() if hasattr(pipe, "lantern_settings") else {}
        lantern = [(card.get("lantern_delta", LANTERN_DELTA), card.get("lantern_k", LANTERN_K))]
    gsd_defaults = pipe.gsd_settings() if hasattr(pipe, "gsd_settings") else None
    methods = default_methods(pipe.drafter is not None, window=args.window, num_draft_tokens=args.num_draft_tokens,
                              lantern_settings=lantern, gsd_defaults=gsd_defaults, gsd_settings=gsd)
    if args.methods:
        methods = {row: config for row, config in methods.items() if config.method in {"ar", *args.methods}}
    labels = pipe.bench_conditions(args.n, args.prompts)  # class ids, or prompt indices for a text-to-image model
    sampling = SamplingConfig(do_sample=args.temperature > 0, temperature=args.temperature or 1.0)
    report = bench_image(pipe, labels, seed=args.seed, methods=methods, sampling=sampling, guidance_scale=args.guidance_scale,
                         repeats=args.repeats, progress=not args.json, title=f"bench image: {name}, {args.n} images")
    if args.grid_out:
        report.grid.save(args.grid_out)
        report.settings["grid"] = args.grid_out
    emit(report, args)
    return 0


def cmd_train_fast_decoder(args: argparse.Namespace) -> int:
    from .speech.train_fast import train_from_folder

    set_threads(args)
    report = train_from_folder(args.target, args.data, args.out, kind=args.kind, labels=args.labels, steps=args.steps,
                               batch_size=args.batch_size, learning_rate=args.lr, seed=args.seed, init_from=args.init_from)
    print(f"saved the {report.kind} fast decoder to {report.out} ({report.clips} clips, {report.labels} labels, "
          f"{report.steps} steps, loss {report.first_loss:.3f} -> {report.final_loss:.3f}, {report.seconds:.0f} s)")
    return 0


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from .vision.drafter_training import train_drafter

    set_threads(args)
    train_drafter(args.target, args.kind, args.data, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                  warmup=args.warmup, noise_std=args.noise_std, curriculum=args.curriculum, text_fraction=args.text_fraction,
                  checkpoint_every=args.checkpoint_every, resume=args.resume, seed=args.seed)
    report = json.loads((Path(args.out) / "training.json").read_text())
    final = report["final"]
    loss = f"loss {report['first_loss']:.3f} -> {final['loss']:.3f}, " if final["loss"] is not None else ""
    accuracy = f"token accuracy {final['token_accuracy']:.3f}, " if final["token_accuracy"] is not None else ""
    print(f"saved the {args.kind} drafter to {args.out} ({report['data']['num_traces']} traces, {report['steps']} steps, "
          f"{loss}{accuracy}{report['wall_time_s']:.0f} s)")
    return 0


def cmd_bench_speech(args: argparse.Namespace) -> int:
    from .speech.bench import run_speech_bench

    set_threads(args)
    report = run_speech_bench(args.model, data=args.data, n=args.n, repeats=args.repeats, fast_decoder=args.fast_decoder,
                              ar_fast_decoder=args.ar_fast_decoder, progress=not args.json)
    print(report.to_json() if args.json else report.to_table())
    return 0


def cmd_zoo_list(args: argparse.Namespace) -> int:
    from .zoo import entries

    found = [e.to_dict() for e in entries()]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print("the zoo is empty")
    for e in found:
        quality = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in e.get("quality", {}).items())
        print(f"{e['name']}: {e.get('architecture', '?')} ({e.get('role', '?')}), {e.get('params', 0) / 1e6:.1f}M params, "
              f"{e['file_size_bytes'] / 1e6:.1f} MB")
        print(f"    trained on: {e.get('trained_on', '?')} in {e.get('train_wall_time_s', 0) / 60:.1f} min")
        print(f"    quality: {quality}")
        print(f"    rebuild: {e.get('rebuild_command', '?')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmspec", description="Speculative decoding for multimodal and non-text models.")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="speculative text generation with a target and a drafter; prints stats")
    add_generation_args(gen)
    gen.add_argument("prompt", help="text to continue")
    gen.add_argument("--policy", default="fixed", choices=["fixed", "heuristic", "adaptive"])
    gen.add_argument("--sample", action="store_true", help="sample instead of greedy decoding (lossless)")
    gen.add_argument("--temperature", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--json", action="store_true")
    gen.set_defaults(func=cmd_generate)

    bench = commands.add_parser("bench", help="side-by-side benchmarks").add_subparsers(dest="modality", required=True)
    text = bench.add_parser("text", help="plain greedy vs mmspec (each policy) vs transformers assisted generation")
    add_generation_args(text)
    text.add_argument("--prompts", help="file with one prompt per line (default: held-out shapes-world caption prefixes)")
    text.add_argument("--num-prompts", type=int, default=50)
    text.add_argument("--repeats", type=int, default=3)
    text.add_argument("--seed", type=int, default=0)
    text.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    text.add_argument("--json", action="store_true")
    text.set_defaults(func=cmd_bench_text)

    vision = bench.add_parser("vision", help="caption methods side by side on held-out shapes videos")
    vision.add_argument("--model", default="shapes-video-captioner")
    vision.add_argument("--drafter", default=None, help="text-only drafter (default: the model's zoo pair)")
    vision.add_argument("--num-videos", type=int, default=10)
    vision.add_argument("--max-new-tokens", type=int, default=48)
    vision.add_argument("--num-draft-tokens", "-k", type=int, default=5)
    vision.add_argument("--std", nargs="+", default=["32,5", "32,9", "72,5"], metavar="K,GAMMA",
                        help="Sparse-to-Dense settings: visual KV entries kept, draft length")
    vision.add_argument("--extra-drafter", action="append", default=[], metavar="LABEL=KIND:PATH",
                        help="one more row: a trained feature drafter (KIND msd or flash) saved in PATH, e.g. an ablation; "
                             "repeatable (the model folder's msd/ and flash/ drafters get rows by default)")
    vision.add_argument("--repeats", type=int, default=3)
    vision.add_argument("--seed", type=int, default=0)
    vision.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    vision.add_argument("--json", action="store_true")
    vision.set_defaults(func=cmd_bench_vision)

    speech = bench.add_parser("speech", help="greedy vs hybrid decoding (CTC / AR fast decoder) vs transformers assisted "
                              "generation on held-out clips")
    speech.add_argument("--model", default="shapes-whisper-asr", help="zoo name, local folder or Hub id of a Whisper model")
    speech.add_argument("--data", default=None, help="folder with metadata.jsonl + clips (default: the zoo model's heldout/)")
    speech.add_argument("--n", type=int, default=20, help="clips to use (the first N listed)")
    speech.add_argument("--fast-decoder", default=None, help="CTC fast decoder folder (default: the model folder's fast_decoder/)")
    speech.add_argument("--ar-fast-decoder", default=None,
                        help="AR fast decoder folder (default: the model folder's ar_fast_decoder/)")
    speech.add_argument("--repeats", type=int, default=3)
    speech.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    speech.add_argument("--json", action="store_true")
    speech.set_defaults(func=cmd_bench_speech)

    overhead = bench.add_parser("overhead", help="loop overhead vs transformers on a pair that always agrees")
    overhead.add_argument("--layers", type=int, default=8)
    overhead.add_argument("--hidden", type=int, default=512)
    overhead.add_argument("--max-new-tokens", type=int, default=64)
    overhead.add_argument("--num-draft-tokens", "-k", type=int, default=5)
    overhead.add_argument("--num-prompts", type=int, default=8)
    overhead.add_argument("--repeats", type=int, default=3)
    overhead.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    overhead.add_argument("--json", action="store_true")
    overhead.set_defaults(func=cmd_bench_overhead)

    caption = commands.add_parser("caption", help="caption a video or an image, speculatively (lossless)")
    caption.add_argument("path", help="video (any file PyAV decodes) or image file")
    caption.add_argument("--model", default=None, help="zoo name, local folder or Hub id (default: the toy captioner)")
    caption.add_argument("--drafter", default=None,
                         help="drafter of the chosen method: a text LM for text (default: the model's zoo pair), a trained "
                              "drafter folder for msd / flash (default: the model folder's msd/ or flash/)")
    caption.add_argument("--method", choices=["ar", "text", "std", "msd", "flash"], default=None,
                         help="ar = plain decoding, text = text-only drafter, std = Sparse-to-Dense, msd / flash = trained "
                              "feature drafters (default: fastest measured)")
    caption.add_argument("--num-draft-tokens", type=int, default=None,
                         help="tokens drafted per round (default: the model card's best for the method, else 5; StD 9)")
    caption.add_argument("--frames", type=int, default=8, help="frames sampled uniformly from the video")
    caption.add_argument("--fps", type=float, default=None, help="sample frames at this rate instead (capped by --frames)")
    caption.add_argument("--prompt", default=None)
    caption.add_argument("--max-new-tokens", type=int, default=64)
    caption.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    caption.add_argument("--seed", type=int, default=0)
    caption.add_argument("--json", action="store_true")
    caption.set_defaults(func=cmd_caption)

    transcribe = commands.add_parser("transcribe", help="transcribe speech with hybrid decoding (fast draft + Whisper verification)")
    transcribe.add_argument("path", help="audio file (any file PyAV decodes, or the audio track of a video)")
    transcribe.add_argument("--model", default=None, help="zoo name, local folder or Hub id of a Whisper model (default: the toy ASR model)")
    transcribe.add_argument("--fast-decoder", default=None,
                            help="ctc, ar, or a fast decoder folder (default: the model folder's fast_decoder/, else ar_fast_decoder/)")
    transcribe.add_argument("--method", choices=["ar", "hybrid"], default=None,
                            help="ar = plain greedy decoding, hybrid = fast draft + verification (default: hybrid if a fast decoder exists)")
    transcribe.add_argument("--mode", choices=["strict", "relaxed"], default="strict",
                            help="strict = identical to greedy decoding; relaxed = accept highly ranked drafts (hybrid only)")
    transcribe.add_argument("--language", default=None, help="language code or name (default: detected)")
    transcribe.add_argument("--max-new-tokens", type=int, default=None, help="per chunk (default: the decoder's limit)")
    transcribe.add_argument("--json", action="store_true")
    transcribe.set_defaults(func=cmd_transcribe)

    image_gen = commands.add_parser("generate-image", help="generate an image of a class (or from text, with Janus) with an AR "
                                    "image model, speculatively")
    image_gen.add_argument("prompt", help="class name from the model's classes.json (e.g. \"red circle\") or a class id; "
                           "free text for a text-to-image model (Janus)")
    image_gen.add_argument("--model", default=None, help="zoo name, local folder or Hub id: LlamaGen-style or Janus "
                           "(default: the toy shapes-image-ar)")
    image_gen.add_argument("--method", choices=["ar", "sd", "sjd", "gsd", "lantern"], default=None,
                           help="ar = plain sampling, sd = drafter (lossless), sjd = Jacobi (lossless), gsd / lantern = relaxed")
    image_gen.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the model folder's drafter/; for Janus: a smaller "
                           "Janus sharing its codebook and tokenizer, enabling sd)")
    image_gen.add_argument("--seed", type=int, default=0)
    image_gen.add_argument("--guidance-scale", type=float, default=None, help="classifier-free guidance (default: the model card's)")
    image_gen.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    image_gen.add_argument("--top-k", type=int, default=None)
    image_gen.add_argument("--out", default=None, help="image file to write (default: <class>.png)")
    # Method options: when not given, the model card's values (gsd_defaults / lantern_defaults), else the authors'.
    suppress = argparse.SUPPRESS
    image_gen.add_argument("--lantern-delta", dest="lantern_delta", type=float, default=suppress, metavar="DELTA",
                           help="LANTERN: budget in [0, 1] on the total variation between p and each candidate's boosted p "
                           "(not a bound on the output law; default: the model card's)")
    image_gen.add_argument("--lantern-k", dest="lantern_k", type=int, default=suppress, metavar="K",
                           help="LANTERN: nearest codebook neighbours, 1 <= K < codebook size (default: the model card's, "
                           "else the authors' 1000 for a 16384-code codebook)")
    image_gen.add_argument("--lantern-lam", dest="lantern_lam", type=float, default=suppress, metavar="LAMBDA",
                           help="LANTERN++: bound p~(x) <= LAMBDA p(x) instead of the delta budget")
    image_gen.add_argument("--gsd-window", dest="gsd_window", type=int, default=suppress, metavar="W",
                           help="GSD: rank window (W less probable tokens, W - 1 more probable; default: the model card's)")
    image_gen.add_argument("--gsd-prob-threshold", dest="gsd_prob_threshold", type=optional_float, default=suppress,
                           metavar="P", help="GSD: probability gap (none = off)")
    image_gen.add_argument("--gsd-distance-threshold", dest="gsd_distance_threshold", type=optional_float,
                           default=suppress, metavar="D", help="GSD: squared latent distance (none = off)")
    image_gen.add_argument("--gsd-latents", dest="gsd_latents", choices=["embeddings", "codebook"], default=suppress,
                           help="GSD: distances between the AR model's input token embeddings (the authors') or VQ codes")
    image_gen.add_argument("--json", action="store_true")
    image_gen.set_defaults(func=cmd_generate_image)

    image = bench.add_parser("image", help="image-AR methods side by side: AR, drafter SD, SJD, GSD, LANTERN")
    image.add_argument("--model", default=None, help="zoo name, local folder or Hub id: LlamaGen-style or Janus "
                       "(default: the toy shapes-image-ar)")
    image.add_argument("--n", type=int, default=16, help="images per method (conditions cycle through the classes or --prompts)")
    image.add_argument("--prompts", nargs="+", default=None, metavar="PROMPT",
                       help="text prompts (required for Janus); class names for a class-conditional model (default: all classes)")
    image.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the model folder's drafter/; for Janus: a smaller "
                           "Janus sharing its codebook and tokenizer, enabling sd)")
    image.add_argument("--seed", type=int, default=0, help="image i of every method is seeded with seed + i")
    image.add_argument("--guidance-scale", type=float, default=None)
    image.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    image.add_argument("--window", type=int, default=16, help="Jacobi window of SJD / GSD / LANTERN-jacobi")
    image.add_argument("--num-draft-tokens", "-k", type=int, default=4, help="drafter tokens per round")
    image.add_argument("--lantern", nargs="+", default=None, metavar="DELTA,K",
                       help="LANTERN rows: budget delta (on the TV between p and each candidate's boosted p), codebook "
                       "neighbours k (default: the model card's setting); rows report the measured TV of the output law")
    image.add_argument("--gsd", nargs="+", default=[], metavar="GROUP,PROB,DIST[,LATENTS]",
                       help="extra GSD rows: rank window, probability and latent-distance thresholds (none = off), and "
                       "optionally the latents (embeddings = the AR model's input embeddings, the default; codebook)")
    image.add_argument("--methods", nargs="+", default=None, choices=["sd", "sjd", "gsd", "lantern"],
                       help="run only these method families' rows (ar, the reference, always runs)")
    image.add_argument("--repeats", type=int, default=1)
    image.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    image.add_argument("--grid-out", default=None, help="write a grid of samples per method to this image file")
    image.add_argument("--json", action="store_true")
    image.set_defaults(func=cmd_bench_image)

    train_fast = commands.add_parser("train-fast-decoder", help="train a fast decoder (CTC or one-layer AR) on a Whisper "
                                     "model's frozen encoder, for hybrid decoding")
    train_fast.add_argument("--target", required=True, help="zoo name, local folder or Hub id of the Whisper model")
    train_fast.add_argument("--data", required=True, help='folder with metadata.jsonl ({"file": ..., "text": ...} per line) + clips')
    train_fast.add_argument("--out", required=True, help="folder to save_pretrained into (e.g. MODEL/fast_decoder, MODEL/ar_fast_decoder)")
    train_fast.add_argument("--kind", choices=["ctc", "ar"], default="ctc",
                            help="ctc = non-autoregressive CTC head; ar = one-layer WhisperForCausalLM (also an HF assistant)")
    train_fast.add_argument("--labels", choices=["target", "truth"], default="target",
                            help="target = the model's own greedy transcripts (distillation); truth = the metadata text")
    train_fast.add_argument("--steps", type=int, default=1000)
    train_fast.add_argument("--batch-size", type=int, default=16)
    train_fast.add_argument("--lr", type=float, default=None, help="learning rate (default: 1e-3 for ctc, 5e-4 for ar)")
    train_fast.add_argument("--seed", type=int, default=0)
    train_fast.add_argument("--init-from", default=None, help="a saved fast decoder of the same kind to continue training")
    train_fast.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    train_fast.set_defaults(func=cmd_train_fast_decoder)

    train_drafter = commands.add_parser("train-drafter", help="train a feature drafter (MSD, FLASH) for a vision-language "
                                        "model on its self-distillation traces (vision.distill_data)")
    train_drafter.add_argument("--target", required=True, help="local folder or Hub id of the vision-language target")
    train_drafter.add_argument("--kind", default="msd", help="drafter kind: msd or flash")
    train_drafter.add_argument("--data", required=True, help="folder written by generate_distill_data (metadata.json + shards)")
    train_drafter.add_argument("--out", required=True, help="folder to save_pretrained into (checkpoints go to OUT/checkpoints)")
    train_drafter.add_argument("--steps", type=int, default=1000)
    train_drafter.add_argument("--batch-size", type=int, default=4)
    train_drafter.add_argument("--lr", type=float, default=1e-4)
    train_drafter.add_argument("--warmup", type=int, default=None, help="warmup steps (default: 5%% of --steps)")
    train_drafter.add_argument("--noise-std", type=float, default=0.2, help="uniform noise on input features (EAGLE: 0.2)")
    train_drafter.add_argument("--curriculum", choices=["two-stage", "none"], default="two-stage",
                               help="two-stage = MSD's text-only stage, then a rising share of multimodal traces")
    train_drafter.add_argument("--text-fraction", type=float, default=0.5, help="share of steps in the text-only stage")
    train_drafter.add_argument("--checkpoint-every", type=int, default=500)
    train_drafter.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in OUT/checkpoints")
    train_drafter.add_argument("--seed", type=int, default=0)
    train_drafter.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    train_drafter.set_defaults(func=cmd_train_drafter)

    zoo = commands.add_parser("zoo", help="the embedded toy model zoo").add_subparsers(dest="zoo_command", required=True)
    zoo_list = zoo.add_parser("list", help="list zoo models with size, training data, quality and rebuild command")
    zoo_list.add_argument("--json", action="store_true")
    zoo_list.set_defaults(func=cmd_zoo_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except MMSpecError as error:
        print(f"mmspec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
