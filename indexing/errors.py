"""indexing's error types: each is a mistake a user can fix, told in one line (the CLI exits 2 on them)."""


class IndexingError(Exception):
    """Bad corpus input, a bad index or search request, a missing model folder: say what and where."""


class CorruptIndexError(IndexingError):
    """A file of a published version is missing or does not match its recorded checksum."""


class BuildStalled(IndexingError):
    """A build's tasks made no progress (none finished, none reported a step) for `index.build_stall_s`: the build
    stops with one line naming the tasks awaited, on which executor, and for how long; nothing is published."""
