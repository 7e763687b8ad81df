"""The demo's round view: each round's accepted drafts and target token, as text that reads as the output."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmspec.demo import rounds as R
from mmspec.pipelines import RoundInfo

VIDEO = Path(__file__).resolve().parents[2] / "demos" / "assets" / "shapes.mp4"


def letters(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def test_segments_label_drafts_corrections_and_own_tokens():
    rounds = [
        RoundInfo(tokens=[0], drafted=0, accepted=0, new_tokens=1),  # the prefill's token
        RoundInfo(tokens=[1, 2, 3], drafted=2, accepted=2, new_tokens=4),  # all drafts kept, bonus token
        RoundInfo(tokens=[4, 5], drafted=3, accepted=1, new_tokens=6),  # one kept, then a correction
    ]
    views = R.round_views(rounds, letters)
    assert R.highlighted(views) == [("a", R.OWN), ("bc", R.DRAFT), ("d", R.OWN), ("e", R.DRAFT), ("f", R.CORRECTION)]
    assert R.table_rows(views)[2] == [2, 3, 1, 2, "e", "e", "", "f"]  # no proposal reported: no rejected text


def test_rejected_drafts_show_before_the_correction_that_replaced_them():
    rounds = [
        RoundInfo(tokens=[0], drafted=0, accepted=0, new_tokens=1),
        RoundInfo(tokens=[1, 2, 3], drafted=2, accepted=2, new_tokens=4, proposed=[1, 2]),  # all kept, bonus token
        RoundInfo(tokens=[4, 5], drafted=3, accepted=1, new_tokens=6, proposed=[4, 9, 8]),  # "e" kept, "ji" rejected
    ]
    views = R.round_views(rounds, letters)
    assert R.highlighted(views) == [("a", R.OWN), ("bc", R.DRAFT), ("d", R.OWN), ("e", R.DRAFT), ("ji", R.REJECTED),
                                    ("f", R.CORRECTION)]
    assert R.table_rows(views)[2] == [2, 3, 1, 2, "eji", "e", "ji", "f"]
    assert R.table_rows(views)[1][R.REJECTED_COLUMN] == ""
    # The rejected drafts are not part of the output: the other segments read as it.
    assert "".join(text for text, label in R.highlighted(views) if label != R.REJECTED) == letters(range(6))


def test_chunks_restart_decoding_and_join_with_a_space():
    rounds = [RoundInfo(tokens=[0, 1], drafted=1, accepted=1, new_tokens=2, chunk=0),
              RoundInfo(tokens=[2], drafted=0, accepted=0, new_tokens=3, chunk=1)]
    assert R.highlighted(R.round_views(rounds, letters)) == [("a", R.DRAFT), ("b", R.OWN), (" ", None), ("c", R.OWN)]


def test_round_text_reads_as_the_pipelines_caption():
    from mmspec import CaptionPipeline

    pipe = CaptionPipeline.from_pretrained("shapes-video-captioner")
    seen: list[RoundInfo] = []
    out = pipe(video=str(VIDEO), method="text", max_new_tokens=12, progress_bar=False,
               callback_on_round=lambda _i, info: seen.append(info))

    def decode(ids: list[int]) -> str:
        return pipe.processor.tokenizer.decode(ids, skip_special_tokens=True)

    segments = [(text, label) for text, label in R.highlighted(R.round_views(seen, decode)) if label != R.REJECTED]
    assert "".join(text for text, _ in segments).strip() == out.text
    assert sum(1 for _, label in segments if label == R.DRAFT) <= out.stats.rounds
    # Control: rounds of another call do not read as this caption.
    other: list[RoundInfo] = []
    pipe(video=str(VIDEO), method="text", max_new_tokens=4, progress_bar=False,
         callback_on_round=lambda _i, info: other.append(info))
    assert "".join(t for t, label in R.highlighted(R.round_views(other, decode)) if label != R.REJECTED).strip() != out.text


def test_step_map_places_rounds_at_their_positions():
    pytest.importorskip("gradio")
    from mmspec.demo.image_tab import round_spans, step_map

    rounds = [RoundInfo(tokens=[7], drafted=0, accepted=0, new_tokens=1, chunk=0, position=0),
              RoundInfo(tokens=[7, 7, 7], drafted=3, accepted=2, new_tokens=4, chunk=0, position=1),
              RoundInfo(tokens=[7, 7], drafted=4, accepted=1, new_tokens=6, chunk=0, position=4),
              RoundInfo(tokens=[7, 7, 7], drafted=3, accepted=3, new_tokens=9, chunk=0, position=6)]
    assert step_map(round_spans(rounds), (3, 3)).tolist() == [[0, 1, 1], [1, 2, 2], [3, 3, 3]]
    # Rounds of a second image (chunk 1) are not drawn on the first one's map.
    second = [RoundInfo(tokens=[7] * 9, drafted=8, accepted=8, new_tokens=18, chunk=1, position=0)]
    assert step_map(round_spans(rounds + second), (3, 3)).tolist() == [[0, 1, 1], [1, 2, 2], [3, 3, 3]]


def test_step_map_refuses_rounds_that_do_not_fill_the_image():
    pytest.importorskip("gradio")
    from mmspec.demo.image_tab import step_map
    from mmspec.errors import MMSpecError

    with pytest.raises(MMSpecError, match="committed 4 of the image's 9 tokens"):
        step_map([(0, 1), (1, 3)], (3, 3))


@pytest.mark.slow
def test_step_map_of_a_real_image_has_one_step_per_target_forward():
    pytest.importorskip("gradio")
    from mmspec import ImagePipeline
    from mmspec.demo.image_tab import round_spans, step_map

    pipe = ImagePipeline.from_pretrained("shapes-image-ar")
    seen: list[RoundInfo] = []
    out = pipe(prompt=pipe.class_names[0], method="sjd", seed=3, progress_bar=False,
               callback_on_round=lambda _i, info: seen.append(info))
    grid = tuple(out.tokens.shape[-2:])
    steps = step_map(round_spans(seen), grid)
    assert int(steps.max()) + 1 == out.stats.target_forwards < grid[0] * grid[1]  # several tokens per forward
    # The rounds' tokens, put where the map says, are the image's tokens.
    rebuilt = [0] * (grid[0] * grid[1])
    for info in seen:
        rebuilt[info.position:info.position + len(info.tokens)] = info.tokens
    assert rebuilt == out.tokens[0].flatten().tolist()
    # Each round's proposal (the Jacobi iterate's drafted image tokens) begins with the tokens it kept.
    for info in seen:
        assert len(info.proposed) == info.drafted and info.proposed[:info.accepted] == info.tokens[:info.accepted]
    assert any(info.accepted > 0 for info in seen)
