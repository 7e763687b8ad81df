"""Losses of CoDe's specialised fine-tune (the paper's recipe; the official repository has no training code).

The drafter learns only its scales (0..N-1) from the ground-truth token maps; the refiner distils the
large model's logits, first over all scales, then only over its own (N..end). Both are teacher-forced
next-scale losses over the VQ-VAE's token maps of real images, with the official class dropout
(the dropped label becomes the unconditional class, so CFG keeps working).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from mmspec.errors import MMSpecError
from mmspec.sampling import rand

from .var import VAR
from .var_vq import VQVAE


def scale_positions(model: VAR, scales: range) -> slice:
    """The sequence positions of a contiguous range of scales."""
    if not 0 <= scales.start < scales.stop <= len(model.patch_nums) or scales.step != 1:
        raise MMSpecError(f"scales {scales.start}..{scales.stop - 1} are outside 0..{len(model.patch_nums) - 1}")
    return slice(model.begin_ends[scales.start][0], model.begin_ends[scales.stop - 1][1])


def drop_labels(model: VAR, labels: torch.Tensor, cond_drop_rate: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """Each label becomes the unconditional class with probability `cond_drop_rate` (official 0.1)."""
    dropped = rand(tuple(labels.shape), generator, labels.device) < cond_drop_rate
    return torch.where(dropped, torch.full_like(labels, model.num_classes), labels)


def teacher_forced_logits(model: VAR, vq: VQVAE, labels: torch.Tensor, codes: Sequence[torch.Tensor]) -> torch.Tensor:
    model.check_vq(vq)
    with torch.no_grad():
        inputs = vq.quantize.idxBl_to_var_input(codes)
    return model(labels, inputs)


def drafter_loss(drafter: VAR, vq: VQVAE, labels: torch.Tensor, codes: Sequence[torch.Tensor], draft_steps: int,
                 cond_drop_rate: float = 0.1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Cross-entropy on the ground-truth codes of scales 0..draft_steps-1 only."""
    labels = drop_labels(drafter, labels, cond_drop_rate, generator)
    logits = teacher_forced_logits(drafter, vq, labels, codes)
    where = scale_positions(drafter, range(0, draft_steps))
    targets = torch.cat(list(codes), dim=1)
    return F.cross_entropy(logits[:, where].reshape(-1, drafter.V), targets[:, where].reshape(-1))


def refiner_loss(refiner: VAR, teacher: VAR, vq: VQVAE, labels: torch.Tensor, codes: Sequence[torch.Tensor],
                 from_scale: int, cond_drop_rate: float = 0.1, generator: torch.Generator | None = None) -> torch.Tensor:
    """KL(teacher || refiner) of the next-scale distributions on scales from_scale..end (0: the first stage)."""
    if teacher.patch_nums != refiner.patch_nums or teacher.V != refiner.V:
        raise MMSpecError("the teacher and the refiner must share the scales and the codebook")
    labels = drop_labels(refiner, labels, cond_drop_rate, generator)
    where = scale_positions(refiner, range(from_scale, len(refiner.patch_nums)))
    with torch.no_grad():
        teacher_logp = teacher_forced_logits(teacher, vq, labels, codes)[:, where].log_softmax(-1)
    student_logp = teacher_forced_logits(refiner, vq, labels, codes)[:, where].log_softmax(-1)
    return F.kl_div(student_logp.reshape(-1, refiner.V), teacher_logp.reshape(-1, refiner.V), log_target=True,
                    reduction="batchmean")
