"""Which GPUs a backend can run a model on, asked of the backend's own runtime (Triton's
``instance_group { kind: KIND_GPU }``): a ``KIND_GPU`` group loads only where its device is
usable, else the load fails saying why; ``KIND_AUTO`` takes the GPUs when there are, else the CPU.

- ``onnxruntime``: ``CUDAExecutionProvider`` in ``onnxruntime.get_available_providers()`` (the
  ``onnxruntime-gpu`` build) and an NVIDIA GPU the driver exposes;
- ``openvino``: the ``GPU`` devices of ``openvino.Core().available_devices`` (``GPU.0`` ...);
- ``torch``: ``torch.cuda.is_available()``, ``torch.cuda.device_count()`` devices;
- ``python``: an NVIDIA GPU the driver exposes (the model decides what runs there, as in
  Triton: it reads ``model_instance_kind`` and ``model_instance_device_id``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from frameserve.repository import ModelConfig

__all__ = ["instance_gpus", "nvidia_gpus", "usable_gpus"]


def nvidia_gpus() -> int:
    """NVIDIA GPUs the driver exposes (``/proc/driver/nvidia/gpus``); 0 where there is none."""
    try:
        return sum(1 for _ in Path("/proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return 0


@functools.cache
def usable_gpus(backend: str) -> tuple[int, str]:
    """``(n, why)``: how many GPUs ``backend`` can run on here (GPU indices ``0 .. n-1``), and
    when ``n`` is 0 why not, in words that name what is missing. Asked once per backend (a
    machine's devices do not change while it runs)."""
    if backend == "onnxruntime":
        import onnxruntime as ort

        providers = ort.get_available_providers()
        if "CUDAExecutionProvider" not in providers:
            return 0, (
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (its providers: "
                f"{', '.join(providers)}); install onnxruntime-gpu on a machine with an NVIDIA GPU"
            )
        n = nvidia_gpus()
        return n, "" if n else "onnxruntime has its CUDA provider but this machine has no NVIDIA GPU"
    if backend == "openvino":
        import openvino as ov

        devices = [d for d in ov.Core().available_devices if d.split(".")[0] == "GPU"]
        if not devices:
            return 0, f"OpenVINO sees no GPU device (its devices: {', '.join(ov.Core().available_devices)})"
        return len(devices), ""
    if backend == "torch":
        import torch

        if not torch.cuda.is_available():
            return 0, f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is false)"
        return int(torch.cuda.device_count()), ""
    n = nvidia_gpus()
    return n, "" if n else "this machine has no NVIDIA GPU (no /proc/driver/nvidia/gpus)"


def instance_gpus(config: ModelConfig) -> dict[str, Any]:
    """:func:`~frameserve.scheduler.plan_instances`'s ``gpus`` and ``gpu_why`` for ``config``:
    the GPUs its backend can use, asked only when an instance group may want one."""
    if not any(g.kind in ("KIND_GPU", "KIND_AUTO") for g in config.instance_group):
        return {"gpus": 0}
    n, why = usable_gpus(config.backend)
    return {"gpus": n, "gpu_why": why}
