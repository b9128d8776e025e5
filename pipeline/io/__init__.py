"""Questions in, rows out: dataset loaders (and the demo's pick of packaged questions), Parquet output rows, the
output folder's lock."""

__all__ = ["commit", "datasets", "demo_questions", "id_set", "output", "output_lock", "part_store"]
