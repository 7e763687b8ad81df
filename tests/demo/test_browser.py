"""The demo in a real browser: Debian's headless Chromium, driven by Playwright, against `mmspec demo` on a free port.

Each tab runs on the sample assets with small settings; the text the page shows must equal what the
public pipeline returns for the same input, method and seed. A corrupt upload must give one clear
message, and the app must go on serving. Screenshots go to `$MMSPEC_DEMO_SCREENSHOTS` (else a
temporary folder); the README's are copied from there.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mmspec.demo.rounds import REJECTED_COLUMN

pytest.importorskip("gradio")
sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
ASSETS = Path(__file__).resolve().parents[2] / "demos" / "assets"
VIDEO = ASSETS / "shapes.mp4"
# A held-out clip of the default ASR model on which its drafter is corrected (so the table has rejected drafts).
# A clip where the fast decoder has drafts rejected (the transcribe table's control).
AUDIO = Path(__file__).resolve().parents[2] / "mmspec" / "zoo" / "models" / "whisper-tiny.en" / "heldout" / "clip_00000.flac"
MAX_NEW_TOKENS = 16
CAPTION_TAB_TOKENS = 48  # long enough that MSD has drafts rejected on the sample video (the table's control)
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
CHOOSE_TRIES = 24  # a Dropdown's list, opened again until a choice holds (about two minutes at most)
RESULT_WAIT_MS = 240_000  # generous: a loaded CI machine may be slow; a passing run takes seconds per tab

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="Debian's chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(600),
    pytest.mark.slow,  # drives a real browser
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def results_file(tmp_path_factory):
    """The results file the app reads: a copy of `$MMSPEC_DEMO_BENCH_RESULTS` (real bench runs, for the README's
    screenshot) if set, else one written by the benches' own writer from a tiny side-by-side run of two trivial methods."""
    from mmspec.bench.harness import run_benchmark
    from mmspec.bench.results import recording
    from mmspec.stats import SpecStats

    path = tmp_path_factory.mktemp("bench") / "results.jsonl"
    real = os.environ.get("MMSPEC_DEMO_BENCH_RESULTS")
    if real:
        shutil.copyfile(real, path)
        return path

    def method(delay: float):
        def run(item: int) -> tuple[list[int], SpecStats]:
            time.sleep(delay)
            return [item], SpecStats(new_tokens=1, target_forwards=1)
        return run

    with recording("vision", "mmspec bench vision (browser-test run)", path=path):
        run_benchmark("t", {"plain-greedy": method(0.004), "msd": method(0.001)}, [1, 2], reference="plain-greedy",
                      repeats=1, warmup=0, progress=False)
    return path


