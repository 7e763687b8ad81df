"""The AR fast decoder with the target's embedding and head shared (not saved) and a reduced drafting
vocabulary (FR-Spec style): drafting equals an argmax restricted to the kept ids, the checkpoint
holds no embedding, loading binds the target's, and strict hybrid decoding stays identical to greedy."""

import pytest
import torch
from safetensors.torch import load_file

from mmspec import MMSpecError
from mmspec.speech import ARFastDecoder, CTCFastDecoder, ctc_greedy_decode, hybrid_generate
from mmspec.speech.ar_fast_decoder import attach_ar_fast_decoder
from mmspec.speech.pipeline import load_fast_decoder
from mmspec.speech.target import encoder_outputs_of
from mmspec.speech.train_fast import Example, draft_vocabulary, train_ar_fast_decoder, train_ctc_fast_decoder

from .conftest import MAX_NEW, assert_same
from .test_ar_fast_decoder import ar_hybrid
from .tiny_whisper import EOT, VOCAB, features

PROMPT = [119, 120, 123, 124]


def shared(whisper, vocab=None, init_layer=-1):
    return ARFastDecoder.for_target(whisper, init_layer=init_layer, prompt_ids=PROMPT, share_embeddings=True, draft_vocab=vocab)


def states_of(whisper, seed):
    return encoder_outputs_of(whisper, {"input_features": features(seed)}).last_hidden_state


def test_shared_embeddings_are_the_targets_tensors(whisper):
    fast = shared(whisper)
    assert fast.model.decoder.embed_tokens.weight is whisper.model.decoder.embed_tokens.weight
    assert fast.proj_out.weight is whisper.get_output_embeddings().weight
    copied = ARFastDecoder.for_target(whisper, init_layer=-1, prompt_ids=PROMPT)  # control: the default copies
    assert copied.proj_out.weight is not whisper.get_output_embeddings().weight


def test_reduced_vocabulary_drafts_the_restricted_argmax(whisper):
    """Each drafted token is the full-vocabulary logits' argmax over the kept ids only."""
    kept = [EOT] + list(range(0, 60))
    fast, full = shared(whisper, kept), shared(whisper)
    states = states_of(whisper, 1)
    draft = fast.hypothesis(states, max_new_tokens=10)[0]
    assert draft and all(t in kept for t in draft)
    # teacher-force the draft through the full-vocabulary decoder and restrict its logits by hand
    step = full._transformers_steps(states, full.proj_out.weight, None)
    logits = step(torch.tensor([PROMPT]))
    suppress = set(whisper.generation_config.suppress_tokens or [])
    begin = set(whisper.generation_config.begin_suppress_tokens or [])
    for i, token in enumerate(draft):
        allowed = [t for t in kept if t not in suppress and (i > 0 or t not in begin)]
        assert token == allowed[int(logits[0, allowed].argmax())]
        logits = step(torch.tensor([[token]]))
    unrestricted = full.hypothesis(states, max_new_tokens=10)[0]
    assert any(t not in kept for t in unrestricted)  # control: the restriction changes what is drafted


def test_checkpoint_holds_no_embedding_and_loading_binds_the_target(whisper, tmp_path):
    fast = shared(whisper, [EOT] + list(range(40)))
    fast.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert not any("embed_tokens" in k or "proj_out" in k for k in saved)
    assert any("embed_positions" in k for k in saved)
    loaded = load_fast_decoder(tmp_path)
    assert loaded.proj_out.weight is not whisper.get_output_embeddings().weight
    attach_ar_fast_decoder(loaded, whisper)
    assert loaded.proj_out.weight is whisper.get_output_embeddings().weight
    states = states_of(whisper, 2)
    assert loaded.hypothesis(states, max_new_tokens=12) == fast.hypothesis(states, max_new_tokens=12)


@pytest.mark.parametrize("vocab", [[EOT] + list(range(0, 60, 2)), [EOT, 3, 5]])
def test_strict_hybrid_with_a_reduced_vocabulary_equals_greedy(whisper, references, vocab):
    fast = shared(whisper, vocab)
    for x, sequences, _ in references.values():
        out = ar_hybrid(whisper, fast, x)
        assert_same(out.sequences, sequences)


