"""The CTC fast decoder: greedy CTC decoding, save/load, and a few training steps on a tiny target."""

import pytest
import torch
from transformers import AutoConfig

from mmspec import MMSpecError
from mmspec.speech.fast_decoder import (
    CTCFastDecoder,
    CTCFastDecoderConfig,
    ctc_greedy_decode,
    ctc_loss,
    target_encoder_states,
)
from mmspec.speech.train_fast import Example, train_ctc_fast_decoder
from mmspec.testing import reload_from_disk

from .tiny_whisper import VOCAB, features

BLANK = 9


@pytest.mark.parametrize("frames, expected", [
    ([], []),
    ([BLANK, BLANK], []),
    ([3, 3, 3], [3]),
    ([3, BLANK, 3], [3, 3]),           # a blank separates a real repeat
    ([BLANK, 1, 1, BLANK, 2, 2, 2, BLANK, BLANK, 1], [1, 2, 1]),
    ([4, 5, 5, 4, BLANK], [4, 5, 4]),
])
def test_ctc_greedy_decode(frames, expected):
    assert ctc_greedy_decode(frames, BLANK) == expected
    assert ctc_greedy_decode(torch.tensor(frames, dtype=torch.long), BLANK) == expected


def small_head(whisper, **kwargs):
    torch.manual_seed(0)
    return CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4, upsample=2, **kwargs)


def test_shapes_and_vocabulary(whisper):
    head = small_head(whisper).eval()
    assert head.config.vocab_size == VOCAB and head.blank_id == VOCAB
    states = target_encoder_states(whisper, features(0))
    logits = head(states).logits
    assert logits.shape == (1, states.shape[1] * 2, VOCAB + 1)
    for hyp in head.hypothesis(states):
        assert all(0 <= t < VOCAB for t in hyp)


def test_save_and_load_roundtrip(whisper, tmp_path):
    head = small_head(whisper).eval()
    head.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, CTCFastDecoderConfig) and config.model_type == "mmspec_ctc_fast_decoder"
    loaded = CTCFastDecoder.from_pretrained(tmp_path).eval()
    states = target_encoder_states(whisper, features(1))
    assert torch.equal(loaded(states).logits, head(states).logits)
    assert torch.equal(reload_from_disk(head)(states).logits, head(states).logits)


def test_ctc_loss_prefers_the_right_labels():
    logits = torch.full((1, 6, 5), -5.0)
    for t, token in enumerate([1, 1, 4, 2, 4, 3]):
        logits[0, t, token] = 5.0
    right = ctc_loss(logits, torch.tensor([[1, 2, 3]]), blank_id=4)
    wrong = ctc_loss(logits, torch.tensor([[3, 2, 1]]), blank_id=4)
    assert right < wrong


def examples(whisper, data):
    return [Example(states=target_encoder_states(whisper, x[None])[0], prompt=[], labels=list(ids)) for x, ids in data]


def test_training_lowers_the_loss_and_leaves_the_target_alone(whisper, references):
    data = examples(whisper, [(x[0], transcript[:12]) for x, _, transcript in references.values()])
    before = {name: p.clone() for name, p in whisper.named_parameters()}
    head, losses = train_ctc_fast_decoder(whisper, data, steps=25, fast_decoder=small_head(whisper), batch_size=3,
                                          learning_rate=3e-3, warmup_steps=0, progress_bar=False)
    assert len(losses) == 25
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert not head.training
    for name, p in whisper.named_parameters():
        assert torch.equal(p, before[name]), name
        assert p.grad is None


def test_training_input_checks(whisper):
    with pytest.raises(MMSpecError, match="empty"):
        train_ctc_fast_decoder(whisper, [], steps=1, progress_bar=False)
    with pytest.raises(MMSpecError, match="vocabulary"):
        train_ctc_fast_decoder(whisper, examples(whisper, [(features(0)[0], [VOCAB + 3])]), steps=1, progress_bar=False)
    with pytest.raises(MMSpecError, match="steps"):
        train_ctc_fast_decoder(whisper, examples(whisper, [(features(0)[0], [1])]), steps=0, progress_bar=False)
    with pytest.raises(MMSpecError, match="frames"):
        CTCFastDecoder(CTCFastDecoderConfig(vocab_size=8, encoder_hidden_size=4, hidden_size=8, num_attention_heads=2,
                                            intermediate_size=8, max_positions=3))(torch.zeros(1, 5, 4))


def test_distillation_labels_are_the_targets_transcript(whisper, references):
    from mmspec.speech.fast_decoder import distillation_labels

    for x, _, transcript in list(references.values())[:3]:
        assert distillation_labels(whisper, x, max_new_tokens=40) == transcript
