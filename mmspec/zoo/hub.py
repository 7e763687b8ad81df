"""Hub ids, checked before any loading so a bad id fails in seconds: offline, behind a stalling network,
or a path that is not there.

transformers' own look-up retries and waits on every file it tries (config, weights, tokenizer,
processor): tens of seconds without a network, unbounded behind one that stalls. Here one bounded
question is asked instead, and only for an id missing from the local Hub cache.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ..errors import MMSpecError

HUB_ANSWER_TIMEOUT_S = 8.0  # one metadata request; DNS included (a thread, since DNS ignores socket timeouts)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickle_only(folder: Path, role: str) -> None:
    """A model folder whose weights would load from a pickle: say what loads, instead of torch's traceback.

    Checked in the folder and in each sub-folder with a config.json (a pipeline's components: vq/, drafter/,
    model/...): pickle checkpoints there and none of the safetensors names transformers or diffusers load
    (an unrelated .safetensors beside them does not count) are refused before torch.load is reached."""
    parts = [folder, *(p for p in sorted(folder.iterdir()) if p.is_dir() and (p / "config.json").is_file())]
    for part in parts:
        pickles = sorted(f.name for f in part.iterdir() if f.is_file() and f.suffix.lower() in PICKLE_SUFFIXES
                         and _is_pickle(f))
        if pickles and not any(_loadable_safetensors(f.name) for f in part.iterdir()):
            where = str(part) if part == folder else f"{folder}/{part.name}"
            raise MMSpecError(f"cannot load the {role} {str(folder)!r}: {where!r} holds only pickle checkpoints "
                              f"({', '.join(pickles)}) for its weights; mmspec loads safetensors checkpoints only "
                              "(unpickling can run code): convert it with save_pretrained(...) where you trust the file")


def _loadable_safetensors(name: str) -> bool:
    """model.safetensors, diffusion_pytorch_model(.fp16).safetensors, their shards and index files."""
    stem = name.removesuffix(".index.json")
    return stem.endswith(".safetensors") and stem.startswith(("model", "diffusion_pytorch_model"))


def _is_pickle(file: Path) -> bool:
    """torch.save's zip archive or a bare pickle (protocol 2+), by its first bytes; other .bin formats
    (a CTranslate2 model.bin) are not pickles."""
    with file.open("rb") as handle:
        head = handle.read(4)
    return head.startswith(b"PK\x03\x04") or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def in_local_cache(repo_id: str) -> bool:
    """Whether the local Hub cache holds a snapshot of this model repository."""
    from huggingface_hub import constants

    snapshots = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_hub_id(text: str, role: str, not_zoo: str, ask: bool = True) -> None:
    """Pass a Hub id that can load without a long wait; else raise one line that says why and what to do.

    `ask=False`: no network question (an id neither cached nor refused offline passes; asked later)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    start = f"cannot load the {role} {text!r}: {not_zoo}"
    path = Path(text).expanduser()
    if path.exists():
        raise MMSpecError(f"{start}, and {text!r} is a file, not a model folder")
    try:
        validate_repo_id(text)
    except HFValidationError:
        raise MMSpecError(f"{start}, and no folder {text!r} exists") from None
    if in_local_cache(text):
        return
    if offline():
        raise MMSpecError(f"{start}, not a folder, and not in the local Hub cache (HF_HUB_OFFLINE is set: download it "
                          "first, or pass a local folder)")
    reason = _ask_hub(text) if ask else None
    if reason is not None:
        raise MMSpecError(f"{start}, not a folder, not in the local Hub cache, and the Hub {reason} (offline? set "
                          "HF_HUB_OFFLINE=1 and pass a local folder)")


def _ask_hub(repo_id: str) -> str | None:
    """None if the Hub knows `repo_id`; else what went wrong, within HUB_ANSWER_TIMEOUT_S seconds."""
    answer: list[str | None] = []

    def ask() -> None:
        from huggingface_hub import model_info
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            model_info(repo_id, timeout=HUB_ANSWER_TIMEOUT_S)
            answer.append(None)
        except GatedRepoError:
            answer.append(None)  # exists; transformers will say what access it needs
        except RepositoryNotFoundError:
            answer.append("has no such model")
        except Exception as error:  # noqa: BLE001 - any network failure means "cannot reach it"
            answer.append(f"could not be reached ({type(error).__name__})")

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(HUB_ANSWER_TIMEOUT_S + 2)
    return answer[0] if answer else f"did not answer within {HUB_ANSWER_TIMEOUT_S + 2:.0f} s"
