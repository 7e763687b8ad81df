"""FLASH (arXiv 2505.12728): lossless inside the shared loop, cache consistent with the training
path, ceil(k/n) forwards per proposal, trainable, and saved/loaded without the target's weights."""

import math

import pytest
import torch

from mmspec import FixedDraftLength, speculative_generate
from mmspec.decoding import SpeculativeDecoder
from mmspec.drafters import DraftView
from mmspec.errors import MMSpecError
from mmspec.sampling import SamplingConfig
from mmspec.testing import assert_greedy_equal, tiny_llama
from mmspec.trees import TreeConfig
from mmspec.vision.feature_drafter import DistillBatch
from mmspec.vision.flash import FlashDrafter, FlashDrafterModel, compress_visual
from mmspec.vision.flash_model import FlashConfig, spread_positions, visual_runs
from mmspec.vision.models import visual_mask

from .tiny_vlms import BOS, IMAGE, VOCAB, Case, llava, next_video, text_ids

MAX_NEW = 16


@pytest.fixture(scope="module")
def cases() -> dict[str, Case]:
    built = {"llava": llava(), "video": next_video()}
    for case in built.values():
        case.reference = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=MAX_NEW, **case.inputs)
    return built


def drafter_model(case: Case, n: int = 2, compress: bool = True, seed: int = 0, queries: int = 3) -> FlashDrafterModel:
    torch.manual_seed(seed)
    config = case.model.config.get_text_config()
    return FlashDrafterModel.from_target_config(config, num_queries=queries, semi_ar_tokens=n, compress=compress).eval()


class RecordingFlash(FlashDrafter):
    """Remembers every (committed sequence, proposal, predicted features of each forward)."""

    def __init__(self, model):
        super().__init__(model)
        self.log = []

    def propose(self, view):
        self._blocks = []
        proposal = super().propose(view)
        self.log.append((view.sequence.clone(), proposal, self._blocks))
        return proposal

    def _run(self, hidden, positions):
        predicted = super()._run(hidden, positions)
        getattr(self, "_blocks", []).append(predicted[0])
        return predicted


def view_of(sequence: torch.LongTensor, k: int = 0, tree: TreeConfig | None = None) -> DraftView:
    """What the loop shows a drafter of `sequence` with room for `k` greedy drafts (or a `tree`)."""
    return DraftView(sequence, SamplingConfig(), None, FixedDraftLength(max(k, 1)), max_tokens=k, tree=tree)


@torch.no_grad()
def reference_drafts(model: FlashDrafterModel, case: Case, sequence: torch.LongTensor, k: int):
    """Greedy FLASH drafts computed from scratch with no cache: the whole drafter sequence is re-run
    for every semi-autoregressive block. Returns the k tokens and each block's predicted features."""
    hidden = case.model(sequence, output_hidden_states=True, **case.inputs).hidden_states
    embeds, features = hidden[0][0], hidden[-1][0]
    head, embed = case.model.get_output_embeddings(), case.model.get_input_embeddings()
    visual = visual_mask(case.model, sequence[0])
    visual[case.input_ids.shape[1] - 1 :] = False
    text = model.text_inputs(embeds[1:], features[:-1])  # positions 0 .. N-2
    tokens, blocks = [], []
    while len(tokens) < k:
        layout, positions, _ = model.assemble(text, embeds, visual)
        predicted = model.semi_ar(model(layout[None], positions[None])[0, -1])  # [n, H]
        block = head(predicted).argmax(-1)
        tokens += block.tolist()
        blocks.append(predicted)
        text = torch.cat([text, model.text_inputs(embed(block), predicted)])
    return tokens[:k], blocks


def trace(case: Case, new_tokens: int = 12, input_ids=None) -> DistillBatch:
    """A one-example distillation batch: the target's greedy continuation, its embeds and features."""
    prompt = case.input_ids if input_ids is None else input_ids
    with torch.no_grad():
        full = case.model.generate(prompt, do_sample=False, max_new_tokens=new_tokens, **case.inputs)
        hidden = case.model(full, output_hidden_states=True, **case.inputs).hidden_states
    loss_mask = torch.zeros_like(full, dtype=torch.bool)
    loss_mask[0, prompt.shape[1] - 2 : -1] = True  # DistillBatch: from predicting the last prompt feature
    return DistillBatch(full, hidden[0], hidden[-1], visual_mask(case.model, full), torch.ones_like(full), loss_mask)


