"""A tiny random model folder in the layout `SpeculativeImagePipeline.from_pretrained` reads (like the zoo's shapes-image-ar)."""

import json
from pathlib import Path

from mmspec.image_ar import tiny_llamagen, tiny_vq

CLASSES = ["red circle", "blue square", "green triangle"]


def build_tiny_folder(folder: Path, drafter: bool = True, classes: bool = True, card: dict | None = None) -> Path:
    """Target (4 x 4 tokens, 12 codes, 3 classes) at the top, vq/, optional drafter/, classes.json, zoo_card.json."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, seed=0, initializer_range=0.3).save_pretrained(folder)
    tiny_vq(codebook_size=12).save_pretrained(folder / "vq")
    if drafter:
        drafter_model = tiny_llamagen(vocab_size=12, grid_size=4, num_classes=3, n_layer=1, seed=1, initializer_range=0.3)
        drafter_model.save_pretrained(folder / "drafter")
    if classes:
        (folder / "classes.json").write_text(json.dumps(CLASSES))
    if card is not None:
        (folder / "zoo_card.json").write_text(json.dumps(card))
    return folder
