"""Evaluation of finished runs: the table (`table`), the HTML report (`report`, `charts`), and the experiment
runner (`experiment`) that answers a grid of datasets x methods x params and ends with both."""

# the modules code outside evaluation/ may import
__all__ = [
    "comparison",
    "devsets",
    "experiment",
    "judge",
    "report",
    "runs",
    "table",
]
