"""One exception type for every user-facing mistake, so the CLI can print one clear line."""


class MMSpecError(ValueError):
    """Bad input or an incompatible model/drafter combination, explained in plain words."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (libraries' messages run on; the CLI prints one line)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
