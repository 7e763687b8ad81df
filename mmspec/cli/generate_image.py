"""`mmspec generate-image`: an image of a class (or from text, with Janus) from an AR image model, speculatively."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import MMSpecError
from . import checks, choices, common, image_families
from .atomic import atomic_write
from .collector import collector_paused
from .image_classes import check_class_prompt
from .mar_steps import check_num_iter
from .model_checks import check_model


def register(commands: argparse._SubParsersAction, flags: common.SharedFlags) -> None:
    parser = commands.add_parser("generate-image", parents=[flags.seed, flags.threads, flags.device, flags.json],
                                 help="generate an image of a class (or from text, with Janus) with an AR image model, "
                                      "speculatively")
    parser.add_argument("prompt", help="class name from the model's classes.json (e.g. \"red circle\") or a class id; "
                        "free text for a text-to-image model (Janus)")
    parser.add_argument("--model", default=None, help="zoo name, local folder or Hub id: LlamaGen-style, Janus or a saved "
                        "VAR pipeline such as shapes-var, or a saved MAR pipeline such as shapes-mar (default: the toy shapes-image-ar)")
    parser.add_argument("--method", choices=choices.IMAGE_METHODS, default=None,
                        metavar="METHOD", help="ar = plain sampling, sd = drafter (lossless), sjd = Jacobi (lossless), "
                        "gsd / lantern = relaxed; VAR models: ar = the large VAR alone, code = CoDe (large drafts the "
                        "first scales, the small refiner the rest); MAR models: ar = the target MAR alone, cspd = continuous "
                        "speculative decoding with its draft MAR")
    parser.add_argument("--draft-scales", dest="draft_scales", type=checks.positive_int, default=None, metavar="N",
                        help="VAR, method code: scales the large model runs, 1..scales-1 (default: the model card's)")
    parser.add_argument("--num-iter", dest="num_iter", type=checks.positive_int, default=None, metavar="N",
                        help="MAR: steps of the cosine schedule, at most the token count (default: the model card's, "
                        "else min(64, tokens))")
    parser.add_argument("--draft-steps", dest="draft_steps", type=checks.positive_int, default=None, metavar="N",
                        help="MAR, method cspd: draft steps per target verification (default: the model card's, else 8)")
    parser.add_argument("--drafter", default=None, help="drafter folder or Hub id (default: the model folder's drafter/; "
                        "for Janus: a smaller Janus sharing its codebook and tokenizer, enabling sd; for a VAR: its refiner, "
                        "also by the name of a folder inside the model's, e.g. refiner-6)")
    parser.add_argument("--guidance-scale", type=checks.finite_float, default=None,
                        help="classifier-free guidance (default: the model card's)")
    parser.add_argument("--temperature", type=checks.temperature, default=1.0,
                        help="0 = greedy; VAR models: also one value per scale, comma-separated (CoDe's sampler: "
                        "1.1 for all but the last three scales, then 1.0)")
    parser.add_argument("--top-k", type=checks.positive_int, default=None,
                        help="keep the K most likely tokens (VAR: default the model card's; the vocabulary size = off)")
    parser.add_argument("--top-p", type=checks.open_probability, default=None,
                        help="nucleus filter in (0, 1] (VAR: default the model card's; 1 = off); not for MAR")
    parser.add_argument("--out", default=None, help="image file to write (default: <class>.png)")
    # Method options: when not given, the model card's values (gsd_defaults / lantern_defaults), else the authors'.
    suppress = argparse.SUPPRESS
    parser.add_argument("--lantern-delta", dest="lantern_delta", type=checks.probability, default=suppress, metavar="DELTA",
                        help="LANTERN: budget in [0, 1] on the total variation between p and each candidate's boosted p "
                        "(not a bound on the output law; default: the model card's)")
    parser.add_argument("--lantern-k", dest="lantern_k", type=checks.positive_int, default=suppress, metavar="K",
                        help="LANTERN: nearest codebook neighbours, 1 <= K < codebook size (default: the model card's, "
                        "else the authors' 1000 for a 16384-code codebook)")
    parser.add_argument("--lantern-lam", dest="lantern_lam", type=checks.positive_float, default=suppress, metavar="LAMBDA",
                        help="LANTERN++: bound p~(x) <= LAMBDA p(x) instead of the delta budget")
    parser.add_argument("--gsd-window", dest="gsd_window", type=checks.positive_int, default=suppress, metavar="W",
                        help="GSD: rank window (W less probable tokens, W - 1 more probable; default: the model card's)")
    parser.add_argument("--gsd-prob-threshold", dest="gsd_prob_threshold", type=optional_float, default=suppress,
                        metavar="P", help="GSD: probability gap (none = off)")
    parser.add_argument("--gsd-distance-threshold", dest="gsd_distance_threshold", type=optional_float,
                        default=suppress, metavar="D", help="GSD: squared latent distance (none = off)")
    parser.add_argument("--gsd-latents", dest="gsd_latents", choices=["embeddings", "codebook"], default=suppress,
                        help="GSD: distances between the AR model's input token embeddings (the authors') or VQ codes")
    parser.set_defaults(func=run)


IMAGE_METHOD_OPTIONS = ("lantern_delta", "lantern_k", "lantern_lam", "gsd_window", "gsd_prob_threshold",
                        "gsd_distance_threshold", "gsd_latents")


def optional_float(value: str) -> float | None:
    """A float, or None for "none" / "off" (a GSD filter turned off)."""
    if value.lower() in ("none", "off"):
        return None
    try:
        return checks.non_negative_float(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or none, got {value!r}") from None


def check_output(path: str) -> None:
    try:
        checks.output_file(common.IMAGE_SUFFIXES, "image")(path)
    except argparse.ArgumentTypeError as error:
        raise MMSpecError(f"--out: {error}") from None


def run(args: argparse.Namespace) -> int:
    if args.out:  # before torch is imported and the model loads: a path that cannot be written fails now
        check_output(args.out)
    check_model(args.model, "image model", "image")
    checks.refuse_cuda_without_driver(args.device, "--device")
    early = image_families.image_family(args.model or image_families.DEFAULT_IMAGE_MODEL)
    if early is not None:  # flags of another family fail before torch is imported
        family_options(args, early, args.model or image_families.DEFAULT_IMAGE_MODEL)
    check_class_prompt(args.model or image_families.DEFAULT_IMAGE_MODEL, args.prompt)
    if early == "mar" and args.draft_steps is None:  # (--draft-steps with another method is refused first, later)
        check_num_iter(args.model or image_families.DEFAULT_IMAGE_MODEL, args.num_iter)
    with collector_paused():  # the libraries' and the model's objects live until exit
        import torch

        from ..image_ar.pipeline import DEFAULT_IMAGE_MODEL, SpeculativeImagePipeline, image_family

        common.set_threads(args)
        common.check_device(args)

        common.announce_toy(args.model, "image model")
        if args.model is None:
            common.announce_zoo_default(DEFAULT_IMAGE_MODEL, "image model", "class-conditional shapes images")
        model_name = args.model or DEFAULT_IMAGE_MODEL
        family = image_family(model_name)
        if family is not None:  # flags of another family fail before any weights load
            options = family_options(args, family, model_name)
        pipe = common.on_device(SpeculativeImagePipeline.from_pretrained(model_name, drafter=args.drafter), args)
    if pipe.conditioning == "text":  # text-to-image (Janus): the prompt is free text
        condition, described = {"prompt": args.prompt}, {"prompt": args.prompt}
        stem = "_".join("".join(c if c.isalnum() else " " for c in args.prompt).split())[:48] or "image"
    else:
        by_id = args.prompt.strip().isascii() and args.prompt.strip().isdigit()
        label = int(args.prompt) if by_id else pipe.class_id(args.prompt)
        count = pipe.num_classes if hasattr(pipe, "num_classes") else pipe.model.config.num_classes
        if not 0 <= label < count:
            raise MMSpecError(f"class id {args.prompt.strip()} is out of range: {pipe.model_name}'s class ids are in [0, {count})")
        name = pipe.class_names[label] if pipe.class_names and label < len(pipe.class_names) else None
        condition, described = {"class_labels": label}, {"class": name, "class_id": label}
        stem = (name or f"class-{label}").replace(" ", "_")
    out_path = Path(args.out or f"{stem}.png")
    if not args.out:  # the default name is known only now; still checked before generating
        check_output(str(out_path))
    if args.method is None:
        print(f"mmspec: method {pipe.default_method!r}", file=sys.stderr)
    if family is None:  # known only now that the model is loaded
        options = family_options(args, getattr(pipe, "family", None) or "llamagen", model_name)
    if getattr(pipe, "family", None) == "mar" and args.draft_steps is not None \
            and (args.method or pipe.default_method) != "cspd":
        raise MMSpecError(f"--draft-steps applies to method cspd, not {args.method or pipe.default_method!r}")
    out = pipe(**condition, method=args.method, guidance_scale=args.guidance_scale, temperature=args.temperature,
               top_k=args.top_k, generator=torch.Generator().manual_seed(args.seed), progress_bar=not args.json,
               **options)
    atomic_write(out_path, out.images[0].save)
    s = out.stats
    if args.json:
        print(json.dumps({"method": out.method, "model": out.model, **described, "out": str(out_path),
                          "settings": out.settings,
                          "stats": common.stats_json(s, step_compression=s.step_compression, **method_records(s))},
                         indent=2))
    else:
        print(out_path)
        if getattr(pipe, "family", None) == "var":  # no drafts are verified: tau and alpha mean nothing here
            refiner = f" ({out.settings['refiner']})" if out.settings.get("refiner") else ""
            print(f"{out.method}: {s.new_tokens} tokens over {out.settings['scales']} scales, {s.target_forwards} large / "
                  f"{s.drafter_forwards} refiner forwards{refiner}, {s.total_time * 1e3:.0f} ms", file=sys.stderr)
        elif getattr(pipe, "family", None) == "mar":  # forwards per model; cspd: window tokens kept
            kept = f", {s.accepted}/{s.drafted} drafted tokens accepted" if out.method == "cspd" else ""
            print(f"{out.method}: {s.new_tokens} tokens in {out.settings['num_iter']} steps, {s.target_forwards} target / "
                  f"{s.drafter_forwards} draft forwards{kept}, {s.total_time * 1e3:.0f} ms", file=sys.stderr)
        else:
            print(f"{s.summary()}; step compression {s.step_compression:.2f}", file=sys.stderr)
    return 0


def method_records(stats: Any) -> dict[str, Any]:
    """What a VAR or MAR method's stats add to `--json`: VAR's per-scale records (who made each scale), MAR's
    schedule and CSpD's per-window records; nothing for token-by-token methods."""
    records: dict[str, Any] = {}
    for name in ("draft_scales", "scales", "schedule", "prefill_steps", "windows", "residual_fallbacks"):
        value = getattr(stats, name, None)
        if value is not None:
            records[name] = [asdict(item) for item in value] if name in ("scales", "windows") else value
    return records


