"""One exception type for every user-facing mistake, so the CLI can print one clear line."""


class MMSpecError(ValueError):
    """Bad input or an incompatible model/drafter combination, explained in plain words."""
