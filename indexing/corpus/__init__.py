"""The corpus read: readers of its formats cut into work units (readers), 100-word passages with stable ids
(passages), and the compact id -> digest tables a build keeps of what it read (digests)."""

__all__ = ["passages", "readers"]
