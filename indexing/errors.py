"""indexing's error types: each is a mistake a user can fix, told in one line (the CLI exits 2 on them)."""


class IndexingError(Exception):
    """Bad corpus input, a bad index or search request, a missing model folder: say what and where."""


class CorruptIndexError(IndexingError):
    """A file of a published version is missing or does not match its recorded checksum."""
