"""Feature drafters on a Qwen2-VL target rotate by the target's own M-RoPE positions: 3-D on the
prompt (as `get_rope_index` places it), sequence index + rope_deltas after it; lossless either way;
training builds the positions decoding uses; LLaVA-family drafters and old configs keep 1-D RoPE."""

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

from mmspec import FixedDraftLength, speculative_generate
from mmspec.errors import MMSpecError
from mmspec.testing import assert_greedy_equal
from mmspec.trees import TreeConfig
from mmspec.vision.distill_data import DistillDataset, collate, generate_distill_data
from mmspec.vision.drafter_training import train_drafter
from mmspec.vision.flash import FlashDrafter
from mmspec.vision.flash_model import FlashDrafterModel
from mmspec.vision.msd import MSDDrafter, MSDDrafterModel
from mmspec.vision.rope_positions import positions_at

from .tiny_vlms import llava, qwen2_vl_image, qwen2_vl_model, qwen2_vl_video


@pytest.fixture(scope="module")
def qwen():
    return qwen2_vl_model()


def msd_for(model, seed=0):
    torch.manual_seed(seed)
    return MSDDrafterModel.from_target_config(model.config.get_text_config())


def flash_for(model, seed=0, **options):
    torch.manual_seed(seed)
    return FlashDrafterModel.from_target_config(model.config.get_text_config(), num_queries=2, semi_ar_tokens=2, **options)


def target_positions(model, sequence, prompt_types):
    """The target's own M-RoPE positions [3, 1, L] of a whole sequence (generated tokens are text)."""
    types = torch.zeros_like(sequence, dtype=torch.int32)
    types[:, : prompt_types.shape[1]] = prompt_types
    case_inputs = {k: v for k, v in model.case_inputs.items() if k.endswith("grid_thw")}
    positions, _ = model.model.get_rope_index(sequence, mm_token_type_ids=types, **case_inputs)
    return positions


class Recording:
    """Records every (sequence indices, rotary positions) pair the drafter runs text slots at."""

    def __init__(self, model):
        super().__init__(model)
        self.seen = []

    def position_ids(self, indices):
        positions = super().position_ids(indices)
        self.seen.append((indices, positions))
        return positions


class RecordingMSD(Recording, MSDDrafter):
    pass


class RecordingFlash(Recording, FlashDrafter):
    pass


def assert_positions_are_the_targets(qwen, case, out, seen):
    """Every recorded slot sits at the target's own position of its index; returns the target's positions."""
    qwen.case_inputs = case.inputs
    length = out.sequences.shape[1]
    expected = target_positions(qwen, out.sequences, case.inputs["mm_token_type_ids"])
    deltas = expected[0, 0, -1] - (length - 1)
    assert int(deltas) != 0  # the image shifts the text after it
    prompt_length = case.input_ids.shape[1]
    checked_prompt = checked_drafts = 0
    for indices, positions in seen:
        assert positions.shape == (3, *indices.shape)
        for index, position in zip(indices[0].tolist(), positions[:, 0].T.tolist()):
            want = expected[:, 0, index].tolist() if index < length else [index + int(deltas)] * 3
            assert position == want, (index, position, want)
            checked_prompt += index < prompt_length
            checked_drafts += index >= prompt_length
    assert checked_prompt >= 1 and checked_drafts > 0
    # Control: the 1-D sequence indices the drafters used before differ from the target's positions.
    assert not torch.equal(torch.arange(length).expand(3, 1, length), expected)
    return expected


