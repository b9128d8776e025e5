"""The engine: method programs' requests batched into backend calls, with all accounting."""
