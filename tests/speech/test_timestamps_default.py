"""timestamps=None (`mmspec transcribe`'s default): a recording of more than one window decodes with timestamps, a clip
of one window exactly as without them; lists in batches and the compiled path take None as False."""

import json

import pytest

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.speech.audio import load_audio
from mmspec.speech.pipeline import TranscriptionPipeline

from .conftest import MAX_NEW
from .test_long_audio_packing import bursts, ending_folder  # noqa: F401 - fixtures

RATE = 16000


def tokens(out):
    return [c.tokens for c in out.chunks]


def test_none_means_timestamps_from_the_second_window(ending_folder, bursts):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    settings = dict(method="ar", max_new_tokens=MAX_NEW, progress_bar=False)
    auto, stamped, plain = (pipe(bursts, timestamps=t, **settings) for t in (None, True, False))
    assert len(auto.chunks) > 1 and tokens(auto) == tokens(stamped) != tokens(plain)
    clip = load_audio(bursts)[: int(RATE * pipe.chunk_seconds * 0.9)]
    one = {t: pipe(clip, sampling_rate=RATE, silence_threshold=None, timestamps=t, **settings) for t in (None, True, False)}
    assert len(one[None].chunks) == 1 and tokens(one[None]) == tokens(one[False]) and one[None].text == one[False].text
    assert tokens(one[True]) != tokens(one[False])  # the switch is what keeps the one-window clip unchanged
    listed = pipe([bursts, bursts], batch_size=2, timestamps=None, **settings)
    assert [tokens(o) for o in listed] == [tokens(plain)] * 2


def test_none_is_checked_like_the_others(ending_folder, bursts):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    with pytest.raises(MMSpecError, match="timestamps must be True, False or None"):
        pipe(bursts, timestamps=1, progress_bar=False)


def test_the_cli_decodes_long_recordings_with_timestamps_by_default(ending_folder, bursts, capsys):  # noqa: F811
    pipe = TranscriptionPipeline.from_pretrained(ending_folder)
    settings = dict(method="ar", max_new_tokens=MAX_NEW, progress_bar=False)
    expected = {None: pipe(bursts, timestamps=True, **settings).text, False: pipe(bursts, **settings).text}
    assert expected[None] != expected[False]
    texts = {}
    for flags in ([], ["--timestamps"], ["--no-timestamps"]):
        assert main(["transcribe", str(bursts), "--model", str(ending_folder), "--method", "ar", "--max-new-tokens",
                     str(MAX_NEW), "--format", "json", *flags]) == 0
        texts[tuple(flags)] = json.loads(capsys.readouterr().out)["text"]
    assert texts[()] == texts[("--timestamps",)] == expected[None]
    assert texts[("--no-timestamps",)] == expected[False]
