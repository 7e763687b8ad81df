"""A JSON-lines results file that survives a killed run: one record per input file, keyed by `"file"`.

Each record is written as one line and flushed to disk (`fsync`) as soon as its file finishes, so a
run killed at any moment keeps every finished line; the only damage a kill can do is a half-written
last line (no newline yet), which `read_records` drops and `repair` cuts off before appending again.
Several processes each append to their own part file; `merge` folds the parts into the one results
file, ordered like the input files, atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .errors import MMSpecError


def list_files(folder: Path, suffixes: Iterable[str]) -> list[Path]:
    """The files of `folder` (not its sub-folders) with one of `suffixes`, sorted by name: the order of every output."""
    allowed = {s.lower() for s in suffixes}
    return sorted((f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in allowed), key=lambda f: f.name)


def _complete_lines(path: Path) -> tuple[list[bytes], int]:
    """The file's newline-terminated lines and the byte length they cover (a torn last line is left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    except OSError as error:
        raise MMSpecError(f"cannot read {str(path)!r}: {error.strerror or error}") from None
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(), end


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a results file in file order (none if it does not exist); a half-written last line is dropped."""
    records = []
    for number, line in enumerate(_complete_lines(path)[0], 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("file"), str):
            raise MMSpecError(f"line {number} of {str(path)!r} is not a results record (a JSON object with a \"file\"); "
                              "remove that line, or write to another file")
        records.append(record)
    return records


def repair(path: Path) -> bool:
    """Cut a half-written last line (left by a killed run) off the file; True if there was one."""
    if not path.exists():
        return False
    _, end = _complete_lines(path)
    if end == path.stat().st_size:
        return False
    with open(path, "r+b") as handle:
        handle.truncate(end)
        os.fsync(handle.fileno())
    return True


def record_line(record: dict[str, Any]) -> str:
    """One JSON line; names that are not UTF-8 (a file name's undecodable bytes, kept as surrogates by
    `os.fsdecode`) are written as \\u escapes, which read back to the same name."""
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record)
    return line + "\n"


class RecordWriter:
    """Appends records to a results file, one line each, on disk (`fsync`) before `write` returns."""

    def __init__(self, path: Path) -> None:
        repair(path)
        self.path = path
        self.handle = open(path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.handle.write(record_line(record))
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def ordered(records: Iterable[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """One record per file, the latest one winning, ordered like `order`; files not in `order` follow in first-seen order."""
    latest: dict[str, dict[str, Any]] = {}
    for record in records:
        latest.pop(record["file"], None)  # re-insert: a replaced record moves to where its replacement came
        latest[record["file"]] = record
    rank = {name: index for index, name in enumerate(order)}
    unknown = len(order)
    return sorted(latest.values(), key=lambda r: rank.get(r["file"], unknown))  # stable: unknown files keep their order


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the results file with `records`, atomically (a temporary file beside it, fsync, rename)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".merging")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.writelines(record_line(r) for r in records)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, output_mode(path))  # mkstemp's 0600 would hide the results from the user's group
        os.replace(temporary, path)
    except OSError as error:
        raise MMSpecError(f"cannot write {str(path)!r}: {error.strerror or error}") from None
    finally:
        Path(temporary).unlink(missing_ok=True)


def output_mode(path: Path) -> int:
    """The mode a plain `open(path, "w")` leaves: the file's own permissions if it exists, else 0666 less the umask
    (a temporary file renamed over `path` would otherwise keep mkstemp's 0600)."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def part_path(path: Path, index: int) -> Path:
    """Process `index`'s part file, hidden beside the results file."""
    return path.with_name(f".{path.name}.part-{index}")


def part_files(path: Path) -> list[Path]:
    """Every part file beside the results file (a killed run of any number of processes may have left some)."""
    return sorted(path.parent.glob(f".{path.name}.part-*"), key=lambda p: p.name)


def merge(path: Path, order: list[str]) -> list[dict[str, Any]]:
    """Fold every part file into the results file, ordered like `order`, then delete the parts; returns the records.

    The results file is rewritten only if its lines change, and is complete on disk before any part is deleted,
    so a kill during the merge loses nothing.
    """
    parts = part_files(path)
    current = read_records(path)
    records = ordered([*current, *(r for part in parts for r in read_records(part))], order)
    if records != current or (path.exists() and _complete_lines(path)[1] != path.stat().st_size):
        write_records(path, records)
    for part in parts:
        part.unlink(missing_ok=True)
    return records
