"""Synthetic speech for the toy ASR model: sentences spoken by espeak-ng, saved as a dataset folder.

Sentences come from two sources, half each:
- captions of the shapes world (:func:`mmspec.world.caption_corpus`), the domain the zoo lives in;
- a broader template generator (:func:`broad_sentence`): everyday statements, questions, numbers
  and times over a few hundred common words, so the model is not only a caption parrot.

Each clip is spoken by espeak-ng with a random voice (6 English accents x 8 voice variants),
speed (140-210 words per minute) and pitch (25-75), resampled to 16 kHz mono, with a small random
gain and white noise at 30-45 dB SNR. Train and held-out clips use disjoint seed streams.

A dataset folder is ``metadata.jsonl`` (one ``{"file", "text", "voice", "speed", "pitch"}`` per
line, ``file`` relative to the folder) plus the wav files: the format ``mmspec train-fast-decoder``
and ``mmspec bench speech`` read.

    python -m mmspec.speech.recipes.speech_data --out /tmp/asr-train --n 6000 --split train
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mmspec.errors import MMSpecError
from mmspec.world import caption_corpus

RATE = 16_000
ACCENTS = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan"]
VARIANTS = ["", "+f1", "+f2", "+f3", "+f4", "+m1", "+m3", "+m5"]
SPEED = (140, 210)
PITCH = (25, 75)
SNR_DB = (30.0, 45.0)
SPLIT_SALT = {"train": 11, "heldout": 97}

# ---------------------------------------------------------------- sentences

SUBJECTS = ["the cat", "my brother", "our teacher", "a small dog", "the old man", "she", "he", "they", "we",
            "the children", "my friend", "the driver", "a young woman", "the farmer", "his sister", "the team",
            "the baby", "her mother", "the doctor", "a tall boy"]
VERBS = ["likes", "wants", "sees", "finds", "needs", "opens", "carries", "paints", "buys", "cleans", "brings",
         "holds", "reads", "watches", "fixes", "moves"]
OBJECTS = ["the door", "a green apple", "the red box", "a long letter", "the window", "a cup of tea", "the book",
           "a yellow ball", "the car", "a warm coat", "the map", "some bread", "the old chair", "a blue pen",
           "the garden gate", "a small boat", "the kitchen table", "a paper bag"]
PLACES = ["in the garden", "at the station", "near the river", "on the hill", "in the kitchen", "at school",
          "by the window", "in the park", "under the bridge", "at home", "in the city", "on the train"]
TIMES = ["today", "this morning", "every day", "last night", "on monday", "after lunch", "at noon",
         "before dinner", "on friday evening", "in the spring"]
ADJECTIVES = ["happy", "tired", "quiet", "busy", "cold", "hungry", "late", "ready", "kind", "careful"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
           "twenty", "thirty", "forty", "fifty", "a hundred"]
QUESTION_WORDS = ["where", "when", "why", "how"]


def broad_sentence(rng: random.Random) -> str:
    """One everyday sentence from a handful of templates."""
    s, v, o = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
    p, t, a, n = rng.choice(PLACES), rng.choice(TIMES), rng.choice(ADJECTIVES), rng.choice(NUMBERS)
    templates = [
        f"{s} {v} {o} {p}.",
        f"{t}, {s} {v} {o}.",
        f"{s} {v} {o} {t} {p}.",
        f"{QUESTION_WORDS[rng.randrange(4)]} does {s} keep {o}?",
        f"there are {n} people {p} {t}.",
        f"{s} was {a} {t}, so {rng.choice(SUBJECTS)} {v} {o}.",
        f"please bring {o} {p}.",
        f"the train leaves at {n} past {rng.choice(NUMBERS[:12])}.",
        f"{s} counted {n} birds {p}.",
        f"is {s} {a} {t}?",
    ]
    return rng.choice(templates)


def sentences(n: int, split: str, seed: int = 0) -> list[str]:
    """``n`` sentences of ``split``: shapes-world captions and broad sentences, interleaved."""
    if split not in SPLIT_SALT:
        raise MMSpecError(f"unknown split {split!r}; choose from {', '.join(SPLIT_SALT)}")
    captions = caption_corpus((n + 1) // 2, seed=seed, split=split)
    rng = random.Random(seed * 1000 + SPLIT_SALT[split])
    broad = [broad_sentence(rng) for _ in range(n // 2)]
    out = []
    for i in range(n):
        out.append(captions[i // 2] if i % 2 == 0 else broad[i // 2])
    return out


# ---------------------------------------------------------------- speech

def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def synthesise(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    """espeak-ng speech of ``text`` as float32 mono at 16 kHz."""
    if not espeak_available():
        raise MMSpecError("espeak-ng is not installed (Debian/Ubuntu: apt-get install espeak-ng)")
    raw = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
                         check=True, capture_output=True).stdout
    # --stdout writes a streaming wav header (44 bytes, bogus length); the rate is in the header.
    rate = int.from_bytes(raw[24:28], "little")
    samples = np.frombuffer(raw[44:], dtype="<i2").astype(np.float32) / 32768.0
    return resample(samples, rate, RATE)


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear-interpolation resampling (espeak's 22.05 kHz output is band-limited well below 8 kHz)."""
    if rate == target:
        return samples
    n = int(round(len(samples) * target / rate))
    return np.interp(np.arange(n) * (rate / target), np.arange(len(samples)), samples).astype(np.float32)


