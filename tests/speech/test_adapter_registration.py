"""The core finds the speech adapter's targets through its entry point alone, in a fresh process."""

import subprocess
import sys

CHECK = """
from mmspec import static_target
from mmspec.targets import TARGET_FACTORIES, load_adapters
load_adapters()
print(TARGET_FACTORIES["whisper"].__name__, sorted(static_target.STATIC_TARGET_FACTORIES))
"""


def test_loading_the_adapters_registers_whisper_and_its_static_target():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["WhisperTarget", "['whisper']"]
