"""The shared tokenizer of the shapes caption LMs (target and drafter).

A tiny byte-level BPE trained on the caption grammar: every grammar word ends up
a single token (the grammar has ~110 distinct words), byte fallback means no text
is ever out of vocabulary, and decoding restores spaces exactly. The
post-processor prepends ``<bos>`` so a prompt encodes as ``<bos> words...``.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from mmspec.world import caption_corpus

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
VOCAB_LIMIT = 1024
TOKENIZER_CORPUS = 20_000  # captions; plenty to see every grammar word many times


def build_tokenizer(seed: int = 0, n: int = TOKENIZER_CORPUS) -> PreTrainedTokenizerFast:
    """Train the BPE on ``n`` training captions of ``seed`` (deterministic)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_LIMIT,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(caption_corpus(n, seed, "train"), trainer=trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>", model_max_length=256, padding_side="left")
