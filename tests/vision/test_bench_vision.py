"""bench vision on a tiny random LLaVA: every method identical to plain greedy, extras present."""

from mmspec.testing import tiny_llama
from mmspec.vision.bench import CaptionInput, bench_vision

from .test_sparse_to_dense import llava_inputs, tiny_llava  # noqa: F401 (fixture)


def test_bench_vision_runs_and_checks_identity(tiny_llava):
    items = []
    for seed in range(2):
        input_ids, pixel_values = llava_inputs(seed)
        items.append(CaptionInput(input_ids=input_ids, model_inputs={"pixel_values": pixel_values}))
    drafter = tiny_llama(vocab_size=100, num_layers=1, hidden_size=32, seed=7)
    report, extras = bench_vision(tiny_llava, items, drafter=drafter, max_new_tokens=8, repeats=1,
                                  std_settings=((4, 3),), progress=False)
    rows = {r.name: r for r in report.results}
    assert set(rows) == {"plain-greedy", "text-only k=5", "std K=4 gamma=3"}
    assert all(r.identical for r in rows.values())
    assert extras["visual_tokens"] == 17
    assert 0.0 <= extras["visual_attention_share"] <= 1.0
    assert extras["modelled_memory_bound_speed_up"]["plain-greedy"] == 1.0
