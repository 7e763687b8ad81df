"""bench vision on a tiny random LLaVA: every method identical to plain greedy, extras present."""

import torch

from mmspec.testing import tiny_llama
from mmspec.vision.bench import CaptionInput, bench_vision
from mmspec.vision.flash import FlashDrafterModel
from mmspec.vision.msd import MSDDrafterModel

from .test_sparse_to_dense import llava_inputs, tiny_llava  # noqa: F401 (fixture)


def inputs():
    items = []
    for seed in range(2):
        input_ids, pixel_values = llava_inputs(seed)
        items.append(CaptionInput(input_ids=input_ids, model_inputs={"pixel_values": pixel_values}))
    return items


def test_bench_vision_runs_and_checks_identity(tiny_llava):
    drafter = tiny_llama(vocab_size=100, num_layers=1, hidden_size=32, seed=7)
    report, extras = bench_vision(tiny_llava, inputs(), drafter=drafter, max_new_tokens=8, repeats=1,
                                  std_settings=((4, 3),), progress=False)
    rows = {r.name: r for r in report.results}
    assert set(rows) == {"plain-greedy", "text-only k=5", "std K=4 gamma=3"}
    assert all(r.identical for r in rows.values())
    assert extras["visual_tokens"] == 17
    assert 0.0 <= extras["visual_attention_share"] <= 1.0
    assert extras["modelled_memory_bound_speed_up"]["plain-greedy"] == 1.0


def test_bench_vision_feature_drafter_rows(tiny_llava):
    text = tiny_llava.config.get_text_config()
    torch.manual_seed(0)
    feature = {
        "msd": MSDDrafterModel.from_target_config(text).eval(),
        "flash": FlashDrafterModel.from_target_config(text, num_queries=4, semi_ar_tokens=2).eval(),
        "flash-ar1": FlashDrafterModel.from_target_config(text, num_queries=4, semi_ar_tokens=1).eval(),
    }
    report, extras = bench_vision(tiny_llava, inputs(), drafter=None, feature_drafters=feature, max_new_tokens=8,
                                  num_draft_tokens=4, repeats=1, std_settings=(), progress=False)
    rows = {r.name: r for r in report.results}
    assert set(rows) == {"plain-greedy", "msd k=4", "flash k=4", "flash-ar1 k=4"}
    assert all(r.identical for r in rows.values())
    # k = 4 drafts cost ceil(4 / n) FLASH forwards per round (+ the prefill forward).
    assert rows["flash k=4"].stats.drafter_forwards < rows["flash-ar1 k=4"].stats.drafter_forwards
    assert extras["feature_drafters"]["flash k=4"] == {"kind": "flash", "num_queries": 4, "semi_ar_tokens": 2,
                                                       "compress": True}
    assert all(v > 0 for v in extras["modelled_memory_bound_speed_up"].values())
    assert "flash k=4" in report.to_table()
