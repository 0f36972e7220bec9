"""fp8proj: block-scaled FP8 projections for MLA attention on Hopper, from PyTorch.

    import fp8proj
    fp8proj.cuda_status()                       # (True, "NVIDIA H200") or (False, why)
    torch.ops.fp8proj.quantize_activation(x)    # the ops: see fp8proj.ops
    fp8proj.torch.Fp8ProjLinear.from_linear(linear, name="layers.0.self_attn.o_proj")
    fp8proj.integrations.transformers.patch(model)   # bf16 MLA projections, or an FP8 checkpoint's FP8Linears

Everything imports on any machine; without a Hopper GPU (or without the CUDA build of the
library) the modules run torch's own bf16 matmul on the original weight and log once why.
"""
from __future__ import annotations

from typing import Tuple

from . import _lib
from ._lib import DeviceFaultError, Fp8ProjError

__version__ = "0.1.0"

from . import ops  # noqa: E402  (registers torch.ops.fp8proj.*)
from . import torch  # noqa: E402,F401
from . import integrations  # noqa: E402,F401


def cuda_status() -> Tuple[bool, str]:
    """(True, "") when the library has CUDA and this process's GPU runs the sm_90a FP8 kernels;
    else (False, the reason)."""
    ok, text = _lib.device_status()
    return (True, "") if ok else (False, text)


def library_version() -> str:
    """The C library's "<version>+<commit>", or "" when it could not be loaded."""
    return _lib.LIB.fp8proj_version_string().decode() if _lib.LIB is not None else ""


__all__ = ["DeviceFaultError", "Fp8ProjError", "cuda_status", "library_version", "ops", "torch", "integrations",
           "__version__"]
