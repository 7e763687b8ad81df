"""What the Triton kernels of `rejection` and `tree_verify` share: when to use Triton, how a kernel is
built, and the caller-drawn noise that makes their sampling reproducible from a `torch.Generator`.

Kernels live in their own modules as plain functions, made Triton kernels on first launch, so that
the references and dispatchers import without Triton. Triton runs kernels on CPU tensors in its
interpreter only when TRITON_INTERPRET=1 was set before Triton was first imported (its own library
functions are built at import, compiled or interpreted); the test suite sets it on machines without
CUDA (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mmspec.errors import MMSpecError

try:
    import triton
except ImportError:  # a CPU-only install without Triton: the torch references serve every call
    triton = None

_BUILT: dict[Callable[..., Any], Any] = {}

# Floats are summed as integers in units of 2**-FIXED_POINT_BITS: integer sums do not depend on the order
# of the additions, so a kernel and its torch reference get the same bits (2**-56 resolution; a sum of
# probabilities stays far below 2**63 units).
FIXED_POINT_BITS = 56


def interpreting() -> bool:
    """Whether Triton was loaded by its CPU interpreter (TRITON_INTERPRET=1 before Triton's first import)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(triton.language.max, InterpretedFunction)


def built(fn: Callable[..., Any]) -> Any:
    """`fn` as a Triton kernel (compiled, or interpreted when Triton was loaded by its interpreter)."""
    if triton is None:
        raise MMSpecError("this fast path needs Triton (pip install triton)")
    if fn not in _BUILT:
        _BUILT[fn] = triton.jit(fn)
    return _BUILT[fn]


def runs_triton(like: torch.Tensor, requested: bool | None) -> bool:
    """Whether a dispatcher runs its Triton kernel on tensors like `like`.

    None: on CUDA tensors when Triton is installed, else the torch reference. True: always (CPU tensors
    need TRITON_INTERPRET=1). False: always the reference.
    """
    if requested is None:
        return triton is not None and like.is_cuda and not interpreting()
    if requested and triton is None:
        raise MMSpecError("use_triton=True needs Triton (pip install triton)")
    if requested and not like.is_cuda and not interpreting():
        raise MMSpecError("Triton kernels on CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before "
                          "anything imports Triton")
    return requested


def block_size(vocab: int, cap: int = 4096) -> int:
    """The vocabulary tile a kernel loops over: a power of two, at most `cap`."""
    return min(cap, triton.next_power_of_2(max(vocab, 16)) if triton is not None else cap)


def generator_device(generator: torch.Generator | None, default: torch.device) -> torch.device:
    return default if generator is None else torch.device(generator.device)


def draw_uniforms(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Uniforms in [0, 1) float32, drawn on the generator's device and moved to `device` (a CPU generator
    gives the same numbers for a CUDA verification as for a CPU one)."""
    where = generator_device(generator, device)
    return torch.rand(shape, generator=generator, device=where).to(device)


def draw_exponentials(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """Exp(1) noise float32 for exponential-race draws (argmax of probs / noise is a draw from probs),
    drawn on the generator's device and moved to `device`."""
    where = generator_device(generator, device)
    return torch.empty(shape, device=where).exponential_(generator=generator).to(device)


def race_scores(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """weights / noise where the weight is positive, -1 elsewhere: the argmax (first on ties) is a draw from
    the normalised weights (the exponential race), and a token without weight is never drawn while one has some."""
    return torch.where(weights > 0, weights / exponentials, torch.full_like(weights, -1.0))


def fixed_point_mass(values: torch.Tensor) -> torch.Tensor:
    """sum(values) over the last dimension as float32, through order-free integer sums (see FIXED_POINT_BITS)."""
    units = (values * float(2**FIXED_POINT_BITS)).to(torch.int64).sum(-1)
    return (units.to(torch.float64) * float(2.0**-FIXED_POINT_BITS)).to(torch.float32)