def test_bad_draft_vocabularies_are_refused(whisper):
    with pytest.raises(MMSpecError, match="outside"):
        shared(whisper, [EOT, VOCAB])
    with pytest.raises(MMSpecError, match="twice"):
        shared(whisper, [EOT, 3, 3])
    fast = shared(whisper, [3, 4, 5])
    with pytest.raises(MMSpecError, match="lacks end-of-text"):
        fast.hypothesis(states_of(whisper, 0), max_new_tokens=4)


def test_draft_vocabulary_ranks_label_tokens_then_fills_low_ids():
    examples = [Example(states=torch.zeros(1), prompt=[], labels=[9, 9, 9, 50, 50, 7])]
    assert draft_vocabulary(examples, 6, VOCAB, {EOT}) == [EOT, 9, 50, 7, 0, 1]
    with pytest.raises(MMSpecError, match="size"):
        draft_vocabulary(examples, 0, VOCAB)


def test_training_with_a_reduced_vocabulary_lowers_the_loss(whisper, references):
    """Distillation over the reduced vocabulary trains the layer and never the shared (frozen) head."""
    for p in whisper.parameters():
        p.requires_grad_(False)
    try:
        examples = [Example(states=states_of(whisper, s)[0], prompt=PROMPT, labels=references[s][2][:MAX_NEW])
                    for s in references]
        head = whisper.get_output_embeddings().weight.clone()
        fast, losses = train_ar_fast_decoder(whisper, examples, 30, batch_size=3, learning_rate=3e-3, share_embeddings=True,
                                             draft_vocab_size=40, progress_bar=False)
        assert losses[-1] < 0.7 * losses[0]
        assert torch.equal(whisper.get_output_embeddings().weight, head)
        assert len(fast.config.draft_vocab) == 40 and fast.config.draft_vocab[0] == EOT
    finally:
        for p in whisper.parameters():
            p.requires_grad_(True)


# --- the CTC fast decoder over a reduced vocabulary ---------------------------------------------


def ctc_head(whisper, vocab=None, seed=0):
    torch.manual_seed(seed)
    return CTCFastDecoder.for_target(whisper, hidden_size=32, intermediate_size=64, num_attention_heads=4, upsample=2,
                                     draft_vocab=vocab).eval()


def test_ctc_reduced_vocabulary_writes_the_kept_ids(whisper):
    kept = [EOT] + list(range(40, 100))
    head = ctc_head(whisper, kept)
    assert head.head.out_features == len(kept) + 1 and head.blank_id == len(kept)
    states = states_of(whisper, 2)
    logits = head(states).logits
    paths = [ctc_greedy_decode(row, head.blank_id) for row in logits.argmax(-1)]
    assert head.hypothesis(states) == [[kept[c] for c in path] for path in paths]
    assert any(paths) and all(t in kept for t in head.hypothesis(states)[0])
    assert head.label_columns([EOT, 41, 7, 99]) == [0, 2, 60]  # 7 is not kept: left out
    assert ctc_head(whisper).label_columns([7, 41]) == [7, 41]  # the whole vocabulary: ids are columns


def test_ctc_reduced_vocabulary_trains_saves_and_stays_lossless(whisper, references, tmp_path):
    examples = [Example(states=states_of(whisper, s)[0], prompt=PROMPT, labels=references[s][2]) for s in range(4)]
    head, losses = train_ctc_fast_decoder(whisper, examples, 3, batch_size=2, progress_bar=False, draft_vocab_size=50,
                                          hidden_size=32, intermediate_size=64, num_attention_heads=4)
    assert len(head.config.draft_vocab) == 50 and len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    head.save_pretrained(tmp_path / "ctc")
    loaded = load_fast_decoder(tmp_path / "ctc")
    assert loaded.config.draft_vocab == head.config.draft_vocab and loaded.head.out_features == 51
    for seed in (0, 1, 2):
        x, expected, _ = references[seed]
        assert_same(hybrid_generate(whisper, loaded, x, max_new_tokens=MAX_NEW).sequences, expected)


@pytest.mark.parametrize("vocab", [[], [3, 3], [VOCAB]], ids=["empty", "twice", "outside"])
def test_ctc_bad_reduced_vocabulary_is_refused(whisper, vocab):
    with pytest.raises(MMSpecError, match="draft vocabulary"):
        ctc_head(whisper, vocab)
