"""`mmspec bench image`: image-AR methods side by side: AR, drafter SD, SJD, GSD, LANTERN."""

from __future__ import annotations

import argparse

from ..errors import MMSpecError
from . import checks, image_families
from .atomic import atomic_write
from .common import (
    IMAGE_SUFFIXES,
    SharedFlags,
    add_size_flag,
    announce_toy,
    announce_zoo_default,
    check_device,
    emit,
    on_device,
    set_threads,
)
from .image_batches import check_batch_fits, check_batch_fits_early
from .model_checks import check_model


def register(benches: argparse._SubParsersAction, flags: SharedFlags) -> None:
    parser = benches.add_parser("image", parents=[flags.threads, flags.device, flags.json],
                                help="image-AR methods side by side: AR, drafter SD, SJD, GSD, LANTERN")
    parser.add_argument("--model", default=None, help="zoo name, local folder or Hub id: LlamaGen-style or Janus, "
                        "or a saved VAR or MAR pipeline such as shapes-var or shapes-mar (default: the toy shapes-image-ar)")
    add_size_flag(parser, 16, "images per method (conditions cycle through the classes or --prompts)", "--n")
    parser.add_argument("--prompts", nargs="+", default=None, metavar="PROMPT",
                        help="text prompts (required for Janus); class names for a class-conditional model (default: all classes)")
    parser.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the model folder's drafter/; "
                        "for Janus: a smaller Janus sharing its codebook and tokenizer, enabling sd; for a VAR: its refiner, "
                        "also by the name of a folder inside the model's, e.g. refiner-6)")
    parser.add_argument("--seed", type=checks.seed, default=0, help="image i of every method is seeded with seed + i")
    parser.add_argument("--guidance-scale", type=checks.finite_float, default=None)
    parser.add_argument("--temperature", type=checks.temperature, default=1.0,
                        help="0 = greedy; VAR models: also one value per scale, comma-separated (CoDe's sampler: "
                        "1.1 for all but the last three scales, then 1.0)")
    parser.add_argument("--window", type=checks.positive_int, default=None,
                        help="Jacobi window of SJD / GSD / LANTERN-jacobi (default 16)")
    parser.add_argument("--num-draft-tokens", "-k", type=checks.positive_int, default=None,
                        help="drafter tokens per round (default 4); MAR models: the cspd row's draft steps per "
                        "verification (default: the card's)")
    parser.add_argument("--lantern", nargs="+", default=None, metavar="DELTA,K",
                        help="LANTERN rows: budget delta (on the TV between p and each candidate's boosted p), codebook "
                        "neighbours k (default: the model card's setting); rows report the measured TV of the output law")
    parser.add_argument("--gsd", nargs="+", default=[], metavar="GROUP,PROB,DIST[,LATENTS]",
                        help="extra GSD rows: rank window, probability and latent-distance thresholds (none = off), and "
                        "optionally the latents (embeddings = the AR model's input embeddings, the default; codebook)")
    parser.add_argument("--methods", nargs="+", default=None, choices=["sd", "sjd", "gsd", "lantern"],
                        help="run only these method families' rows (ar, the reference, always runs)")
    parser.add_argument("--draft-scales", dest="draft_scales", nargs="+", type=checks.positive_int, default=None,
                        metavar="N", help="VAR models: the CoDe rows' scales of the large model (default: CoDe's "
                        "9/1, 8/2, 7/3, 6/4 of 10 scales, scaled to the model's: S-1 .. S-4)")
    parser.add_argument("--top-k", dest="top_k", type=checks.positive_int, default=None, metavar="K",
                        help="VAR models: keep the K most likely codes at every scale, in every row (default: the model "
                        "card's; the vocabulary size = off)")
    parser.add_argument("--top-p", dest="top_p", type=checks.open_probability, default=None, metavar="P",
                        help="VAR models: nucleus filter at every scale, in every row (default: the model card's; 1 = off)")
    parser.add_argument("--batch-size", dest="batch_size", type=checks.positive_int, default=None, metavar="B",
                        help="VAR and MAR models: images per pipeline call in every row (default 1; wall time then "
                        "measures throughput)")
    parser.add_argument("--inner-temperature", dest="inner_temperature", type=checks.positive_float, default=None,
                        help="MAR models: scale of the cspd acceptance ratio's exponent (default 1, the paper's ratio; "
                        "the official runner uses 42, which accepts more and no longer keeps the target's law)")
    parser.add_argument("--repeats", type=checks.positive_int, default=1)
    parser.add_argument("--grid-out", type=checks.output_file(IMAGE_SUFFIXES, "image"), default=None,
                        help="write a grid of samples per method to this image file")
    parser.set_defaults(func=run)


