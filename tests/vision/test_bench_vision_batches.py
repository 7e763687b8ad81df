"""`bench vision --batch-size`: plain batched generate vs the caption pipeline's methods that batch, per batch size
(tiny random LLaVA-NeXT-Video from test_pipeline.py; the report's shape and identical outputs, not speed)."""

import json

import pytest

from mmspec.cli import main
from mmspec.vision.bench import bench_vision_batches
from mmspec.vision.recipes import captioner_data as cd
from mmspec.zoo import entries

from .test_pipeline import pipe, tiny_captioner_folder  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow  # bench tables over batch sizes


@pytest.fixture(scope="module")
def videos():
    from mmspec.world import examples, render_video

    return [render_video(scene, num_frames=cd.FRAMES, size=cd.FRAME_SIZE) for scene, _ in examples(3, seed=5, split="heldout")]


def test_every_batching_method_is_identical_to_plain_batched_generate(pipe, videos):  # noqa: F811
    report = bench_vision_batches(pipe, videos, (1, 2), max_new_tokens=6, num_draft_tokens=3, repeats=1, progress=False)
    data = json.loads(report.to_json())
    assert set(data["batch_sizes"]) == {"1", "2"}
    for size, result in data["batch_sizes"].items():
        methods = {m["method"]: m for m in result["methods"]}
        assert {"plain-batched", "mmspec-ar", "mmspec-text"} <= set(methods)
        assert set(methods) == {"plain-batched", *(f"mmspec-{m}" for m in pipe.batching_methods())}
        assert all(m["identical_to_reference"] for m in methods.values()), methods
        assert {m["new_tokens"] for m in methods.values()} == {6 * len(videos)}
        assert result["settings"]["batch_size"] == int(size) and result["settings"]["videos"] == len(videos)
    table = report.to_table()
    assert table.splitlines()[1].split()[0] == "batch" and "mmspec-text tok/s" in table


def test_a_wrong_method_is_caught(pipe, videos, monkeypatch):  # noqa: F811
    """The control: a method whose rows come back in the wrong order is reported as not identical."""
    from mmspec.bench import batches

    real = batches.mmspec_batched

    def swapped(decoder, max_new_tokens):
        run = real(decoder, max_new_tokens)

        def wrong(batch):
            tokens, stats = run(batch)
            half = len(tokens) // batch[0].shape[0]
            return tokens[half:] + tokens[:half], stats
        return wrong

    monkeypatch.setattr(batches, "mmspec_batched", swapped)
    report = bench_vision_batches(pipe, videos, (2,), max_new_tokens=6, num_draft_tokens=3, repeats=1, progress=False)
    assert not any(r.identical for r in report.reports[2].results if r.name != "plain-batched")


@pytest.mark.skipif("shapes-video-captioner" not in {e.name for e in entries()}, reason="needs the zoo")
def test_cli_json(capsys):
    code = main(["bench", "vision", "--batch-size", "1,2", "--num-samples", "2", "--max-new-tokens", "4", "--repeats", "1",
                 "--threads", "1", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert set(result["batch_sizes"]) == {"1", "2"}
    for size in result["batch_sizes"].values():
        assert size["reference"] == "plain-batched"
        assert {"mmspec-ar", "mmspec-text"} <= {m["method"] for m in size["methods"]}
        assert all(m["identical_to_reference"] for m in size["methods"])