@pytest.fixture(scope="module")
def server(results_file, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "MMSPEC_BENCH_RESULTS": str(results_file), "HF_HUB_OFFLINE": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp_path_factory.mktemp("gradio"))}
    log = tmp_path_factory.mktemp("server") / "server.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "mmspec", "demo", "--port", str(port), "--threads", "1"],
                                   stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"the demo did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
    yield url
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="module")
def browser_page(server, tmp_path_factory):
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(RESULT_WAIT_MS)
        yield page
        context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    chosen = os.environ.get("MMSPEC_DEMO_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_tab(page, url: str, name: str) -> None:
    page.goto(url)
    page.get_by_role("tab", name=name).click()


def choose(page, elem_id: str, option: str) -> None:
    """Pick `option` in a Dropdown. An update landing while the list is open (an upload finishing re-renders the
    form) can close it under the click, so open it again until the field shows the option."""
    field = page.locator(f"#{elem_id} input")
    item = page.get_by_role("option", name=option, exact=True)
    for _ in range(CHOOSE_TRIES):
        field.click()
        try:
            item.wait_for(state="visible", timeout=5_000)
            item.click(timeout=5_000)
        except sync_api.TimeoutError:
            continue
        if field.input_value() == option:
            return
    pytest.fail(f"could not choose {option!r} in #{elem_id} in {CHOOSE_TRIES} tries")


def fill_caption_form(page, url: str, video: Path, method: str, max_new_tokens: int) -> None:
    """Open the Caption tab, upload `video` and set the method and the token limit."""
    open_tab(page, url, "Caption")
    page.locator("#caption-video input[type=file]").set_input_files(str(video))
    page.locator("#caption-video video").wait_for()  # the upload has landed: the form no longer re-renders under us
    choose(page, "caption-method", method)
    page.locator("#caption-max-tokens input[type=number]").fill(str(max_new_tokens))
    page.locator("#caption-max-tokens input[type=number]").press("Enter")


def value_of(page, elem_id: str) -> str:
    """The text a Textbox shows, once it shows any."""
    box = page.locator(f"#{elem_id} textarea")
    page.wait_for_function("(el) => el.value.length > 0", arg=box.element_handle(), timeout=RESULT_WAIT_MS)
    return box.input_value()


def table_column(page, elem_id: str, column: int, rows: int) -> list[str]:
    """One column of a Dataframe's body, stripped, once the table shows `rows` rows (it fills in as rounds stream).
    Gradio draws the cells as `[data-row][data-col]` elements (its `<table>` is a hidden one for measuring)."""
    table = page.locator(f"#{elem_id}")
    table.locator(f'[data-row="{rows - 1}"][data-col="{column}"]').wait_for()
    assert table.locator(f'[data-row="{rows}"]').count() == 0, "the table shows more rows than the call had rounds"
    return [table.locator(f'[data-row="{row}"][data-col="{column}"]').inner_text().strip() for row in range(rows)]


def rejected_drafts_reported(pipe, decode, **call) -> list[str]:
    """Per round, the drafts the target rejected as the pipeline's callback reports them (its `proposed` ids past
    the kept ones), as text."""
    rounds = []
    pipe(**call, progress_bar=False, callback_on_round=lambda _i, info: rounds.append(info))
    return [decode(info.proposed[info.accepted:]).strip() for info in rounds]


def shoot(page, shots: Path, name: str) -> None:
    """A full-page screenshot, stored as a small palette PNG (the README shows these)."""
    from PIL import Image

    page.wait_for_timeout(300)  # let the last streamed update paint
    path = shots / name
    page.screenshot(path=str(path), full_page=True)
    with Image.open(path) as shot:
        small = shot.convert("RGB").resize((shot.width * 3 // 4, shot.height * 3 // 4), Image.LANCZOS).quantize(64)
    small.save(path, optimize=True)


@pytest.fixture(scope="module")
def captioner():
    from mmspec import CaptionPipeline

    return CaptionPipeline.from_pretrained("shapes-video-captioner")


@pytest.fixture(scope="module")
def recogniser():
    from mmspec import TranscriptionPipeline

    return TranscriptionPipeline.from_pretrained("whisper-tiny.en")


def test_corrupt_upload_gives_one_clear_message_and_the_app_keeps_serving(browser_page, server, tmp_path):
    page = browser_page
    corrupt = tmp_path / "broken.mp4"
    corrupt.write_bytes(b"\x00\x01 not a video at all " * 64)
    open_tab(page, server, "Caption")
    page.locator("#caption-video input[type=file]").set_input_files(str(corrupt))
    page.locator("#caption-run").click()
    message = page.get_by_text("cannot read video 'broken.mp4'")
    message.first.wait_for()
    assert "/tmp" not in message.first.inner_text()  # the server's temporary path is not shown
    # The server still answers: the same page, a good upload, a result.
    fill_caption_form(page, server, VIDEO, "ar", 4)
    page.locator("#caption-run").click()
    assert value_of(page, "caption-text")


def test_caption_tab_shows_what_the_pipeline_returns(browser_page, server, captioner, shots):
    page = browser_page
    fill_caption_form(page, server, VIDEO, "msd", CAPTION_TAB_TOKENS)
    page.locator("#caption-compare input").check()
    page.locator("#caption-run").click()
    shown = value_of(page, "caption-text")
    expected = captioner(video=str(VIDEO), method="msd", max_new_tokens=CAPTION_TAB_TOKENS, progress_bar=False)
    assert shown == expected.text
    # Control: the comparison tells captions apart (a shorter caption of the same video differs).
    assert shown != captioner(video=str(VIDEO), method="msd", max_new_tokens=4, progress_bar=False).text
    comparison = page.locator("#caption-compare-result")
    comparison.get_by_text("speed-up").wait_for()
    assert "same text: yes" in comparison.inner_text()  # msd is lossless
    stats = page.locator("#caption-stats").inner_text()
    assert f"tau {expected.stats.tau:.2f}" in stats and f"{expected.stats.target_forwards} target forwards" in stats
    # The rounds: accepted drafts, rejected drafts and target tokens, coloured.
    rounds = page.locator("#caption-rounds")
    assert "accepted draft" in rounds.inner_text() and "rejected draft" in rounds.inner_text()
    # The table's rejected drafts are those the pipeline's callback reports for the same call.
    tokenizer = captioner.processor.tokenizer
    reported = rejected_drafts_reported(captioner, lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
                                        video=str(VIDEO), method="msd", max_new_tokens=CAPTION_TAB_TOKENS)
    assert any(reported)  # control: some draft was rejected
    assert table_column(page, "caption-table", REJECTED_COLUMN, len(reported)) == reported
    shoot(page, shots, "demo-caption.png")


def test_a_sampled_caption_is_the_pipelines_for_the_same_seed(browser_page, server, captioner):
    page = browser_page
    fill_caption_form(page, server, VIDEO, "text", MAX_NEW_TOKENS)
    page.locator("#caption-temperature input[type=number]").fill("1.5")
    page.locator("#caption-seed input").fill("5")
    page.locator("#caption-run").click()
    shown = value_of(page, "caption-text")
    call = dict(video=str(VIDEO), method="text", max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=1.5,
                progress_bar=False)
    assert shown == captioner(**call, seed=5).text
    # Control: other seeds draw other captions (at least one of three differs from seed 5's).
    assert any(captioner(**call, seed=seed).text != shown for seed in (6, 7, 8))


def test_transcribe_tab_shows_what_the_pipeline_returns(browser_page, server, recogniser, shots):
    page = browser_page
    open_tab(page, server, "Transcribe")
    page.locator("#transcribe-audio input[type=file]").set_input_files(str(AUDIO))
    page.locator("#transcribe-compare input").check()
    page.locator("#transcribe-run").click()
    shown = value_of(page, "transcribe-text")
    expected = recogniser(str(AUDIO), method="hybrid", progress_bar=False)
    assert shown == expected.text
    assert shown != recogniser(str(AUDIO), method="hybrid", max_new_tokens=3, progress_bar=False).text  # control
    page.locator("#transcribe-compare-result").get_by_text("speed-up").wait_for()
    assert "same text: yes" in page.locator("#transcribe-compare-result").inner_text()  # strict hybrid is lossless
    table = page.locator("#transcribe-table").inner_text()
    assert "kept" in table and "rejected draft text" in table
    # The fast decoder's rejected drafts, as the page shows them, are those the pipeline's callback reports.
    def decode(ids: list[int]) -> str:
        return recogniser.tokenizer.decode(ids, skip_special_tokens=True)

    reported = rejected_drafts_reported(recogniser, decode, audio=str(AUDIO), method="hybrid")
    assert any(reported)  # control: the fast decoder's draft was corrected somewhere
    shown_rejected = table_column(page, "transcribe-table", REJECTED_COLUMN, len(reported))
    assert shown_rejected == reported
    corrections = table_column(page, "transcribe-table", REJECTED_COLUMN + 1, len(reported))
    assert all(c != r for c, r in zip(corrections, reported) if r)  # a correction is not the draft it replaced
    shoot(page, shots, "demo-transcribe.png")


def test_image_tab_shows_an_image_and_its_step_compression(browser_page, server, shots):
    from mmspec import ImagePipeline
    from mmspec.demo.image_tab import reports_rounds

    page = browser_page
    open_tab(page, server, "Image")
    choose(page, "image-method", "sjd")
    page.locator("#image-seed input").fill("3")
    page.locator("#image-run").click()
    stats = page.locator("#image-stats")
    stats.get_by_text("step compression").wait_for()
    page.locator("#image-output img").wait_for()
    pipe = ImagePipeline.from_pretrained("shapes-image-ar")
    expected = pipe(prompt=pipe.class_names[0], method="sjd", seed=3, progress_bar=False).stats
    assert f"{expected.new_tokens} image tokens in {expected.target_forwards} target forwards" in stats.inner_text()
    assert reports_rounds(pipe)
    page.locator("#image-steps img").wait_for()  # the map of the forward that committed each token
    shoot(page, shots, "demo-image.png")


def test_bench_tab_reads_the_results_file(browser_page, server, results_file, shots):
    from mmspec.bench.results import latest_results

    page = browser_page
    open_tab(page, server, "Bench")
    latest = latest_results(results_file)
    assert latest
    notes = page.locator("#bench-notes")
    for record in latest.values():
        notes.get_by_text(record["command"]).wait_for()
    table = page.locator("#bench-table").inner_text()
    for modality, record in latest.items():
        page.locator(f"#bench-chart-{modality}").wait_for()  # one chart per modality with results
        for row in record["methods"]:
            assert row["method"] in table and f"{round(row['speed_up'], 2):g}" in table
    shoot(page, shots, "demo-bench.png")