def stack(batches: list[DistillBatch]) -> DistillBatch:
    """Right-pad one-example batches into one."""
    width = max(b.input_ids.shape[1] for b in batches)

    def pad(t):
        widths = (0, 0, 0, width - t.shape[1]) if t.dim() == 3 else (0, width - t.shape[1])
        return torch.nn.functional.pad(t, widths)

    fields = [f for f in DistillBatch.__dataclass_fields__ if f != "position_ids"]  # LLaVA: 1-D, none stored
    return DistillBatch(*(torch.cat([pad(getattr(b, f)) for b in batches]) for f in fields))


# ---- pure functions ------------------------------------------------------------------------


def test_compress_visual_is_query_weighted_average():
    features = torch.randn(7, 8)
    queries = torch.randn(3, 8)
    expected = torch.softmax(queries @ features.T / math.sqrt(8), dim=-1) @ features
    assert torch.allclose(compress_visual(queries, features), expected, atol=1e-6)
    # Zero queries weigh every visual token alike: each compressed token is the mean.
    assert torch.allclose(compress_visual(torch.zeros(2, 8), features), features.mean(0).expand(2, 8), atol=1e-6)


def test_layout_keeps_text_positions_and_spreads_the_compressed_block(cases):
    model = drafter_model(cases["llava"], queries=3)
    visual = torch.tensor([False, False, True, True, True, True, False, False])
    assert visual_runs(visual) == [(2, 6)]
    text_hidden, embeds = torch.randn(7, 64), torch.randn(8, 64)
    hidden, positions, sources = model.assemble(text_hidden, embeds, visual)
    assert positions.tolist() == [0, 1, 2, 4, 5, 6] and sources.tolist() == [0, 1, -1, -1, -1, 6]
    assert torch.allclose(hidden[2:5], compress_visual(model.queries, embeds[2:6]), atol=1e-6)
    assert spread_positions(10, 20, 4).tolist() == [10, 13, 16, 19]
    plain = drafter_model(cases["llava"], compress=False)
    assert plain.assemble(text_hidden, embeds, visual)[1].tolist() == [0, 1, 2, 3, 4, 5, 6]
    # Two images: each compressed on its own, in place.
    two = torch.tensor([False, True, True, False, True, True, True, False])
    assert model.assemble(text_hidden, embeds, two)[2].tolist() == [0, -1, -1, -1, 3, -1, -1, -1]


# ---- losslessness and bookkeeping -----------------------------------------------------------


@pytest.mark.parametrize("name", ["llava", "video"])
@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 3, 5])
def test_greedy_identical_to_generate(cases, name, compress, n, k):
    case = cases[name]
    out = assert_greedy_equal(case.model, FlashDrafter(drafter_model(case, n, compress)), case.input_ids,
                              max_new_tokens=MAX_NEW, reference=case.reference, policy=FixedDraftLength(k), **case.inputs)
    assert out.stats.drafter_forwards > 0


@pytest.mark.parametrize("name,n,compress", [("llava", None, True), ("llava", 3, False), ("video", 2, True), ("video", 3, True)])
def test_cached_drafting_matches_a_from_scratch_reference(cases, trained, name, n, compress):
    """Every proposal (all blocks) equals drafting from scratch over the committed sequence: the
    cache, its rollback, the positions and the semi-AR feedback are right."""
    case = cases[name]
    model = trained[0] if n is None else drafter_model(case, n, compress)  # None: the trained n = 2 drafter
    # The call's own working copy of the drafter holds what it recorded.
    drafter = speculative_generate(case.model, RecordingFlash(model), case.input_ids, max_new_tokens=MAX_NEW,
                                   policy=FixedDraftLength(5), **case.inputs).drafter
    assert len(drafter.log) > 2
    for sequence, proposal, blocks in drafter.log:
        tokens, expected_blocks = reference_drafts(model, case, sequence, proposal.length)
        assert proposal.tokens[0].tolist() == tokens
        assert len(blocks) == len(expected_blocks)
        for got, expected in zip(blocks, expected_blocks):
            assert torch.allclose(got, expected, atol=1e-4)


