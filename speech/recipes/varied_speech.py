"""Varied English speech for distilling fast decoders of a real Whisper: text from three sources, two synthesisers.

Text (each sentence goes to the train or the held-out split by a hash of its words, so no sentence
is in both):
- sentences written by people: the docstrings of CPython's standard library (PSF licence), cut
  into sentences of 4-24 plain words;
- Markov text: a random walk on the word-trigram chain that the PyPI package `essential-generators`
  (MIT) ships, built from encyclopaedic English (varied vocabulary, local grammar);
- the toy's sentences (:func:`speech_data.sentences`: shapes-world captions, everyday templates).

Speech: espeak-ng (6 English accents x voice variants, 130-210 wpm, pitch 25-75) and the neural
voice of the PyPI package `hibari-tts` (Apache-2.0; its one offline voice, American female, speed
0.8-1.3), with light white noise. Train and held-out splits use different espeak-ng variants
(:data:`HELDOUT_VARIANTS` never appear in training); the hibari voice is in both (there is one).

The folder format is `speech_data`'s (metadata.jsonl + wav files), so `mmspec bench speech --data`
and the fast-decoder recipes read it. Clips are written as they are made and a run that stops can
be resumed (`--n` more clips are added after the ones there).

    python -m mmspec.speech.recipes.varied_speech --out /tmp/varied-train --n 4000 --split train
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import re
import warnings
import zlib
from functools import cache
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from mmspec.optional import require
from mmspec.speech.recipes import speech_data

HELDOUT_VARIANTS = ["+m2", "+m4", "+m6", "+f5", "+klatt2", "+john", "+linda", "+Andy"]
SPEED = (130, 210)
HIBARI_SPEED = (0.8, 1.3)
HIBARI_SHARE = 0.3
SOURCES = {"docstrings": 0.4, "markov": 0.35, "toy": 0.25}
TOY_POOL = 200_000  # toy sentences drawn in order (part of what a seed means: changing it changes the data)
# Modules whose docstrings are plain prose (fixed list: the pool must not depend on what is imported).
STDLIB_MODULES = [
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "cmd", "codecs", "collections",
    "colorsys", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib",
    "email", "enum", "filecmp", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob",
    "gzip", "hashlib", "heapq", "hmac", "html", "http.client", "http.server", "imaplib", "inspect", "io",
    "ipaddress", "json", "locale", "logging", "mailbox", "mimetypes", "numbers", "operator", "optparse",
    "os", "pathlib", "pdb", "pickle", "platform", "poplib", "pprint", "queue", "quopri", "random", "re",
    "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket",
    "socketserver", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "timeit", "tokenize", "trace", "traceback", "turtle", "typing", "unittest", "urllib.parse",
    "urllib.request", "uuid", "warnings", "wave", "weakref", "webbrowser", "xml.dom.minidom", "zipfile",
]
PLAIN_SENTENCE = re.compile(r"^[A-Z][A-Za-z ,;'-]*[a-z][.?!]$")


def split_of(sentence: str) -> str:
    """'heldout' for one sentence in ten (by a hash of its lower-cased words), else 'train'."""
    words = " ".join(re.findall(r"[a-z']+", sentence.lower()))
    return "heldout" if zlib.crc32(words.encode()) % 10 == 0 else "train"


@cache
def docstring_sentences() -> tuple[str, ...]:
    """Plain-prose sentences of the standard library's docstrings, deduplicated, in a fixed order."""
    seen: dict[str, None] = {}
    with warnings.catch_warnings():  # reading deprecated attributes (typing.re, ...) warns
        warnings.simplefilter("ignore")
        docs = _docstrings()
    for doc in docs:
        for paragraph in re.split(r"\n\s*\n", doc):
            text = " ".join(paragraph.split())
            for sentence in re.split(r"(?<=[.?!])\s+", text):
                if PLAIN_SENTENCE.match(sentence) and 4 <= len(sentence.split()) <= 24:
                    seen.setdefault(sentence, None)
    return tuple(seen)


def _docstrings() -> list[str]:
    docs = []
    for name in STDLIB_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module missing from this build (e.g. turtle without tk) is skipped
            continue
        docs.append(inspect.getdoc(module) or "")
        docs += [inspect.getdoc(getattr(module, attr)) or "" for attr in sorted(vars(module)) if not attr.startswith("_")]
    return docs


