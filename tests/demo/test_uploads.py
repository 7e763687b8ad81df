"""What the demo accepts: one clear message for a missing, empty or oversized upload."""

from __future__ import annotations

import pytest

from mmspec.demo.uploads import MAX_UPLOAD_MB, checked_upload, page_message
from mmspec.errors import MMSpecError


def test_bad_uploads_get_one_clear_message(tmp_path):
    with pytest.raises(MMSpecError, match="no video given"):
        checked_upload(None, "video")
    empty = tmp_path / "empty.mp4"
    empty.touch()
    with pytest.raises(MMSpecError, match=r"'empty.mp4' is empty \(0 bytes\)"):
        checked_upload(str(empty), "video")
    big = tmp_path / "big.flac"
    with big.open("wb") as handle:
        handle.truncate(MAX_UPLOAD_MB * 2**20 + 1)
    with pytest.raises(MMSpecError, match=f"the limit is {MAX_UPLOAD_MB} MB"):
        checked_upload(str(big), "audio")
    with pytest.raises(MMSpecError, match="upload it again"):
        checked_upload(str(tmp_path / "gone.mp4"), "video")
    fine = tmp_path / "fine.mp4"
    fine.write_bytes(b"x")
    assert checked_upload(str(fine), "video") == str(fine)  # control: a non-empty file under the limit passes


def test_page_messages_name_the_file_not_the_servers_temporary_path():
    path = "/tmp/gradio/0a1b/clip.mp4"
    assert page_message(MMSpecError(f"cannot read video {path!r}: bad data"), path) == "cannot read video 'clip.mp4': bad data"
