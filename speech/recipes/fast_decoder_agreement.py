"""How often an AR fast decoder agrees with whisper-tiny.en's greedy transcripts on a clip folder.

Two numbers per fast decoder, over every clip's tiny.en greedy transcript (end-of-text included):
  - teacher-forced top-1: the share of positions where the fast decoder's argmax over its drafting
    vocabulary, given tiny.en's own preceding tokens, is tiny.en's next token (what a drafter that
    re-drafts after every correction could hope to have accepted);
  - correct draft prefix: the mean number of leading tokens of the fast decoder's own whole
    hypothesis that equal tiny.en's (what hybrid decoding's first verification accepts).

    python -m mmspec.speech.recipes.fast_decoder_agreement --data HELDOUT --cache HELDOUT.pt AR [AR ...]
"""

from __future__ import annotations

import argparse

import torch

from mmspec.speech.ar_fast_decoder import attach_ar_fast_decoder
from mmspec.speech.models import speech_model_path
from mmspec.speech.pipeline import load_fast_decoder, load_whisper
from mmspec.speech.recipes.train_tiny_en_fast_decoder import MODEL, cached_examples
from mmspec.speech.train_fast import _eos_ids


@torch.no_grad()
def agreement(fast, examples, eos: int) -> tuple[float, float]:
    head, ids = fast.draft_head()
    right = total = prefix = 0
    for example in examples:
        row = example.prompt + example.labels + [eos]
        states = example.states[None].to(fast.dtype)
        hidden = fast.model.decoder(input_ids=torch.tensor([row]), encoder_hidden_states=states).last_hidden_state[0]
        choice = (hidden @ head.T).argmax(-1)
        predicted = (choice if ids is None else ids[choice]).tolist()[len(example.prompt) - 1 : len(row) - 1]
        wanted = row[len(example.prompt):]
        right += sum(a == b for a, b in zip(predicted, wanted))
        total += len(wanted)
        hypothesis = fast.hypothesis(states, prompt_ids=example.prompt)[0]
        k = 0
        while k < min(len(hypothesis), len(example.labels)) and hypothesis[k] == example.labels[k]:
            k += 1
        prefix += k
    return right / total, prefix / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="clip folder (metadata.jsonl)")
    parser.add_argument("--cache", help="file for its encoder states and labels (read if it exists)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("fast_decoders", nargs="+", help="AR fast decoder folders")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, processor = load_whisper(MODEL, speech_model_path(MODEL))
    examples = cached_examples(model, processor, args.data, args.cache)
    eos = min(_eos_ids(model))
    for folder in args.fast_decoders:
        fast = attach_ar_fast_decoder(load_fast_decoder(folder), model)
        top1, prefix = agreement(fast, examples, eos)
        print(f"{folder}: teacher-forced top-1 {top1:.3f}, correct draft prefix {prefix:.1f} tokens "
              f"(transcripts {sum(len(e.labels) for e in examples) / len(examples):.1f} tokens), {len(examples)} clips", flush=True)


if __name__ == "__main__":
    main()