@pytest.mark.parametrize("build", [qwen2_vl_image, qwen2_vl_video], ids=["image", "video"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_msd_runs_at_the_targets_positions_and_stays_lossless(qwen, build, tree):
    case = build(model=qwen)
    drafter = RecordingMSD(msd_for(qwen))
    assert drafter.model.config.mrope_section == [2, 3, 3]
    assert isinstance(drafter.model.rotary_emb, Qwen2VLRotaryEmbedding)
    options = {"tree": TreeConfig(num_nodes=8, top_k=2, depth=3)} if tree else {"policy": FixedDraftLength(3)}
    out = assert_greedy_equal(qwen, drafter, case.input_ids, max_new_tokens=12, **options, **case.inputs)
    assert out.stats.drafted > 0
    assert_positions_are_the_targets(qwen, case, out, out.drafter.seen)
    prompt_length = case.input_ids.shape[1]
    assert sum(int((indices < prompt_length).sum()) for indices, _ in out.drafter.seen) == prompt_length  # each once


@pytest.mark.parametrize("build", [qwen2_vl_image, qwen2_vl_video], ids=["image", "video"])
@pytest.mark.parametrize("compress", [True, False], ids=["compressed", "uncompressed"])
def test_flash_runs_at_the_targets_positions_and_stays_lossless(qwen, build, compress):
    case = build(model=qwen)
    drafter = RecordingFlash(flash_for(qwen, compress=compress))
    assert drafter.model.config.mrope_section == [2, 3, 3]
    assert isinstance(drafter.model.rotary, Qwen2VLRotaryEmbedding)
    layer_positions = []
    rotary_forward = drafter.model.rotary.forward
    drafter.model.rotary.forward = lambda x, ids: layer_positions.append(ids) or rotary_forward(x, ids)
    out = assert_greedy_equal(qwen, drafter, case.input_ids, max_new_tokens=12, policy=FixedDraftLength(3),
                              **case.inputs)
    assert out.stats.drafted > 0
    expected = assert_positions_are_the_targets(qwen, case, out, out.drafter.seen)
    # The prompt's forward: [text; visual block; text], the text at the target's positions, the block inside
    # the target's span of it (compressed: m tokens, each at one position on all three axes).
    prompt = layer_positions[0][:, 0]
    visual = case.input_ids[0] == case.input_ids[0, 4]  # the placeholder run right after VISION_START
    count, block_size = int(visual.sum()), 2 if compress else int(visual.sum())
    span = expected[:, 0, 4 : 4 + count]
    block = prompt[:, 4 : 4 + block_size]
    assert torch.equal(prompt[:, :4], expected[:, 0, :4])
    assert torch.equal(prompt[:, 4 + block_size :], expected[:, 0, 4 + count : case.input_ids.shape[1] - 1])
    if compress:
        assert torch.equal(block[0], block[1]) and torch.equal(block[0], block[2])
        assert block[0].tolist() == [int(span.min()), int(span.max())]
    else:
        assert torch.equal(block, span)
    assert int(block.min()) >= int(span.min()) and int(block.max()) <= int(span.max())


def trained_on_a_trace(qwen, kind, tmp_path):
    """A Qwen2-VL image case, its distill trace, and a `kind` drafter trained one step on it (with M-RoPE)."""
    case = qwen2_vl_image(model=qwen)
    generate_distill_data(qwen, [{"input_ids": case.input_ids, **case.inputs}], tmp_path / "data", max_new_tokens=6,
                          progress=False)
    trace = DistillDataset(tmp_path / "data")[0]
    trained = train_drafter(qwen, kind, tmp_path / "data", tmp_path / "out", steps=1, batch_size=1,
                            curriculum="none", checkpoint_every=0, progress=False)
    assert trained.config.mrope_section == [2, 3, 3]
    return case, trace, trained


def record_rotary_positions(rotary):
    """The list that receives the position_ids of every later call of the rotary embedding module `rotary`."""
    seen = []
    forward = rotary.forward
    rotary.forward = lambda x, position_ids: seen.append(position_ids) or forward(x, position_ids)
    return seen


def test_training_builds_the_positions_decoding_uses(qwen, tmp_path):
    case, trace, trained = trained_on_a_trace(qwen, "msd", tmp_path)
    qwen.case_inputs = case.inputs
    expected = target_positions(qwen, trace["input_ids"][None], case.inputs["mm_token_type_ids"])
    assert torch.equal(trace["position_ids"], expected[:, 0])
    batch = collate([trace])
    drafter = speculative_generate(qwen, MSDDrafter(msd_for(qwen)), case.input_ids, max_new_tokens=2, num_draft_tokens=1,
                                   **case.inputs).drafter  # the call's own working copy
    indices = torch.arange(trace["input_ids"].shape[0])[None]
    assert torch.equal(drafter.position_ids(indices), batch.position_ids)
    # The loss rotates slot t by the trace's position t (not by the 1-D index it used before).
    seen = record_rotary_positions(trained.rotary_emb)
    embed, head = qwen.get_input_embeddings(), qwen.get_output_embeddings()
    with torch.no_grad():
        trained.training_loss(batch, embed, head)
        assert torch.equal(seen[0], trace["position_ids"][:, None, :-1])
        assert not torch.equal(torch.arange(seen[0].shape[-1]).expand_as(seen[0]), seen[0])  # not the 1-D indices
        batch.position_ids = None  # a trace made before positions were stored would train at sequence indices
        with pytest.raises(MMSpecError, match="make the traces again"):
            trained.training_loss(batch, embed, head)


def test_flash_trains_at_the_positions_decoding_uses(qwen, tmp_path):
    case, trace, trained = trained_on_a_trace(qwen, "flash", tmp_path)
    seen = record_rotary_positions(trained.rotary)
    batch = collate([trace])
    with torch.no_grad():
        trained.training_loss(batch, qwen.get_input_embeddings(), qwen.get_output_embeddings())
    speculative_generate(qwen, FlashDrafter(trained), case.input_ids, max_new_tokens=2, num_draft_tokens=1, **case.inputs)
    training, prompt = seen[0][:, 0], seen[1][:, 0]
    assert training.shape[0] == 3
    # Training's sequence starts with exactly the prompt forward decoding runs; its text after the prompt
    # sits at the trace's positions (index + rope_deltas), as decoding feeds them.
    assert torch.equal(training[:, : prompt.shape[1]], prompt)
    prompt_length = case.input_ids.shape[1]
    tail = training[:, prompt.shape[1] :]
    assert tail.shape[1] > 0
    assert torch.equal(tail, trace["position_ids"][:, prompt_length - 1 : prompt_length - 1 + tail.shape[1]])


@pytest.mark.parametrize("build, rotary", [(msd_for, "rotary_emb"), (flash_for, "rotary")])
def test_llava_and_saved_drafters_keep_1d_rope(qwen, build, rotary):
    drafter = build(llava().model)
    assert drafter.config.mrope_section is None and isinstance(getattr(drafter, rotary), LlamaRotaryEmbedding)
    # A drafter saved before the field existed loads with 1-D RoPE.
    config = build(qwen).config.to_dict()
    config.pop("mrope_section")
    old = type(drafter)(type(drafter.config).from_dict(config))
    assert old.config.mrope_section is None and isinstance(getattr(old, rotary), LlamaRotaryEmbedding)


def test_without_a_rope_table_positions_are_the_indices():
    indices = torch.arange(5)[None]
    assert torch.equal(positions_at(indices, None), indices)