def parse_gsd_setting(setting: str, given: list[str]) -> tuple:
    """GROUP,PROB,DIST[,LATENTS] -> (int, float | None, float | None[, str]) for an extra GSD row."""
    usage = (f"--gsd settings are GROUP,PROB,DIST[,LATENTS] such as 7,0.15,0.5 or 7,0.3,1.0,codebook "
             f"(none = filter off; LATENTS: embeddings or codebook); got {given}")
    parts = setting.split(",")
    if len(parts) not in (3, 4) or parts[0] == "none":
        raise MMSpecError(usage)
    try:
        values = (checks.positive_int(parts[0]), *(None if v == "none" else checks.non_negative_float(v) for v in parts[1:3]))
    except (ValueError, argparse.ArgumentTypeError):
        raise MMSpecError(usage) from None
    if len(parts) == 4:
        if parts[3] not in ("embeddings", "codebook"):
            raise MMSpecError(usage)
        values += (parts[3],)
    return values


def run(args: argparse.Namespace) -> int:
    # Settings and the model folder are checked before torch is imported: a typo fails at once.
    lantern = None
    if args.lantern is not None:
        try:
            lantern = [(checks.probability(d), checks.positive_int(k)) for d, k in (s.split(",") for s in args.lantern)]
        except (ValueError, argparse.ArgumentTypeError):
            raise MMSpecError(f"--lantern settings are DELTA,K pairs such as 0.1,16; got {args.lantern}") from None
    gsd = [parse_gsd_setting(setting, args.gsd) for setting in args.gsd]
    check_model(args.model, "image model", "image")
    checks.refuse_cuda_without_driver(args.device, "--device")
    early = args.model or image_families.DEFAULT_IMAGE_MODEL  # before torch is imported: a batch that cannot fit
    check_batch_fits_early(early, image_families.image_family(early), args.batch_size, getattr(args, "device", None))

    from ..image_ar.bench import bench_image, default_methods
    from ..image_ar.pipeline import (
        DEFAULT_IMAGE_MODEL,
        SpeculativeImagePipeline,
        image_family,
    )
    from ..image_ar.rules import LANTERN_DELTA, LANTERN_K
    from ..sampling import SamplingConfig

    set_threads(args)
    check_device(args)
    announce_toy(args.model, "image model")
    if args.model is None:
        announce_zoo_default(DEFAULT_IMAGE_MODEL, "image model", "class-conditional shapes images")
    name = args.model or DEFAULT_IMAGE_MODEL
    family = image_family(name)
    if family is not None:  # flags of another family fail before any weights load
        refuse_family_flags(args, family, name)
    pipe = on_device(SpeculativeImagePipeline.from_pretrained(name, drafter=args.drafter), args)
    if family is None:  # known only now that the model is loaded
        refuse_family_flags(args, getattr(pipe, "family", None) or "llamagen", name)
    if args.batch_size is not None:  # before any image is made
        check_batch_fits(pipe, args.batch_size, device=getattr(args, "device", None))
    if getattr(pipe, "family", None) == "var":
        return run_var(pipe, name, args)
    if getattr(pipe, "family", None) == "mar":
        return run_mar(pipe, name, args)
    if lantern is None:  # the model's LANTERN default (its card's, else the authors')
        card = pipe.lantern_settings() if hasattr(pipe, "lantern_settings") else {}
        lantern = [(card.get("lantern_delta", LANTERN_DELTA), card.get("lantern_k", LANTERN_K))]
    gsd_defaults = pipe.gsd_settings() if hasattr(pipe, "gsd_settings") else None
    methods = default_methods(pipe.drafter is not None, window=args.window or 16,
                              num_draft_tokens=args.num_draft_tokens or 4,
                              lantern_settings=lantern, gsd_defaults=gsd_defaults, gsd_settings=gsd)
    if args.methods:
        methods = {row: config for row, config in methods.items() if config.method in {"ar", *args.methods}}
    labels = pipe.bench_conditions(args.num_samples, args.prompts)  # class ids, or prompt indices for a text-to-image model
    sampling = SamplingConfig(do_sample=args.temperature > 0, temperature=args.temperature or 1.0)
    report = bench_image(pipe, labels, seed=args.seed, methods=methods, sampling=sampling, guidance_scale=args.guidance_scale,
                         repeats=args.repeats, progress=not args.json, title=f"bench image: {name}, {args.num_samples} images")
    return finish(report, args)


