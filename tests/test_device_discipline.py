"""Every tensor a decoding path creates is made on a device: no bare `torch.tensor(...)`,
`torch.arange(...)`, `torch.Generator()` ... in the modules a generation runs through.

A CPU default is how device bugs hide on a CPU-only machine (they surface as "Expected all
tensors to be on the same device" on a GPU), so this reads the source: a factory call must
pass `device=` (or be a `*_like` / `.new_*` call, which inherit it). Reviewed exceptions are
listed with their reason. The scanner must flag a planted violation, or it proves nothing.
"""

from __future__ import annotations

import pytest

from .device_checks import ROOT, stale_exceptions, unreviewed, violations

# Modules a generation call runs through (training recipes and benches' data prep are not listed).
DECODING_MODULES = [
    "mmspec/decoding.py", "mmspec/rounds.py", "mmspec/decode_state.py", "mmspec/ragged.py", "mmspec/rules.py", "mmspec/sampling.py",
    "mmspec/targets.py", "mmspec/cached_model.py",
    "mmspec/generation.py", "mmspec/policies.py", "mmspec/drafters/base.py", "mmspec/drafters/model_drafter.py",
    "mmspec/drafters/no_drafter.py", "mmspec/drafters/prompt_lookup.py",
    "speech/target.py", "speech/hybrid.py", "speech/ar_fast_decoder.py", "speech/lean_decoder.py",
    "speech/fast_decoder.py", "speech/pipeline.py",
]
# (module, function) -> why a device-less factory is right there.
REVIEWED = {
    ("mmspec/sampling.py", "seeded_generator"): "draws a seed from torch's global CPU RNG, a Python int",
    ("mmspec/drafters/model_drafter.py", "__init__"): "placeholder, replaced on the sequence's device at prefill",
}


@pytest.mark.parametrize("module", DECODING_MODULES)
def test_decoding_paths_create_tensors_on_a_device(module):
    assert (ROOT / module).is_file(), f"{module} moved: update DECODING_MODULES"
    assert unreviewed(module, REVIEWED) == []


def test_reviewed_exceptions_are_still_needed():
    assert stale_exceptions(REVIEWED) == []


def test_scanner_flags_a_planted_violation():
    planted = "import torch\ndef f(x):\n    return x + torch.arange(3)\ndef g(x):\n    return torch.zeros(2, device=x.device)\n"
    assert violations(planted, "planted.py") == ["planted.py:3 f: torch.arange(...) without device="]
