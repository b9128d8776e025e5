"""The shims' one error a user can fix, told in one line (the CLI exits 2 on it, as on indexing's and pipeline's)."""


class DeviceError(Exception):
    """An explicit CUDA device this process does not own (device.py): use 'auto' or 'cpu', or give it its GPUs."""