def run_var(pipe, name: str, args: argparse.Namespace) -> int:
    """The VAR rows: the large model alone and CoDe at each --draft-scales (`image_ar.var_bench`)."""
    from ..image_ar.var_bench import bench_var

    labels = pipe.bench_conditions(args.num_samples, args.prompts)
    report = bench_var(pipe, labels, seed=args.seed, draft_scales=args.draft_scales, guidance_scale=args.guidance_scale,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, repeats=args.repeats,
                       judge=pipe.card.get("judge"), batch_size=args.batch_size or 1,
                       progress=not args.json, title=f"bench image: {name}, {args.num_samples} images")
    return finish(report, args)


def run_mar(pipe, name: str, args: argparse.Namespace) -> int:
    """The MAR rows: the target MAR alone and CSpD with its draft MAR (`image_ar.mar_bench`)."""
    from ..image_ar.mar_bench import bench_mar

    labels = pipe.bench_conditions(args.num_samples, args.prompts)
    num_drafts = [args.num_draft_tokens] if args.num_draft_tokens else None
    report = bench_mar(pipe, labels, seed=args.seed, num_drafts=num_drafts, guidance_scale=args.guidance_scale,
                       temperature=args.temperature, inner_temperature=args.inner_temperature or 1.0,
                       repeats=args.repeats, batch_size=args.batch_size or 1, judge=pipe.card.get("judge"),
                       progress=not args.json, title=f"bench image: {name}, {args.num_samples} images")
    return finish(report, args)


def refuse_family_flags(args: argparse.Namespace, family: str, name: str) -> None:
    """One error naming the given flags that a model of `family` has no use for."""
    checks.refuse_per_scale_temperature(args.temperature, family, name)
    if family == "var":
        refuse_flags(args, ("lantern", "gsd", "methods", "window", "num_draft_tokens", "inner_temperature"),
                     f"options of LlamaGen-style rows; {name!r} is a VAR model (rows: ar and code at --draft-scales)")
    elif family == "mar":
        refuse_flags(args, ("lantern", "gsd", "methods", "draft_scales", "window", "top_k", "top_p"),
                     f"not options of MAR rows; {name!r} is a MAR model "
                     "(rows: ar and cspd at -k draft steps, default the card's draft window)")
    else:
        for flag, models in (("draft_scales", "VAR models (CoDe rows)"), ("batch_size", "VAR and MAR models"),
                             ("top_k", "VAR models"), ("top_p", "VAR models"),
                             ("inner_temperature", "MAR models (cspd rows)")):
            if getattr(args, flag) is not None:
                raise MMSpecError(f"--{flag.replace('_', '-')} applies to {models}; {name!r} is not one")


def refuse_flags(args: argparse.Namespace, names: tuple[str, ...], why: str) -> None:
    """One error naming every given flag among `names` (argparse dests) that this model family has no use for."""
    given = ["--" + n.replace("_", "-") for n in names if getattr(args, n)]
    if given:
        raise MMSpecError(f"{', '.join(given)}: {why}")


def finish(report, args: argparse.Namespace) -> int:
    """Write the report's image grid where asked (atomically), then print the report."""
    if args.grid_out:
        atomic_write(args.grid_out, report.grid.save)
        report.settings["grid"] = args.grid_out
    emit(report, args)
    return 0
