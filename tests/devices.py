"""Where each backend's tensors live, for every test that takes a ``backend``.

On a CUDA host the Triton backend (and ``"cuda"``) runs on CUDA tensors; on a CPU host the same
tests run the Triton kernels through its interpreter (``TRITON_INTERPRET=1``, set in conftest)
on CPU tensors. A test that takes a ``backend`` builds its tensors on ``device_of(backend)``; its
float64 definitions compute on the CPU from ``.cpu()`` copies. ``tests/test_devices.py`` holds
every such test to it: a tensor factory in one names its device, is moved with ``.to(...)``, or
says on its line why it stays on the CPU (``# cpu: ...``).
"""

from __future__ import annotations

import torch

ON_GPU = torch.cuda.is_available()
GPU_BACKENDS = ("triton", "cuda")


def device_of(backend: str) -> str:
    """The device a ``backend``'s inputs live on here: "cuda" for a GPU backend on a CUDA
    host, else "cpu" (the CPU op, the reference, "auto" on CPU tensors, the interpreter)."""
    return "cuda" if ON_GPU and backend in GPU_BACKENDS else "cpu"