@pytest.mark.parametrize("image_last", [False, True])
def test_training_path_predicts_what_the_runtime_drafts(cases, trained, image_last):
    """`predict` (the teacher-forced training pass) gives the runtime's first block at the last
    position, also when the prompt ends with the image (its last slot then stays a text input)."""
    case, model = cases["llava"], trained[0]
    prompt = text_ids([BOS, 11, 12], [IMAGE] * 4) if image_last else case.input_ids
    drafter = speculative_generate(case.model, RecordingFlash(model), prompt, max_new_tokens=MAX_NEW,
                                   policy=FixedDraftLength(3), **case.inputs).drafter
    assert drafter.log
    prompt_length = prompt.shape[1]
    for sequence, _, blocks in drafter.log:
        if not blocks:  # the last round may have no room for drafts
            continue
        with torch.no_grad():
            hidden = case.model(sequence, output_hidden_states=True, **case.inputs).hidden_states
            loss_mask = torch.zeros_like(sequence, dtype=torch.bool)
            loss_mask[0, prompt_length - 2 : -1] = True
            visual = visual_mask(case.model, sequence)
            batch = DistillBatch(sequence, hidden[0], hidden[-1], visual, torch.ones_like(sequence), loss_mask)
            predicted, valid = model.predict(batch)
        last = sequence.shape[1] - 2  # its input is fc([e(newest token); f_last])
        assert valid[0, last] and not valid[0, 4]  # an image slot is not a text position
        assert torch.allclose(predicted[0, last], blocks[0], atol=1e-4)