def add_noise(samples: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    power = float(np.mean(samples ** 2)) + 1e-12
    snr = rng.uniform(*SNR_DB)
    noisy = samples * rng.uniform(0.5, 1.0) + rng.standard_normal(len(samples)).astype(np.float32) * np.sqrt(power / 10 ** (snr / 10))
    return np.clip(noisy, -1.0, 1.0).astype(np.float32)


def write_wav(path: Path, samples: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())


def clip_settings(index: int, split: str, seed: int) -> dict:
    rng = random.Random((seed * 7919 + SPLIT_SALT[split]) * 1_000_003 + index)
    return {"voice": rng.choice(ACCENTS) + rng.choice(VARIANTS), "speed": rng.randint(*SPEED),
            "pitch": rng.randint(*PITCH), "noise_seed": rng.randrange(2 ** 31)}


def spoken_clip(text: str, settings: dict) -> np.ndarray:
    audio = synthesise(text, settings["voice"], settings["speed"], settings["pitch"])
    return add_noise(audio, np.random.default_rng(settings["noise_seed"]))


def build_dataset(out: str | Path, n: int, split: str = "train", seed: int = 0, max_seconds: float | None = None,
                  workers: int = 2) -> Path:
    """Write ``n`` spoken sentences of ``split`` to ``out`` (wav files + metadata.jsonl).

    Clips longer than ``max_seconds`` are re-drawn from further sentences, so every clip fits the model's window.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pool = sentences(n * 2, split, seed)  # spare sentences for clips that come out too long

    def make(i: int) -> tuple[dict, np.ndarray] | None:
        settings = clip_settings(i, split, seed)
        audio = spoken_clip(pool[i], settings)
        if max_seconds is not None and len(audio) > max_seconds * RATE:
            return None
        return {"text": pool[i], "voice": settings["voice"], "speed": settings["speed"], "pitch": settings["pitch"]}, audio

    rows = []
    executor = ThreadPoolExecutor(workers)  # espeak-ng runs as a subprocess: threads suffice
    try:
        for row in executor.map(make, range(len(pool))):
            if row is None:
                continue
            meta, audio = row
            meta = {"file": f"clip_{len(rows):05d}.wav", **meta, "seconds": round(len(audio) / RATE, 3)}
            write_wav(out / meta["file"], audio)
            rows.append(meta)
            if len(rows) == n:
                break
    finally:
        # map() queued every spare sentence: drop the ones not started instead of synthesising them all.
        executor.shutdown(wait=True, cancel_futures=True)
    if len(rows) < n:
        raise MMSpecError(f"only {len(rows)} of {n} clips fit in {max_seconds} s")
    with open(out / "metadata.jsonl", "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return out


def read_metadata(folder: str | Path) -> list[dict]:
    """The rows of a dataset folder's metadata.jsonl, with ``path`` made absolute."""
    folder = Path(folder)
    meta = folder / "metadata.jsonl"
    if not meta.is_file():
        raise MMSpecError(f"{folder} is not a speech dataset folder: no metadata.jsonl")
    rows = []
    for number, line in enumerate(meta.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            row["path"] = str(folder / row["file"])
            row["text"] = str(row["text"])
        except (ValueError, KeyError, TypeError):
            raise MMSpecError(f"{meta}:{number}: expected a JSON object with 'file' and 'text'") from None
        rows.append(row)
    if not rows:
        raise MMSpecError(f"{meta} lists no clips")
    return rows


def export_clips(source: str | Path, out: str | Path, n: int, suffix: str = ".flac",
                 max_seconds: float | None = None) -> Path:
    """Copy the first ``n`` clips of a dataset folder (shorter than ``max_seconds``) re-encoded as ``suffix``
    (FLAC by default: lossless, smaller), with their metadata: the held-out clips shipped with the zoo."""
    from mmspec.media import write_audio
    from mmspec.speech.audio import load_audio

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in read_metadata(source) if max_seconds is None or r.get("seconds", 0) <= max_seconds][:n]
    with open(out / "metadata.jsonl", "w") as handle:
        for row in rows:
            name = Path(row.pop("file")).with_suffix(suffix).name
            write_audio(out / name, load_audio(row.pop("path"), sampling_rate=RATE), RATE)
            handle.write(json.dumps({"file": name, **row}) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--split", default="train", choices=sorted(SPLIT_SALT))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=10.0)
    args = parser.parse_args()
    folder = build_dataset(args.out, args.n, args.split, args.seed, args.max_seconds)
    print(f"wrote {args.n} clips to {folder}")


if __name__ == "__main__":
    main()
