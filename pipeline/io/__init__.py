"""Questions in, rows out: dataset loaders (and the demo's pick of packaged questions), Parquet output rows, the
output folder's lock."""
