"""How a run executes: the answer job in-process or on Ray, actors and their resources, signals, orphan guard."""