@cache
def _markov_chain() -> tuple[dict, list[str]]:
    markov = require("essential_generators.markov_textgen", "recipes", "the Markov text source")
    generator = markov.MarkovTextGenerator()
    starts = [bigram for bigram in generator.chain_list if bigram.split()[0][:1].isupper()]
    return generator.chain, starts


def markov_sentence(rng: random.Random, words: int) -> str:
    """About `words` words walked on essential-generators' trigram chain, from a capitalised bigram."""
    chain, starts = _markov_chain()
    text = rng.choice(starts).split()
    while len(text) < words:
        entry = chain.get(" ".join(text[-2:]))
        if not entry or not entry.get("transitions"):
            break
        text.append(rng.choices(entry["transitions"], weights=entry["weights"])[0])
    words = [re.sub(r"[^A-Za-z',-]", "", w) for w in text]
    return " ".join(w for w in words if re.search("[A-Za-z]", w)).strip(",-'") + "."


def sentence_stream(split: str, seed: int):
    """Endless sentences of `split`, each source drawn with its share of :data:`SOURCES`."""
    rng = random.Random(seed * 7_919 + speech_data.SPLIT_SALT[split])
    docs = [s for s in docstring_sentences() if split_of(s) == split]
    toy = iter(speech_data.sentences(TOY_POOL, split, seed))
    names, weights = zip(*SOURCES.items())
    while True:
        source = rng.choices(names, weights=weights)[0]
        if source == "docstrings":
            yield source, rng.choice(docs)
        elif source == "toy":
            yield source, next(toy)
        else:
            sentence = markov_sentence(rng, rng.randint(5, 20))
            if split_of(sentence) == split and len(sentence.split()) >= 4:
                yield source, sentence


@cache
def _hibari():
    return require("hibari", "recipes", "the second voice").Hibari(threads=1)


def speak(text: str, rng: random.Random, split: str) -> tuple[np.ndarray, dict]:
    """One noisy 16 kHz rendering of `text` and the voice settings used."""
    if rng.random() < HIBARI_SHARE:
        speed = round(rng.uniform(*HIBARI_SPEED), 2)
        audio = speech_data.resample(_hibari()(text, speed=speed, seed=rng.randrange(2**31)), 24_000, speech_data.RATE)
        settings = {"voice": "hibari-heart", "speed": speed, "pitch": None}
    else:
        variants = speech_data.VARIANTS if split == "train" else HELDOUT_VARIANTS
        settings = {"voice": rng.choice(speech_data.ACCENTS) + rng.choice(variants), "speed": rng.randint(*SPEED),
                    "pitch": rng.randint(*speech_data.PITCH)}
        audio = speech_data.synthesise(text, settings["voice"], settings["speed"], settings["pitch"])
    return speech_data.add_noise(audio, np.random.default_rng(rng.randrange(2**31))), settings


def build(out: str | Path, n: int, split: str = "train", seed: int = 0, max_seconds: float = 20.0) -> Path:
    """Add `n` clips of `split` to the folder `out` (resuming after the clips already listed there)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    meta = out / "metadata.jsonl"
    done = len(meta.read_text().splitlines()) if meta.is_file() else 0
    stream = sentence_stream(split, seed)
    rng = random.Random(seed * 104_729 + speech_data.SPLIT_SALT[split])
    index = 0
    with open(meta, "a") as handle, tqdm(total=done + n, initial=done, desc=f"speak {split}", unit="clip") as bar:
        while index < done + n:
            source, text = next(stream)
            audio, settings = speak(text, rng, split)
            if len(audio) > max_seconds * speech_data.RATE or len(audio) < 0.5 * speech_data.RATE:
                continue
            if index >= done:  # the stream and voices replay identically, so resuming skips what was written
                row = {"file": f"clip_{index:05d}.wav", "text": text, "source": source, **settings,
                       "seconds": round(len(audio) / speech_data.RATE, 3)}
                speech_data.write_wav(out / row["file"], audio)
                handle.write(json.dumps(row) + "\n")
                handle.flush()
                bar.update()
            index += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--n", type=int, default=1000, help="clips to add")
    parser.add_argument("--split", default="train", choices=sorted(speech_data.SPLIT_SALT))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    args = parser.parse_args()
    build(args.out, args.n, args.split, args.seed, args.max_seconds)


if __name__ == "__main__":
    main()
