"""An explicit CUDA device where this process owns no GPU (issue 47, item 7): refused with one line rather than
landing on the node's GPU 0, which belongs to another process (a pure decision, platform_shims/device.py)."""

from __future__ import annotations

import pytest

from platform_shims import DeviceError, device
from platform_shims.device import check_explicit_device


@pytest.mark.parametrize("dev", ["cuda", "cuda:0", "cuda:1"])
def test_explicit_cuda_in_a_ray_worker_without_gpus_is_refused(dev):
    with pytest.raises(DeviceError, match="was assigned no GPU by Ray") as e:
        check_explicit_device(dev, [], None)  # Ray 2.60: it still sees every GPU of its node (no CUDA_VISIBLE_DEVICES)
    assert "\n" not in str(e.value) and repr(dev) in str(e.value)


def test_explicit_cuda_with_no_visible_device_is_refused():
    with pytest.raises(DeviceError, match="CUDA_VISIBLE_DEVICES is empty"):
        check_explicit_device("cuda", None, "")


def test_a_device_past_the_assigned_gpus_is_refused():
    with pytest.raises(DeviceError, match="assigned 1 GPU"):
        check_explicit_device("cuda:1", ["5"], "5")


@pytest.mark.parametrize(
    ("dev", "assigned", "visible"),
    [
        ("cuda", ["3"], "3"),  # a worker Ray gave a GPU: device 0 is its own
        ("cuda:1", ["3", "4"], "3,4"),
        ("cuda", None, None),  # no Ray (a laptop, the driver): the user's choice
        ("cpu", [], ""),
        ("mps", [], None),
    ],
)
def test_owned_or_non_cuda_devices_pass(dev, assigned, visible):
    assert check_explicit_device(dev, assigned, visible) == dev


def test_own_device_applies_the_check(monkeypatch):
    monkeypatch.setattr(device, "ray_assigned_gpus", lambda: [])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(DeviceError, match="assigned no GPU"):
        device.own_device("cuda")
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    assert device.own_device("auto") == "cpu" and device.own_device("cpu") == "cpu"


def test_the_sentence_embedder_takes_its_device_from_own_device(monkeypatch):
    """PAIRS' and ERM4's embedder asks own_device, so an explicit cuda where this process owns no GPU is refused
    and "auto" never lands on another process's GPU."""
    from pipeline.backends import embedding
    from pipeline.config import DynragConfig

    asked: list = []
    monkeypatch.setattr("platform_shims.device.own_device", lambda device: asked.append(device) or "cpu")
    monkeypatch.setattr(embedding, "resolve_model", lambda name, cache: name)

    class Model:
        def __init__(self, path, device):
            self.device = device

    import sentence_transformers

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", Model)
    cfg = DynragConfig()
    cfg.embedding.device = "cuda:1"
    assert embedding.SentenceEmbedder(cfg)._model(None).device == "cpu" and asked == ["cuda:1"]


def test_no_gpu_driver_means_no_cuda_without_importing_torch():
    import subprocess
    import sys

    assert device.gpu_driver_present(lambda path: path == "/dev/nvidiactl")
    assert device.gpu_driver_present(lambda path: path == "/dev/dxg")
    assert not device.gpu_driver_present(lambda path: False)
    if device.gpu_driver_present():
        pytest.skip("this machine has a GPU driver")
    code = (
        "import sys; from platform_shims.device import cuda_available; print(cuda_available(), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]
