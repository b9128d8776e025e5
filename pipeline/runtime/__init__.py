"""How a run executes: the answer job in-process or on Ray, actors and their resources, the GPU plan, signals."""

__all__ = ["answer", "ray_runner", "replica", "runners", "signals"]
