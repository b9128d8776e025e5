"""Questions in, rows out: dataset loaders, Parquet output rows, the output folder's lock."""
