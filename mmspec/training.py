"""Training helpers shared by every recipe and trainer.

- `seed_everything`: Python's, NumPy's and torch's global generators from one seed;
- `adamw`: the optimiser (a module's trainable parameters, a list, or parameter groups);
- `warmup_cosine`: linear warm-up, then cosine decay to a floor, by steps or by a progress
  fraction (e.g. wall-clock time spent of a budget);
- `TrainingLoop`: the step loop, a fixed number of steps or as many as fit a wall-clock budget,
  with a tqdm bar; `IndexBatches`: seeded shuffled batches; `optimizer_step`: one clipped update;
- `fit`: the whole loop for a loss over example indices (AdamW, schedule, clipping, seeded shuffles);
- `Checkpoints`: resumable training state, written atomically, the newest few kept;
- `add_output_arguments` / `output_folder`: a recipe writes to `--out`, and into the installed
  package only when told with `--into-zoo`.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from .errors import MMSpecError


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch's default generator."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of `module` that require gradients, in registration order."""
    return [p for p in module.parameters() if p.requires_grad]


def adamw(
    params: nn.Module | Iterable[nn.Parameter] | Iterable[dict[str, Any]],
    lr: float,
    *,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.01,
) -> torch.optim.AdamW:
    """AdamW over a module's trainable parameters, a list of parameters, or parameter groups."""
    if isinstance(params, nn.Module):
        params = trainable(params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def warmup_cosine(
    step: int,
    total: int,
    warmup: int,
    *,
    floor: float = 0.0,
    peak: float = 1.0,
    progress: float | None = None,
) -> float:
    """Linear warm-up to `peak` over `warmup` steps, then cosine decay from `peak` to `floor * peak`.

    `peak` = 1 gives a factor (for `LambdaLR` or `base_lr * factor`); a learning rate as `peak`
    gives the rate itself. The decay runs over steps `warmup .. total`, or, when `progress` is
    given, over that fraction (0..1) of the run (e.g. of a wall-clock budget); past the end it
    stays at the floor.
    """
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if progress is None:
        progress = (step - warmup) / max(1, total - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class TrainingLoop:
    """Training steps: `steps` of them, or (with `steps` = 0) as many as fit `max_minutes`; a tqdm bar.

    Without a step count the number of steps is fitted to the budget from the median time of the
    first `probe` steps (step 0, which warms up, excluded); whatever happens the loop stops at
    the deadline. `total` is the planned number of steps (0 while still probing).
    """

    def __init__(self, max_minutes: float, steps: int = 0, desc: str = "train", probe: int = 5,
                 disable: bool = False) -> None:
        self.start = time.time()
        self.deadline = self.start + max_minutes * 60
        self.total = int(steps)
        self.fixed = bool(steps)
        self.desc, self.probe, self.disable = desc, probe, disable
        self.step_times: list[float] = []
        self.done = 0
        self.bar: tqdm | None = None
        self.smoothed: float | None = None

    def planned(self) -> int:
        """The planned total, or a large stand-in while probing (schedules barely move then)."""
        return self.total or 10**6

    def __iter__(self) -> Iterator[int]:
        self.bar = tqdm(total=self.total or None, desc=self.desc, mininterval=5, disable=self.disable)
        step = 0
        while not self.total or step < self.total:
            if time.time() >= self.deadline and step > 0:
                tqdm.write(f"{self.desc}: wall-clock budget reached after {step} steps")
                break
            t0 = time.time()
            yield step
            if step >= 1:
                self.step_times.append(time.time() - t0)
            if not self.fixed and not self.total and len(self.step_times) >= self.probe:
                per_step = max(statistics.median(self.step_times), 1e-6)
                self.total = step + 1 + max(0, int((self.deadline - time.time()) / per_step))
                self.bar.total = self.total
                tqdm.write(f"{self.desc}: {per_step:.3f}s per step -> {self.total} steps")
            self.bar.update(1)
            step += 1
        self.done = step
        self.bar.close()

    def log(self, step: int, loss: float, every: int, **extra: float) -> None:
        """Keep the smoothed loss (moving average, 0.95) on the bar; every `every` steps, a line with `extra`."""
        self.smoothed = loss if self.smoothed is None else 0.95 * self.smoothed + 0.05 * loss
        if step % every == 0:
            self.bar.set_postfix(loss=f"{self.smoothed:.4f}")
            values = "".join(f"{name} {value:.4g} " for name, value in extra.items())
            self.bar.write(f"step {step} loss {loss:.4f} (smoothed {self.smoothed:.4f}) {values}elapsed {self.wall:.0f}s")

    @property
    def wall(self) -> float:
        return time.time() - self.start

    @property
    def seconds_per_step(self) -> float | None:
        return round(statistics.median(self.step_times), 4) if self.step_times else None


class IndexBatches:
    """Batches of example indices from seeded permutations of `range(n)`, a new one when too few are left."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator
        self.order, self.cursor = torch.randperm(n, generator=generator), 0

    def take(self, batch_size: int) -> torch.Tensor:
        if self.cursor + batch_size > self.order.numel():
            self.order, self.cursor = torch.randperm(self.n, generator=self.generator), 0
        batch = self.order[self.cursor : self.cursor + batch_size]
        self.cursor += batch_size
        return batch


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, params: Iterable[nn.Parameter] | None = None,
                   clip: float = 1.0) -> None:
    """One update: clear the gradients, back-propagate `loss`, clip `params`' gradient norm (unless None), step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if params is not None:
        nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()


def fit(
    module: nn.Module,
    batch_loss: Callable[[list[int]], torch.Tensor],
    num_examples: int,
    steps: int,
    *,
    batch_size: int,
    learning_rate: float,
    warmup_steps: int,
    seed: int,
    progress_bar: bool,
    desc: str,
    weight_decay: float = 0.01,
    clip: float = 1.0,
) -> list[float]:
    """Train `module` on `batch_loss(indices)`: AdamW, warm-up + cosine to 0, gradient clipping.

    Each batch takes `batch_size` example indices from seeded shuffles of `range(num_examples)`
    (a new shuffle whenever one runs out); returns the loss of every step.
    """
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimiser = adamw(module, learning_rate, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: warmup_cosine(s, steps, warmup_steps))
    module.train()
    losses: list[float] = []
    order: list[int] = []
    with tqdm(total=steps, desc=desc, disable=not progress_bar) as bar:
        for _ in range(steps):
            batch: list[int] = []
            while len(batch) < min(batch_size, num_examples):
                if not order:
                    order = list(range(num_examples))
                    rng.shuffle(order)
                batch.append(order.pop())
            loss = batch_loss(batch)
            optimiser.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(module.parameters(), clip)
            optimiser.step()
            schedule.step()
            losses.append(loss.detach().item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update(1)
    module.eval()
    return losses


class Checkpoints:
    """Resumable training state in `folder/step-XXXXXXXX.pt`: written atomically, the newest `keep` kept.

    A state is a dict of tensors and plain values (model and optimiser state dicts, generator
    states, ...); `format` and `kind` are stored with it and checked on load, so a checkpoint of
    something else is refused in one line. Loading is weights-only (no pickle is executed).
    """

    def __init__(self, folder: str | Path, format: str, kind: str = "", keep: int = 2) -> None:
        self.folder, self.format, self.kind, self.keep = Path(folder), format, kind, keep

    def latest(self) -> Path | None:
        found = sorted(self.folder.glob("step-*.pt")) if self.folder.is_dir() else []
        return found[-1] if found else None

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step-{step:08d}.pt"
        torch.save({"format": self.format, "kind": self.kind, "step": step, **state}, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)  # never leave a half-written checkpoint behind
        for old in sorted(self.folder.glob("step-*.pt"))[: -self.keep]:
            old.unlink()
        return path

    def clear(self) -> None:
        """Delete every checkpoint (and the folder, when that leaves it empty)."""
        for path in self.folder.glob("step-*.pt") if self.folder.is_dir() else []:
            path.unlink()
        if self.folder.is_dir() and not any(self.folder.iterdir()):
            self.folder.rmdir()

    def load(self, path: Path | None = None) -> dict[str, Any] | None:
        """The state in `path` (default the latest checkpoint); None when there is none."""
        path = self.latest() if path is None else path
        if path is None:
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated or foreign file
            raise MMSpecError(f"cannot read checkpoint {path}: {err}") from err
        if not isinstance(state, dict) or state.get("format") != self.format or state.get("kind") != self.kind:
            found = state.get("kind") if isinstance(state, dict) else None
            raise MMSpecError(f"{path} is not a {self.format} checkpoint of kind {self.kind!r} (found kind {found!r})")
        return state


# ---------------------------------------------------------------- where a recipe writes


def add_output_arguments(parser: argparse.ArgumentParser, name: str, what: str = "the model") -> None:
    """`--out` (default `./NAME`) and `--into-zoo` (write into the installed package's zoo folder)."""
    parser.add_argument("--out", default=None, help=f"output folder: {what} (default ./{name})")
    parser.add_argument("--into-zoo", action="store_true",
                        help=f"write into the installed package's zoo folder {name}, replacing what ships")


def output_folder(out: str | Path | None, into_zoo: bool, zoo_folder: Path) -> Path:
    """Where a recipe writes: `zoo_folder` with `--into-zoo`, else `out` (default `./<zoo folder name>`).

    Refuses an `out` inside the installed package without `--into-zoo`, so that no run replaces a
    shipped model by accident.
    """
    if into_zoo:
        if out is not None and Path(out).expanduser().resolve() != zoo_folder.resolve():
            raise MMSpecError(f"--into-zoo writes to {zoo_folder}; leave out --out {str(out)!r} or --into-zoo")
        return zoo_folder
    path = Path(zoo_folder.name if out is None else out).expanduser()
    package = Path(__file__).resolve().parent
    if path.resolve() == package or package in path.resolve().parents:
        raise MMSpecError(f"--out {str(path)!r} is inside the installed mmspec package; "
                          "pass --into-zoo to replace the shipped model, or choose another folder")
    return path


def parse_output_folder(parser: argparse.ArgumentParser, args: argparse.Namespace, zoo_folder: Path) -> Path:
    """`output_folder` for a recipe's parsed `--out` / `--into-zoo`; a refusal is the parser's usage error (exit 2)."""
    try:
        return output_folder(args.out, args.into_zoo, zoo_folder)
    except MMSpecError as err:
        parser.error(str(err))

