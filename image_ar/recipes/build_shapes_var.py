"""Build the zoo model ``shapes-var`` in one command: VQ-VAE, large VAR, small VAR, then the saved pipeline.

    python -m mmspec.image_ar.recipes.build_shapes_var --threads 1                  # ~37 min of training
    python -m mmspec.image_ar.recipes.build_shapes_var --redo large --threads 1     # redo one step (and the later ones)
    python -m mmspec.image_ar.recipes.build_shapes_var --smoke --out /tmp/x          # seconds, tiny settings

Steps (each a script of its own, see its docstring); a step whose output exists is skipped unless it
is named in ``--redo`` or an earlier step ran in this build:

    vq      train_shapes_var_vq            -> OUT/vq/
    large   train_shapes_var --role large  -> OUT/model/
    small   train_shapes_var --role small  -> OUT/refiner/

Then the three are saved together as a `VARPipeline` (``OUT/model_index.json``, fp16 weights).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
from pathlib import Path

import torch

from mmspec.image_ar.var import VAR
from mmspec.image_ar.var_pipeline import VARPipeline
from mmspec.image_ar.var_vq import VQVAE
from mmspec.training import add_output_arguments, parse_output_folder

from . import image_ar_data as data
from . import shapes_var, train_shapes_var, train_shapes_var_vq

# name, entry point, fixed arguments, output that marks it done, minutes
STEPS = [
    ("vq", train_shapes_var_vq.main, [], "vq/config.json", 10.0),
    ("large", train_shapes_var.main, ["--role", "large"], "model/config.json", 18.0),
    ("small", train_shapes_var.main, ["--role", "small"], "refiner/config.json", 9.0),
]
SMOKE = {
    "vq": ["--steps", "3", "--eval-n", "24"],
    "large": ["--steps", "3", "--train-n", "48", "--heldout-n", "24", "--sample-n", "24", "--eval-cfgs", "1.5",
              "--depth", "1", "--width", "32"],
    "small": ["--steps", "3", "--train-n", "48", "--heldout-n", "24", "--sample-n", "0", "--depth", "1", "--width", "32"],
}


def assemble(out: Path, card_extra: dict | None = None) -> Path:
    """Save vq/, model/, refiner/ and the fine-tuned refiner-N/ as one VARPipeline in `out` (fp16, model_index.json)."""
    half = torch.float16
    vq = VQVAE.from_pretrained(out / "vq", torch_dtype=half)
    model = VAR.from_pretrained(out / "model", torch_dtype=half)
    refiner = VAR.from_pretrained(out / "refiner", torch_dtype=half)
    tuned = {n: VAR.from_pretrained(out / f"refiner-{n}", torch_dtype=half) for n in shapes_var.fine_tuned_refiners(out)}
    # On this toy a shape's kind is settled at the fine scales: with the training-free refiner only 7/1 kept most of
    # the large VAR's judge accuracy, with the refiner fine-tuned for 6 scales 6/2 does (CoDe's usual S-2; BENCHMARKS.md).
    scales = len(shapes_var.PATCH_NUMS)
    draft_scales = scales - 2 if scales - 2 in tuned else scales - 1
    # Guidance 3, between VAR's 1.5 and CoDe's 4: on this toy both ar and CoDe 6/2 judge best there (BENCHMARKS.md).
    card = {"default_method": "code", "draft_scales": draft_scales, "cfg": 3.0, **shapes_var.SAMPLER,
            "judge": "shapes-image-ar", "class_synonyms": data.CLASS_SYNONYMS, **(card_extra or {})}
    pipe = VARPipeline(model, vq, refiner, class_names=data.label_names(), model_name=shapes_var.NAME, card=card,
                       fine_tuned_refiners=tuned)
    pipe.save_pretrained(out)
    shapes_var.update_card(out, "pipeline", {"pipeline_defaults": pipe.card, **shapes_var.summary(out)})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_arguments(parser, shapes_var.NAME, "the model folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--redo", nargs="*", default=[], choices=[s[0] for s in STEPS])
    parser.add_argument("--smoke", action="store_true", help="tiny settings: checks the plumbing in seconds")
    args = parser.parse_args(argv)
    out = parse_output_folder(parser, args, shapes_var.ZOO_DIR)
    common = ["--into-zoo"] if args.into_zoo else ["--out", str(out)]
    common += ["--threads", str(args.threads)]
    ran = False
    for name, entry, fixed, marker, minutes in STEPS:
        if (out / marker).is_file() and name not in args.redo and not ran:
            print(f"{name}: {out / marker} exists, skipped", flush=True)
            continue
        extra = SMOKE[name] if args.smoke else ["--max-minutes", str(minutes)]
        if args.smoke and name != "vq":  # the smoke codes are not worth a place in the shared cache
            extra = [*extra, "--cache-dir", str(out / "smoke-cache")]
        entry([*fixed, *common, *extra])
        ran = True
    assemble(out)
    print(f"saved the VARPipeline in {out}", flush=True)


if __name__ == "__main__":
    main()
