"""`mmspec VERB --help` imports no torch (nor a pipeline module): help is quick."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("verb", [["caption"], ["transcribe"], ["generate-image"], ["bench", "vision"], ["bench", "image"]])
def test_help_imports_no_torch(verb):
    code = ("import sys\nfrom mmspec.cli import main\ntry:\n    main([*sys.argv[1:], '--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *verb], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
