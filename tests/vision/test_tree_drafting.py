"""Draft trees on vision-language targets: the tree forward (4-D mask, tree positions, Qwen2-VL's M-RoPE
shift) keeps greedy output identical to `generate`, with the text-only drafter, MSD, FLASH and an oracle tree
whose true path hides among wrong siblings."""

import pytest
import torch

from mmspec import speculative_generate
from mmspec.drafters import Drafter
from mmspec.rule_capabilities import declare_rule
from mmspec.testing import assert_greedy_equal
from mmspec.tree_rules import TREE_RULE
from mmspec.trees import DraftTree, TreeConfig
from mmspec.types import Proposal
from mmspec.vision import TextOnlyDrafter, VisionTarget
from mmspec.vision.flash import FlashDrafter, FlashDrafterModel
from mmspec.vision.msd import MSDDrafter, MSDDrafterModel

NAMES = ["llava-image", "onevision-video", "nextvideo-video", "qwen2vl-image", "qwen2vl-video"]
TREE = TreeConfig(num_nodes=12, top_k=3, depth=4)


class OracleTreeDrafter(Drafter):
    """Knows the target's greedy continuation: each level puts a wrong token first and the true one second,
    so the accepted path runs through younger siblings at every depth of the target's tree forward."""

    drafts_trees = True
    vocab_size = None

    def __init__(self, reference: torch.LongTensor, wrong: int) -> None:
        self.reference, self.wrong = reference[0], wrong

    def propose(self, view):
        sequence, config = view.sequence, view.tree
        if config is None:
            return Proposal.empty(sequence)
        truth = self.reference[sequence.shape[1]: sequence.shape[1] + config.depth].tolist()
        tokens, parents, parent = [], [], -1
        for token in truth:
            decoy = self.wrong if token != self.wrong else self.wrong + 1
            tokens += [decoy, token]
            parents += [parent, parent]
            parent = len(tokens) - 1
        return DraftTree(torch.tensor(tokens), torch.tensor(parents))


@pytest.mark.parametrize("name", NAMES)
def test_oracle_tree_is_accepted_and_output_identical(name, vlm_cases):
    case = vlm_cases[name]
    reference = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=16, **case.inputs)
    out = assert_greedy_equal(case.model, OracleTreeDrafter(reference, wrong=5), case.input_ids, max_new_tokens=16,
                              reference=reference, tree=TREE, **case.inputs)
    # Every round but the last accepts the whole true path: depth + 1 tokens per target forward.
    assert out.stats.target_forwards <= 1 + -(-15 // (TREE.depth + 1))


@pytest.mark.parametrize("name", NAMES)
def test_text_only_drafter_tree_identical(name, vlm_cases, text_lm):
    case = vlm_cases[name]
    out = assert_greedy_equal(VisionTarget(case.model), TextOnlyDrafter(text_lm, case.model), case.input_ids,
                              max_new_tokens=16, reference=case.model.generate(case.input_ids, do_sample=False,
                                                                                max_new_tokens=16, **case.inputs),
                              tree=TREE, **case.inputs)
    assert out.stats.rounds > 0


@pytest.mark.parametrize("name", ["llava-image", "qwen2vl-image", "nextvideo-video"])
@pytest.mark.parametrize("seed", [0, 1])
def test_msd_tree_identical(name, seed, vlm_cases):
    case = vlm_cases[name]
    torch.manual_seed(seed)
    drafter = MSDDrafter(MSDDrafterModel.from_target_config(case.model.config.get_text_config()))
    out = assert_greedy_equal(case.model, drafter, case.input_ids, max_new_tokens=16, tree=TREE, **case.inputs)
    assert out.stats.drafter_forwards > 0


def test_oracle_control_wrong_path_is_caught(vlm_cases):
    """Control: an oracle shifted by one token proposes a path the target does not take; a rule accepting
    the eldest child regardless would have committed it, greedy_tree_match must not."""
    case = vlm_cases["qwen2vl-image"]
    reference = case.model.generate(case.input_ids, do_sample=False, max_new_tokens=16, **case.inputs)
    shifted = torch.cat([reference[:, 1:], reference[:, -1:]], dim=1)
    from mmspec.tree_rules import tree_verdict

    @declare_rule(TREE_RULE)
    def accept_second_child_chain(tree, logits, sampling, generator):
        path = [i for i in range(1, tree.size, 2)]
        return tree_verdict(path, logits[0, path[-1] + 1].argmax(-1) if path else logits[0, 0].argmax(-1))

    out = speculative_generate(case.model, OracleTreeDrafter(shifted, wrong=5), case.input_ids, max_new_tokens=16,
                               tree=TREE, rule=accept_second_child_chain, **case.inputs)
    assert not torch.equal(out.sequences, reference)


@pytest.mark.parametrize("name", ["llava-image", "qwen2vl-image", "nextvideo-video"])
@pytest.mark.parametrize("semi_ar_tokens", [1, 3])
def test_flash_tree_identical(name, semi_ar_tokens, vlm_cases):
    case = vlm_cases[name]
    torch.manual_seed(semi_ar_tokens)
    model = FlashDrafterModel.from_target_config(case.model.config.get_text_config(), num_queries=2,
                                               semi_ar_tokens=semi_ar_tokens).eval()
    drafter = FlashDrafter(model)
    out = assert_greedy_equal(case.model, drafter, case.input_ids, max_new_tokens=16, tree=TREE, **case.inputs)
    assert out.stats.rounds > 0 and out.stats.drafter_forwards > out.stats.rounds  # a forward per level, not one per round


@pytest.mark.slow
def test_caption_cli_tree_picks_flash_and_matches_the_chain_caption(capsys):
    """`mmspec caption --tree` without --method picks FLASH (the fastest tree); its caption is the chain's."""
    import json
    from pathlib import Path

    from mmspec.cli import main

    video = str(Path(__file__).parents[2] / "demos" / "assets" / "shapes.mp4")
    outputs = {}
    for extra in (["--tree", "8,2,6"], ["--method", "flash"]):
        assert main(["caption", video, "--json", "--threads", "1", *extra]) == 0
        outputs[extra[0]] = json.loads(capsys.readouterr().out)
    assert outputs["--tree"]["method"] == "flash"
    assert outputs["--tree"]["text"] == outputs["--method"]["text"]
