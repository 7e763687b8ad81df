"""Folder mode: run a verb over every file of a folder into one JSON-lines file, resumable, on one or many processes.

    mmspec caption videos/ --out captions.jsonl
    accelerate launch --multi_gpu --num_processes 2 -m mmspec caption videos/ --out captions.jsonl   # CPU too
    torchrun --nproc_per_node 2 -m mmspec caption videos/ --out captions.jsonl

One line per file (`{"file": NAME, ..., "error": null}` or `{"file": NAME, "error": MESSAGE}`, each with the
file's `"source"`: resolved path, size, modification time), written and fsync'd as soon as that file
finishes; a re-run skips files already recorded with the same source (another folder's file of the same
name, or a file changed since, runs again; `--retry-failed`: the failed ones too). Under a distributed
launcher (WORLD_SIZE > 1) accelerate's `PartialState` splits the files left to do between the processes;
each appends to its own part file and the main process merges the parts into the results file, ordered by
file name, so the result equals a one-process run.

`--batch-size N` decodes the files N at a time (`records_for` of the verb): each file is loaded on its own
first, so one that fails to load is an error line and the others still decode together; a batch that fails
as a whole is run again file by file, so its one bad file gets the error line. A batch's lines are written
when it finishes (a kill loses at most the batch in flight).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import batch_files
from ..errors import MMSpecError
from . import outputs, worker_watch

VIDEO_SUFFIXES = {".mp4", ".m4v", ".mkv", ".mov", ".avi", ".webm", ".mpg", ".mpeg", ".ts", ".flv", ".wmv", ".3gp", ".ogv"}


def file_or_folder(text: str) -> str:
    """argparse type: an existing, readable file or folder."""
    from . import checks

    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(checks.not_found(text))
    if checks.not_regular(text):
        raise argparse.ArgumentTypeError(checks.not_regular(text))
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (permission denied)")
    return text


Records = Callable[[list[Path]], list["dict[str, Any] | Exception"]]  # a record, or the file's error, per file


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_batch_size_flag(parser)
    parser.add_argument("--out", default=None, metavar="FILE.jsonl",
                        help="results file, one JSON line per input file; required for a folder. Resumable: a re-run "
                             "skips files already in it")
    parser.add_argument("--retry-failed", action="store_true",
                        help="with --out: run again the files whose line records an error")


def add_batch_size_flag(parser: argparse.ArgumentParser) -> None:
    from . import checks

    parser.add_argument("--batch-size", type=checks.positive_int, default=1, metavar="N",
                        help="with a folder: decode N files at a time in one left-padded batch (default 1: one by one); "
                             "the method must decode batches")


class FolderRun:
    """The files to run and where their records go; built before any model loads, so bad input fails fast."""

    def __init__(self, files: list[Path], out: Path, retry_failed: bool) -> None:
        self.files, self.out, self.retry_failed = files, out, retry_failed
        self.names = [f.name for f in files]
        self.sources = {f: source_of(f) for f in files}
        # Under a launcher, a heartbeat from now on (before the model loads): the others' waits stay bounded.
        self._size, self._rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        self._heartbeat = None
        if self._size > 1:
            self._heartbeat = worker_watch.Heartbeat(worker_watch.heartbeat_path(out, self._rank),
                                                     min(5.0, worker_watch.timeout() / 4)).start()

    def recorded(self, path: Path, done: dict[str, dict[str, Any]]) -> bool:
        """Whether `done` holds this very file: its name, and (records written since they carry one) its resolved path,
        size and modification time, so a results file of another folder with the same names skips nothing."""
        record = done.get(path.name)
        if record is None or ("source" in record and record["source"] != self.sources[path]):
            return False
        return not (self.retry_failed and record.get("error") is not None)

    def _wait(self, wait: Callable[[], Any], what: str) -> Any:
        """`wait()` for the other processes, given up with one line naming any that stays silent."""
        if self._heartbeat is None:
            return wait()
        peers = {rank: worker_watch.heartbeat_path(self.out, rank) for rank in range(self._size) if rank != self._rank}
        return worker_watch.watched(wait, peers, self._size, what)

    def run(self, record_for: Callable[[Path], dict[str, Any]], verb: str = "processed", as_json: bool = False,
            batch_size: int = 1, records_for: Records | None = None) -> int:
        """Run `record_for(path)` on every file not yet recorded; a file that raises is recorded with its error.

        With `batch_size` > 1, `records_for(paths)` runs `batch_size` files at a time instead (one record or
        exception per file; when it raises, its files run one by one through `record_for`).
        Returns the exit status: 0, or 2 if any file's record (new or earlier) is an error. `as_json`: also print
        a summary object on stdout (the results file, its number of files, the failed ones).
        """
        state = self._wait(_distributed_state, "for it to start")
        rank, size = (state.process_index, state.num_processes) if state else (0, 1)
        if rank == 0:  # leftovers of a killed run (a torn line, part files) are folded in before the work is split
            batch_files.merge(self.out, self.names)
        self._wait(lambda: _barrier(state), "to split the files")
        done = {r["file"]: r for r in batch_files.read_records(self.out)}
        todo = [f for f in self.files if not self.recorded(f, done)]
        if state is not None:
            with state.split_between_processes(todo) as share:
                mine = list(share)
        else:
            mine = todo
        skipped = len(self.files) - len(todo)
        if rank == 0 and skipped:
            print(f"mmspec: {skipped} of {len(self.files)} file(s) already in {self.out}; skipping them", file=sys.stderr)
        target = self.out if state is None else batch_files.part_path(self.out, rank)
        with batch_files.RecordWriter(target) as writer, _progress(mine, rank, size) as bar:
            if batch_size == 1 or records_for is None:
                for path in mine:
                    writer.write(self._sourced(_record(path, record_for), path))
                    bar.update(1)
            else:
                for start in range(0, len(mine), batch_size):
                    batch = mine[start:start + batch_size]
                    for path, record in zip(batch, _batch_records(batch, records_for, record_for)):
                        writer.write(self._sourced(record, path))
                    bar.update(len(batch))
        if size > 1:
            print(f"mmspec: process {rank} of {size} {verb} {len(mine)} file(s)", file=sys.stderr)
        self._wait(lambda: _barrier(state), "for its files to merge them")
        if rank == 0:
            records = batch_files.merge(self.out, self.names)
        self._wait(lambda: _barrier(state), "for the merge")  # every process exits with the merged result's status
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if rank != 0:
            records = batch_files.read_records(self.out)
        wanted = set(self.names)
        failed = [r["file"] for r in records if r["file"] in wanted and r.get("error") is not None]
        if rank == 0:
            print(f"mmspec: {verb} {len(self.files) - len(failed)} of {len(self.files)} file(s) into {self.out}"
                  + (f"; {len(failed)} failed ({', '.join(map(outputs.printable, failed))}): "
                     f"see their \"error\" in {self.out}" if failed else ""),
                  file=sys.stderr)
            if as_json:
                print(json.dumps({"out": str(self.out), "files": len(self.files), "failed": failed}, indent=2))
        return 2 if failed else 0

    def _sourced(self, record: dict[str, Any], path: Path) -> dict[str, Any]:
        return {**record, "source": self.sources[path]}


def source_of(path: Path) -> dict[str, Any]:
    """What identifies an input file beyond its name: its resolved path, size and modification time."""
    stat = path.stat()
    return {"path": os.fsdecode(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def plan(path: str, out: str | None, suffixes: set[str], retry_failed: bool = False) -> FolderRun | None:
    """A FolderRun for a folder (or for one file with --out), or None for one file printed to stdout."""
    source = Path(path)
    if not source.is_dir() and out is None:
        if retry_failed:
            raise MMSpecError("--retry-failed needs --out FILE.jsonl")
        return None
    if out is None:
        raise MMSpecError(f"a folder needs --out FILE.jsonl: one JSON line per file of {path!r} is written there")
    results = Path(out)
    if results.suffix.lower() != ".jsonl":
        raise MMSpecError(f"--out {out!r} needs the suffix .jsonl (one JSON line per input file)")
    if results.is_dir():
        raise MMSpecError(f"--out {out!r} is a folder; name a FILE.jsonl")
    if not results.parent.is_dir():
        raise MMSpecError(f"cannot write {out!r}: no folder {str(results.parent)!r}")
    outputs.check_file(out)  # /proc, a read-only mount: fails now, before any model loads
    if source.is_dir():
        files = batch_files.list_files(source, suffixes)
        if not files:
            raise MMSpecError(f"the folder {path!r} holds no input files ({', '.join(sorted(suffixes))})")
    else:
        files = [source]
    outputs.refuse_inputs(results, files)
    batch_files.read_records(results)  # a results file that is not ours fails now, before any model loads
    return FolderRun(files, results, retry_failed)


def _record(path: Path, record_for: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"file": path.name, **record_for(path), "error": None}
    except MMSpecError as error:
        message = str(error)
    except Exception as error:  # noqa: BLE001 - one file's failure (a decoder's, torch's) must not stop the others
        message = f"{type(error).__name__}: {error}"
    from tqdm.auto import tqdm

    tqdm.write(f"mmspec: error: {outputs.printable(path.name)}: {message}", file=sys.stderr)  # on its own line, above the progress bar
    return {"file": path.name, "error": message}


def _batch_records(paths: list[Path], records_for: Records, record_for: Callable[[Path], dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of one batch of files; a batch that fails as a whole runs again file by file."""
    try:
        results = records_for(paths)
    except Exception:  # noqa: BLE001 - which file broke the batch is found by running them alone
        return [_record(path, record_for) for path in paths]
    return [_record(path, lambda _path, result=result: _raise_or_return(result)) for path, result in zip(paths, results)]


def _raise_or_return(result: "dict[str, Any] | Exception") -> dict[str, Any]:
    if isinstance(result, Exception):
        raise result
    return result


def _progress(files: list[Path], rank: int, size: int) -> Any:
    from tqdm.auto import tqdm

    label = "files" if size == 1 else f"files (process 0 of {size})"
    return tqdm(total=len(files), desc=label, unit="file", file=sys.stderr, disable=rank != 0 or not files,
                dynamic_ncols=True)


def _distributed_state() -> Any:
    """accelerate's PartialState under a distributed launcher (WORLD_SIZE > 1), else None (no process group)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    from accelerate import PartialState

    # cpu=True: the processes only meet at barriers (gloo), whatever device the pipelines run on.
    return PartialState(cpu=True)


def _barrier(state: Any) -> None:
    if state is not None:
        state.wait_for_everyone()
