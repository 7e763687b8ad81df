"""Long audio: where the speech is, which windows the encoder reads, and how overlapping windows are stitched.

Whisper reads 30 s at a time. A long recording is cut in two steps:

1. Speech regions (`speech_regions`): frames of 20 ms whose RMS is above a threshold (the larger of
   the silence threshold and twice the recording's quietest-decile level, so steady background
   noise does not count as speech, but at most half its loudest-decile level, so a steady sound is
   all kept); loud runs closer than `min_gap_s` (0.5 s) are joined, and each
   region is padded by `pad_s` (0.2 s) on both sides, since word onsets and endings are quiet. A pause
   of at least 0.5 s is a natural cut: nothing is lost there, and each region becomes one segment
   with real start and end times (the subtitles' cues).
   A region longer than `max_region_s` (the pipeline passes half the window, 15 s for Whisper) is
   split at its quietest 0.2 s, when that is a real dip (under a quarter of the region's median
   level), and its parts likewise: greedy Whisper without timestamps tends to stop after the first
   sentences of a full 30 s window of continuous speech, and shorter cues read better.
2. Windows (`plan_windows`): a region that fits the model's window is one window. A longer one is
   read in overlapping windows, as transformers' ASR pipeline does with `chunk_length_s` and
   `stride_length_s`: windows of `window_s` every `window_s - 2 * stride_s` seconds (stride 5 s for
   Whisper's 30 s, transformers' default of a sixth). Each window is decoded on its own, then
   consecutive token sequences are stitched where they agree (`stitch`): the best-matching
   alignment of the previous window's tail with the next window's head (at least two equal tokens),
   cut in its middle, so the words at a window edge, which Whisper may garble, come from the window
   that heard them whole. When no alignment matches, both are kept whole.

3. Packing (`pack_windows`): neighbouring regions that each fit one window are read together, their samples
   back to back (the pauses between them left out), as long as the packed audio lasts at most `pack`
   samples (the pipeline's default: the whole window, 30 s). This is the composition faster-whisper's VAD
   path uses (`collect_chunks` joins its speech chunks up to `chunk_length` before they are encoded): a
   25-minute talk cut into hundreds of short regions is then a few dozen windows, each encoded and
   decoded once, instead of one padded 30 s window per region. What the model sees changes: several
   regions, each with its 0.2 s of padding, in one window instead of each alone, so the text can differ
   from region-by-region reading. A packed window is one segment; its times are the original timeline's,
   from its first region's start to its last region's end (the silences between them included).
   A packed window whose transcript looks like a decoding loop (`looks_looped`: it reaches the token
   limit without end-of-text, or its text compresses more than `COMPRESSION_RATIO_THRESHOLD`, the
   ratio Whisper and faster-whisper treat as a failed decoding) is read again region by region
   (`Window.unpacked`): greedy Whisper without timestamps sometimes repeats itself on longer windows,
   and a region alone rarely does. The choice depends only on the packed window's greedy transcript,
   so it is the same for every exact method.

Decoding within each window is whatever the pipeline's method does (greedy, or hybrid strict,
which equals greedy window by window); stitching only chooses which window's tokens to keep.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

FRAME_S = 0.02
MIN_GAP_S = 0.5
PAD_S = 0.2
DIP_FRAMES = 10  # 0.2 s: the shortest stretch that counts as a pause inside a long region
DIP_RATIO = 0.25
STRIDE_FRACTION = 1 / 6  # transformers' ASR pipeline: stride_length_s defaults to chunk_length_s / 6
BLOCK_FRAMES = 1 << 14  # frames per block when measuring loudness: bounded temporary memory on long files
COMPRESSION_RATIO_THRESHOLD = 2.4  # Whisper's and faster-whisper's default: a text compressing more is a loop


@dataclass(frozen=True)
class Window:
    """Samples [start, end) read by the encoder; `owned_start` / `owned_end` is the part whose words this
    window reports when stitched (without the overlap given to its neighbours); `region` is its speech region
    (a packed window's first). `pieces`: for a packed window, the regions' sample ranges read back to back;
    empty for a window that reads [start, end) as it is."""

    start: int
    end: int
    owned_start: int
    owned_end: int
    region: int
    pieces: tuple[tuple[int, int], ...] = ()

    def samples(self, audio: np.ndarray) -> np.ndarray:
        """The samples this window reads from `audio` (a packed window's pieces joined without their pauses)."""
        if not self.pieces:
            return audio[self.start : self.end]
        return np.concatenate([audio[start:end] for start, end in self.pieces])

    def unpacked(self) -> list[Window]:
        """A packed window's regions as windows of their own (packed regions are consecutive: region, region + 1, ...);
        [self] for a window that is not packed."""
        if not self.pieces:
            return [self]
        return [Window(start, end, start, end, self.region + k) for k, (start, end) in enumerate(self.pieces)]

    @property
    def length(self) -> int:
        """Samples the encoder reads (a packed window: its pieces' total)."""
        return sum(end - start for start, end in self.pieces) if self.pieces else self.end - self.start


def frame_rms(audio: np.ndarray, frame: int) -> np.ndarray:
    """RMS of consecutive frames (the last one partial), computed block by block without a full-length temporary."""
    count = -(-audio.shape[0] // frame)
    out = np.empty(count, dtype=np.float32)
    for first in range(0, count, BLOCK_FRAMES):
        last = min(count, first + BLOCK_FRAMES)
        block = audio[first * frame : last * frame].astype(np.float64)
        whole = (last - first) if block.shape[0] == (last - first) * frame else (last - first - 1)
        if whole:
            out[first : first + whole] = np.sqrt(np.mean(np.square(block[: whole * frame].reshape(whole, frame)), axis=1))
        if whole < last - first:
            out[last - 1] = np.sqrt(np.mean(np.square(block[whole * frame :])))
    return out


def speech_regions(audio: np.ndarray, sampling_rate: int, threshold: float, *, min_gap_s: float = MIN_GAP_S,
                   pad_s: float = PAD_S, max_region_s: float | None = None) -> list[tuple[int, int]]:
    """Sample ranges [start, end) holding sound above the threshold (see the module docstring); [] for silence.

    `max_region_s`: a longer region is split at its quietest dip (`split_at_dips`) until its parts fit, where
    such dips exist."""
    frame = max(1, int(round(FRAME_S * sampling_rate)))
    rms = frame_rms(audio, frame)
    if rms.size == 0:
        return []
    quiet, loud_level = np.percentile(rms, [10, 90])
    level = max(float(threshold), min(2.0 * float(quiet), 0.5 * float(loud_level)))  # steady sound: all of it counts
    loud = np.flatnonzero(rms >= level)
    if loud.size == 0:
        return []
    gap = max(1, int(round(min_gap_s / FRAME_S)))
    breaks = np.flatnonzero(np.diff(loud) > gap)
    starts = np.concatenate([[loud[0]], loud[breaks + 1]])
    ends = np.concatenate([loud[breaks], [loud[-1]]]) + 1
    pad = int(round(pad_s * sampling_rate))
    regions = []
    for s, e in zip(starts, ends):
        start, end = max(0, int(s) * frame - pad), min(audio.shape[0], int(e) * frame + pad)
        if regions and start <= regions[-1][1]:
            regions[-1] = (regions[-1][0], end)
        else:
            regions.append((start, end))
    if max_region_s is None:
        return regions
    longest = int(round(max_region_s * sampling_rate))
    return [part for region in regions for part in split_at_dips(rms, frame, region, longest)]


def split_at_dips(rms: np.ndarray, frame: int, region: tuple[int, int], longest: int) -> list[tuple[int, int]]:
    """Cut a region longer than `longest` samples at its quietest 0.2 s (at least 1 s from either end), if that
    dip is a real pause (below a quarter of the region's median level), then the parts likewise. A region
    without such a dip stays whole (it is read in overlapping windows). Whisper transcribes a shorter
    stretch more completely than a full window, and subtitles get shorter cues."""
    start, end = region
    if end - start <= longest:
        return [region]
    first, last = start // frame, -(-end // frame)
    level = rms[first:last]
    smooth = np.convolve(level, np.ones(DIP_FRAMES) / DIP_FRAMES, mode="same")
    margin = int(round(1.0 / FRAME_S))
    if smooth.shape[0] <= 2 * margin:
        return [region]
    dip = margin + int(np.argmin(smooth[margin:-margin]))
    if smooth[dip] >= DIP_RATIO * float(np.median(level)):
        return [region]
    cut = (first + dip) * frame
    return split_at_dips(rms, frame, (start, cut), longest) + split_at_dips(rms, frame, (cut, end), longest)


def plan_windows(regions: list[tuple[int, int]], window: int, stride: int) -> list[Window]:
    """The encoder windows for the regions: one per region that fits, else overlapping windows `stride` each side."""
    if window <= 2 * stride:
        raise ValueError(f"a window of {window} samples cannot have a stride of {stride} on each side")
    step = window - 2 * stride
    planned = []
    for index, (start, end) in enumerate(regions):
        starts = [start]
        while starts[-1] + window < end:
            starts.append(starts[-1] + step)
        for k, s in enumerate(starts):
            e = min(s + window, end)
            owned_start = start if k == 0 else s + stride
            owned_end = end if k == len(starts) - 1 else s + window - stride
            planned.append(Window(s, e, owned_start, owned_end, index))
    return planned


def stitch(previous: list[int], current: list[int], min_matches: int = 2) -> tuple[int, int]:
    """How to join two overlapping windows' tokens: (tokens of `previous` to keep, tokens of `current` to skip).

    Every alignment of `previous`'s last n tokens with `current`'s first n is scored by its share of
    equal tokens (a tiny bonus for longer overlaps breaks ties); the best one with at least
    `min_matches` equal tokens is cut in its middle. No such alignment: keep both whole.
    """
    best_score, best_length = 0.0, 0
    for length in range(1, min(len(previous), len(current)) + 1):
        matches = sum(a == b for a, b in zip(previous[len(previous) - length :], current[:length]))
        score = matches / length + length * 1e-6
        if matches >= min_matches and score > best_score:
            best_score, best_length = score, length
    if best_length == 0:
        return len(previous), 0
    half = best_length // 2
    return len(previous) - best_length + half, half


def pack_windows(windows: list[Window], pack: int) -> list[Window]:
    """Join consecutive windows that each hold a whole region into packed windows of at most `pack` samples in all
    (the module docstring's step 3; faster-whisper's `collect_chunks` packs its speech chunks the same way).

    A region read in overlapping windows is never packed: its windows stay as they are, between packs. `pack` of 0
    (or any length no two regions fit in) leaves every window as it is."""
    counts: dict[int, int] = {}
    for window in windows:
        counts[window.region] = counts.get(window.region, 0) + 1
    packed: list[Window] = []
    group: list[Window] = []

    def flush() -> None:
        if len(group) == 1:
            packed.append(group[0])
        elif group:
            first, last = group[0], group[-1]
            packed.append(Window(first.start, last.end, first.start, last.end, first.region,
                                 tuple((w.start, w.end) for w in group)))
        group.clear()

    for window in windows:
        whole = counts[window.region] == 1
        if whole and group and sum(w.length for w in group) + window.length <= pack:
            group.append(window)
            continue
        flush()
        if whole:
            group.append(window)
        else:
            packed.append(window)
    flush()
    return packed


def looks_looped(text: str, ended: bool) -> bool:
    """Whether a window's transcript looks like a decoding loop: no end-of-text before the token limit (`ended` False), or
    a text that zlib compresses more than `COMPRESSION_RATIO_THRESHOLD` times (repeated phrases)."""
    if not ended:
        return True
    data = text.encode("utf-8")
    return len(data) > 0 and len(data) / len(zlib.compress(data)) > COMPRESSION_RATIO_THRESHOLD