def family_options(args: argparse.Namespace, family: str, name: str) -> dict:
    """The method options given on the command line (the rest come from the model card, else the authors'),
    for a model of `family`; flags of another family are refused in one line."""
    checks.refuse_per_scale_temperature(args.temperature, family, name)
    options = {option: getattr(args, option) for option in IMAGE_METHOD_OPTIONS if hasattr(args, option)}
    if family == "var":
        if options:
            flags = ", ".join("--" + option.replace("_", "-") for option in options)
            raise MMSpecError(f"{flags}: options of LlamaGen-style methods; {name!r} is a VAR model "
                              f"(methods {', '.join(image_families.VAR_METHODS)})")
        options = {"draft_scales": args.draft_scales}
    elif family == "mar":
        flags = list(options) + [flag for flag in ("draft_scales", "top_p") if getattr(args, flag) is not None]
        if flags:
            flags = ", ".join("--" + option.replace("_", "-") for option in flags)
            raise MMSpecError(f"{flags}: not options of MAR; {name!r} is a MAR model "
                              f"(methods {', '.join(image_families.MAR_METHODS)}; --num-iter, --draft-steps)")
        options = {"num_iter": args.num_iter, "num_draft": args.draft_steps}
    elif args.draft_scales is not None:
        raise MMSpecError(f"--draft-scales applies to VAR models (method code); {name!r} is not one")
    if family != "mar" and (args.num_iter is not None or args.draft_steps is not None):
        given = ", ".join(f for f, v in (("--num-iter", args.num_iter), ("--draft-steps", args.draft_steps)) if v)
        raise MMSpecError(f"{given}: options of MAR models; {name!r} is not one")
    if family != "mar" and args.top_p is not None:
        options["top_p"] = args.top_p
    return options
