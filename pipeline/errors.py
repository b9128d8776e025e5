"""The one base class for errors a user can fix: the CLI prints them as one line and exits 2."""


class DynragError(Exception):
    """Bad input, a bad config value, a missing model or file: say what and where, in one line."""
