"""The errors fedrun reports to a user as one line (the ground floor: every module may import it)."""


class ConfigError(ValueError):
    """A user-facing configuration problem; the message names the option and what is allowed."""


class DataMissingError(RuntimeError):
    """The dataset's files are absent and could not be downloaded."""


class DataCorruptError(DataMissingError):
    """A dataset file is there but is not what its format says (truncated, altered, or another file)."""
