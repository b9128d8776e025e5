"""What the platform under dynrag needs from it, in one place below both `indexing` and `pipeline`: Ray's and
vLLM's private APIs (compat), which GPU a process may use (device), the JVM behind pyserini (java), starting or
joining Ray (raytools), and the fault-injection points the fault tests pause at (faults). It imports nothing of
the project, so `indexing` (a library) and `pipeline` both use it without one reaching into the other.
"""

from platform_shims.errors import DeviceError

__all__ = ["DeviceError", "compat", "device", "faults", "java", "raytools"]
