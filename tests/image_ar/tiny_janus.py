"""A tiny random Janus (4 x 4 image tokens over a 12-code VQ) and a folder with it and a tiny JanusProcessor."""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    GenerationConfig,
    JanusConfig,
    JanusForConditionalGeneration,
    JanusImageProcessor,
    JanusProcessor,
    JanusVisionConfig,
    JanusVQVAEConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

PAD, BOS, EOS, BOI = 0, 1, 2, 3
IMAGE_TOKEN = 5
SPECIAL = ["<pad>", "<bos>", "<eos>", "<begin_of_image>", "<end_of_image>", "<image_placeholder>", "<unk>", "<|User|>",
           "<|Assistant|>"]
WORDS = ["a", "red", "blue", "green", "circle", "square", "triangle", ":", "."]
# Janus-style turns: "<|User|>: text\n\n<|Assistant|>:" then the processor appends <begin_of_image>.
CHAT_TEMPLATE = ("{% for m in messages %}<|User|>: {% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}"
                 "{% endif %}{% endfor %}{{ '\\n\\n' }}{% endfor %}{% if add_generation_prompt %}<|Assistant|>:{% endif %}")


def tiny_janus(seed: int = 0) -> JanusForConditionalGeneration:
    """A random Janus with peaked distributions; its generation config stores BOI like the released checkpoints."""
    torch.manual_seed(seed)
    config = JanusConfig(
        text_config=LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.3,
                                bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD),
        vision_config=JanusVisionConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8,
                                        projection_dim=32, num_image_tokens=16, depth=1),
        vq_config=JanusVQVAEConfig(embed_dim=4, num_embeddings=12, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                                   num_res_blocks=1, projection_dim=32, image_token_embed_dim=32, initializer_range=0.5),
        image_token_id=IMAGE_TOKEN,
    )
    model = JanusForConditionalGeneration(config).eval()
    # transformers' image generate reads BOI from generation_kwargs (as the released checkpoints store it).
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                                               generation_kwargs={"boi_token_id": BOI})
    return model


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over a few shape words, BOS prepended, Janus' image special tokens."""
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        extra_special_tokens={"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"})


def build_janus_folder(folder: Path, processor: str = "processor") -> Path:
    """Save the tiny Janus and, by `processor`: "processor" (JanusProcessor + chat template), "tokenizer" or "none"."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_janus().save_pretrained(folder)
    if processor == "processor":
        JanusProcessor(image_processor=JanusImageProcessor(size={"height": 32, "width": 32}), tokenizer=tiny_tokenizer(),
                       chat_template=CHAT_TEMPLATE, num_image_tokens=16).save_pretrained(folder)
    elif processor == "tokenizer":
        tiny_tokenizer().save_pretrained(folder)
    return folder