@pytest.mark.parametrize("n,k", [(1, 4), (2, 4), (2, 5), (3, 5), (3, 2), (4, 9)])
def test_semi_ar_forwards_per_proposal(cases, n, k):
    case = cases["llava"]
    drafter = FlashDrafter(drafter_model(case, n))
    decoder = SpeculativeDecoder(case.model, drafter)
    with torch.no_grad():
        step = decoder.target.start(case.input_ids, **case.inputs)
        drafter.observe(view_of(case.input_ids), None, step)
        assert drafter.forwards == 1  # the prompt's cache, in one forward
        sequence = torch.cat([case.input_ids, step.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        proposal = drafter.propose(view_of(sequence, k))
    assert proposal.length == k
    assert drafter.forwards - 1 == math.ceil(k / n)


@pytest.mark.parametrize("depth", [1, 3, 5])
def test_a_tree_one_node_wide_drafts_the_chain_of_a_one_token_head(cases, depth):
    """With one draft per forward (n = 1) a chain feeds each draft with the feature predicted before it, at
    its own position: so must a tree, node by node, and a tree one node wide then drafts the chain's tokens."""
    case = cases["llava"]
    model = drafter_model(case, 1)

    class ReadFeatures(torch.nn.Module):  # the borrowed LM head, noting every predicted feature it reads
        def __init__(self, head):
            super().__init__()
            self.head, self.weight, self.read = head, head.weight, []

        def forward(self, features):
            self.read.append(features.reshape(-1, features.shape[-1]))
            return self.head(features)

    def first_round(propose):
        drafter = FlashDrafter(model)
        decoder = SpeculativeDecoder(case.model, drafter)
        drafter.lm_head = ReadFeatures(drafter.lm_head)
        with torch.no_grad():
            step = decoder.target.start(case.input_ids, **case.inputs)
            drafter.observe(view_of(case.input_ids), None, step)
            sequence = torch.cat([case.input_ids, step.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            return propose(drafter, sequence), drafter.forwards, torch.cat(drafter.lm_head.read)

    chain, chain_forwards, chain_features = first_round(
        lambda d, s: d.propose(view_of(s, depth)))
    tree, tree_forwards, tree_features = first_round(
        lambda d, s: d.propose(view_of(s, depth, TreeConfig(num_nodes=depth, top_k=1, depth=depth))))
    assert tree.parents.tolist() == list(range(-1, depth - 1))
    assert torch.equal(tree.tokens, chain.tokens[0])
    assert torch.allclose(tree_features, chain_features, atol=1e-5)  # same inputs, positions and attention
    assert tree_forwards == chain_forwards == 1 + depth


def test_cache_holds_compressed_visual_tokens(cases):
    case = cases["video"]  # 16 visual tokens
    drafter = speculative_generate(case.model, FlashDrafter(drafter_model(case, queries=3)), case.input_ids, max_new_tokens=1,
                                   **case.inputs).drafter
    text = case.input_ids.shape[1] - 16
    assert drafter.cache.get_seq_length() == 3 + text - 1  # the last prompt position is still pending


def test_prompt_without_visual_tokens_and_sampling_repeat(cases):
    case = cases["llava"]
    drafter = RecordingFlash(drafter_model(case, 2))
    text_only = text_ids([BOS, 11, 12, 13])
    runs = [
        speculative_generate(case.model, drafter, text_only if i == 2 else case.input_ids, max_new_tokens=12, do_sample=True,
                             generator=torch.Generator().manual_seed(5), **({} if i == 2 else case.inputs))
        for i in range(3)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[2].sequences.shape[1] > text_only.shape[1]
    _, proposal, _ = runs[0].drafter.log[0]
    assert proposal.probs is not None and proposal.probs.shape == (1, proposal.length, case.model.config.text_config.vocab_size)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(1, proposal.length))
    assert bool((proposal.probs[0].gather(-1, proposal.tokens[0, :, None]) > 0).all())


# ---- training and checkpoints ---------------------------------------------------------------


def train(model, batch, lm_head, steps, lr=3e-3, noise_std=0.05):
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        loss = model.training_loss(batch, None, lm_head, noise_std=noise_std, generator=generator)["loss"]
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval()


@pytest.fixture(scope="module")
def trained(cases):
    """A drafter fitted (briefly) to two LLaVA traces of different lengths: a 'realistic' drafter."""
    case = cases["llava"]
    other_prompt = text_ids([BOS, 11], [IMAGE] * 4, [14, 15, 12])
    batch = stack([trace(case), trace(case, 8, other_prompt)])
    model = drafter_model(case, n=2)
    head = case.model.get_output_embeddings().requires_grad_(False)
    before = model.training_loss(batch, None, head)
    train(model, batch, head, steps=60)
    return model, batch, before


def test_training_lowers_the_loss(cases, trained):
    model, batch, before = trained
    head = cases["llava"].model.get_output_embeddings()
    with torch.no_grad():
        after = model.training_loss(batch, None, head)
    assert set(before) >= {"loss", "feature_loss", "token_loss", "token_accuracy", "token_accuracy_1", "token_accuracy_2"}
    assert after["loss"] < 0.5 * before["loss"]
    assert model.queries.grad is not None and model.head_out.weight.abs().sum() > 0  # every part learned


def test_trained_drafter_is_accepted_and_still_lossless(cases, trained):
    case, (model, _, _) = cases["llava"], trained
    out = assert_greedy_equal(case.model, FlashDrafter(model), case.input_ids, max_new_tokens=MAX_NEW,
                              reference=case.reference, policy=FixedDraftLength(4), **case.inputs)
    assert out.stats.alpha > 0.5


def test_save_and_load_round_trip(cases, trained, tmp_path):
    case, (model, _, _) = cases["llava"], trained
    model.save_pretrained(tmp_path)
    loaded = FlashDrafterModel.from_pretrained(tmp_path).eval()
    assert isinstance(loaded.config, FlashConfig) and loaded.config.semi_ar_tokens == 2 and loaded.config.num_queries == 3
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert state.keys() == loaded_state.keys()
    assert all(torch.equal(state[key], loaded_state[key]) for key in state)
    assert not any("embed" in key or "lm_head" in key for key in state)  # the target's weights are borrowed
    drafts = []
    for m in (model, loaded):
        drafter = speculative_generate(case.model, RecordingFlash(m), case.input_ids, max_new_tokens=MAX_NEW,
                                       policy=FixedDraftLength(3), **case.inputs).drafter
        drafts.append([p.tokens.tolist() for _, p, _ in drafter.log])
    assert drafts[0] and drafts[0] == drafts[1]


def test_text_only_target_is_eagle_with_a_semi_ar_head():
    target = tiny_llama(vocab_size=VOCAB, initializer_range=0.3)
    model = FlashDrafterModel.from_target_config(target.config, num_queries=2, semi_ar_tokens=2)
    assert_greedy_equal(target, FlashDrafter(model), text_ids([BOS, 11, 12, 13]), max_new_tokens=12, policy=FixedDraftLength(3))


def test_drafter_from_a_folder_and_clear_errors(cases, tmp_path):
    case = cases["llava"]
    drafter_model(case, n=2).save_pretrained(tmp_path)
    assert_greedy_equal(case.model, FlashDrafter(tmp_path), case.input_ids, max_new_tokens=MAX_NEW, reference=case.reference,
                        **case.inputs)
    with pytest.raises(MMSpecError, match="no FLASH drafter"):
        FlashDrafter(tmp_path / "missing")
    wrong = FlashDrafterModel(FlashConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_queries=2))
    with pytest.raises(MMSpecError, match="hidden size 32"):
        speculative_generate(case.model, FlashDrafter(wrong), case.input_ids, max_new_tokens=2, **case.inputs)
