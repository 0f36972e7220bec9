"""Loads libfp8proj_c.so (the C ABI, include/fp8proj/c_api.h) through ctypes.

The library sits next to this file in an installed package; FP8PROJ_PYTHON_LIB names another one
(e.g. a build tree's build/src/libfp8proj_c.so). Every function object has its argtypes and
restype set once here, so a call costs one ctypes dispatch and no per-call type inference.
A C call that returns -1 becomes Fp8ProjError carrying fp8proj_last_error()'s message.
"""
from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, c_char_p, c_float, c_int, c_int64, c_size_t, c_void_p
from pathlib import Path
from typing import Optional

_HERE = Path(__file__).resolve().parent
_NAME = "libfp8proj_c.so"


class Fp8ProjError(RuntimeError):
    """A call into libfp8proj_c failed; the message is the library's own (what was wrong)."""


class DeviceFaultError(Fp8ProjError):
    """An earlier sticky CUDA error left the CUDA context unusable (docs/robustness.md): every
    later call that would use the GPU fails with this, naming the first fault. Restart the
    process."""


# The first fault's text once a C call has reported one (fail() below): the ops then raise
# before they allocate, at the cost of reading this global.
FAULT: Optional[str] = None


class ProjectionOptions(ctypes.Structure):
    # Mirrors fp8proj_projection_options in c_api.h, field for field.
    _fields_ = [
        ("name", c_char_p),
        ("enabled", c_int),
        ("policy", c_char_p),
        ("threshold", c_int64),
        ("decode_ceiling", c_int64),
        ("max_tokens", c_int64),
        ("rmsnorm_input", c_int),
        ("apply_env", c_int),
        ("fp8_backend", c_char_p),
        ("workspace", c_void_p),
    ]


_SIGNATURES = {
    # name: (restype, argtypes)
    "fp8proj_version_string": (c_char_p, []),
    "fp8proj_last_error": (c_char_p, []),
    "fp8proj_device_fault": (c_char_p, []),
    "fp8proj_device_status": (c_int, [POINTER(c_int), c_char_p, c_size_t]),
    "fp8proj_quantize_activation": (c_int, [c_void_p, c_int64, c_int64, c_int64, c_void_p, c_void_p, c_int64, c_void_p]),
    "fp8proj_rmsnorm_quantize": (
        c_int, [c_void_p, c_int64, c_void_p, c_float, c_int64, c_int64, c_void_p, c_void_p, c_int64, c_void_p]),
    "fp8proj_quantize_weight": (c_int, [c_void_p, c_int64, c_int64, c_void_p, c_void_p, c_void_p]),
    "fp8proj_quantize_activation_scaled": (
        c_int, [c_void_p, c_int64, c_int64, c_int64, c_int, c_void_p, c_void_p, c_int64, c_void_p]),
    "fp8proj_rmsnorm_quantize_scaled": (
        c_int, [c_void_p, c_int64, c_void_p, c_float, c_int64, c_int64, c_int, c_void_p, c_void_p, c_int64, c_void_p]),
    "fp8proj_quantize_weight_scaled": (c_int, [c_void_p, c_int64, c_int64, c_int, c_void_p, c_void_p, c_void_p]),
    "fp8proj_silu_mul_quantize": (
        c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_int, c_void_p, c_void_p, c_int64, c_void_p]),
    "fp8proj_fp8_gemm_create": (c_int, [c_void_p, c_void_p, c_int64, c_int64, c_int64, c_char_p, POINTER(c_void_p)]),
    "fp8proj_fp8_gemm_run": (c_int, [c_void_p, c_void_p, c_void_p, c_int64, c_int64, c_void_p, c_void_p]),
    "fp8proj_fp8_gemm_describe": (c_int, [c_void_p, c_int64, c_char_p, c_size_t]),
    "fp8proj_fp8_gemm_destroy": (None, [c_void_p]),
    "fp8proj_fp8_gemm_workspace_bytes": (c_int, [c_void_p, POINTER(c_size_t)]),
    "fp8proj_workspace_create": (c_int, [c_int64, c_int64, c_int, POINTER(c_void_p)]),
    "fp8proj_workspace_bytes": (c_int, [c_void_p, POINTER(c_size_t)]),
    "fp8proj_workspace_destroy": (None, [c_void_p]),
    "fp8proj_projection_options_init": (c_int, [POINTER(ProjectionOptions)]),
    "fp8proj_projection_create": (c_int, [c_void_p, c_int64, c_int64, POINTER(ProjectionOptions), POINTER(c_void_p)]),
    "fp8proj_projection_create_scaled": (
        c_int, [c_void_p, c_int64, c_int64, POINTER(ProjectionOptions), c_int, POINTER(c_void_p)]),
    "fp8proj_projection_weight_scales": (c_int, [c_void_p, POINTER(c_int)]),
    "fp8proj_projection_forward": (c_int, [c_void_p, c_void_p, c_int64, c_void_p, c_void_p]),
    "fp8proj_projection_forward_rmsnorm": (
        c_int, [c_void_p, c_void_p, c_int64, c_void_p, c_float, c_int64, c_void_p, c_void_p]),
    "fp8proj_projection_path": (c_int, [c_void_p, c_int64, POINTER(c_int)]),
    "fp8proj_projection_explain": (c_int, [c_void_p, c_int64, c_char_p, c_size_t]),
    "fp8proj_projection_path_input": (c_int, [c_void_p, c_int64, c_int, POINTER(c_int)]),
    "fp8proj_projection_explain_input": (c_int, [c_void_p, c_int64, c_int, c_char_p, c_size_t]),
    "fp8proj_projection_memory": (
        c_int, [c_void_p, POINTER(c_size_t), POINTER(c_size_t), POINTER(c_size_t), POINTER(c_size_t)]),
    "fp8proj_projection_id": (c_int, [c_void_p, POINTER(c_int64)]),
    "fp8proj_projection_destroy": (None, [c_void_p]),
}


class _Lib:
    """The loaded library's functions as attributes (lib.fp8proj_quantize_weight, ...)."""

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self.cdll = cdll
        self.path = path
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(cdll, name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def last_error(self) -> str:
        return (self.fp8proj_last_error() or b"").decode(errors="replace")


def _candidates() -> list:
    env = os.environ.get("FP8PROJ_PYTHON_LIB")
    if env:
        return [env]
    return [str(_HERE / _NAME)]


def _load() -> tuple:
    tried = []
    for path in _candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (missing)")
            continue
        try:
            return _Lib(ctypes.CDLL(path), path), ""
        except (OSError, AttributeError) as e:  # AttributeError: an older library without a symbol
            tried.append(f"{path} ({e})")
    return None, "libfp8proj_c.so could not be loaded: " + "; ".join(tried)


LIB, LOAD_ERROR = _load()


def lib() -> _Lib:
    if LIB is None:
        raise Fp8ProjError(LOAD_ERROR)
    return LIB


def fail(what: str) -> "Fp8ProjError":
    """The exception for a C call that returned -1 (call right after it, on the same thread):
    DeviceFaultError when the CUDA context is unusable."""
    message = f"{what}: {LIB.last_error()}"
    if device_fault() is not None:
        return DeviceFaultError(message)
    return Fp8ProjError(message)


def device_fault() -> Optional[str]:
    """None while the CUDA context is usable; else the text of the first sticky CUDA error the
    library saw (fp8proj_device_fault in c_api.h)."""
    global FAULT
    if FAULT is None and LIB is not None:
        text = LIB.fp8proj_device_fault()
        if text:
            FAULT = text.decode(errors="replace")
    return FAULT


def check_device_fault(what: str) -> None:
    """Raises DeviceFaultError when the library has latched a dead CUDA context (one C call):
    for paths that would otherwise run torch's own kernels on it and fail with torch's text."""
    if device_fault() is not None:
        raise_if_device_fault(what)


def raise_if_device_fault(what: str) -> None:
    """Raises DeviceFaultError once a C call has reported a dead CUDA context (a global read)."""
    if FAULT is not None:
        raise DeviceFaultError(f"{what}: fp8proj: the CUDA context is unusable after an earlier error: {FAULT}; "
                               "restart the process")


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise fail(what)


def read_string(fn, *args, size: int = 1024) -> str:
    buf = ctypes.create_string_buffer(size)
    check(fn(*args, buf, size), fn.__name__)
    return buf.value.decode(errors="replace")


_STATUS: Optional[tuple] = None


def device_status() -> tuple:
    """(True, gpu name) when the library has CUDA and the GPU runs the sm_90a kernels, else
    (False, reason). Cached: the device does not change within a process."""
    global _STATUS
    if _STATUS is None:
        if LIB is None:
            _STATUS = (False, LOAD_ERROR)
        else:
            ok = c_int(0)
            buf = ctypes.create_string_buffer(512)
            check(LIB.fp8proj_device_status(ctypes.byref(ok), buf, 512), "fp8proj_device_status")
            _STATUS = (ok.value == 1, buf.value.decode(errors="replace"))
            if _STATUS[0]:
                _point_at_packaged_table(_STATUS[1])
    return _STATUS


def _tune_file_name(gpu_name: str) -> str:
    # The C++ rule (src/tune/table.cpp tune_file_name): lower-case alphanumerics, runs of other
    # characters as one '-', no trailing '-'.
    out = []
    for c in gpu_name:
        if c.isascii() and c.isalnum():
            out.append(c.lower())
        elif out and out[-1] != "-":
            out.append("-")
    return "".join(out).rstrip("-") + ".json"


def _point_at_packaged_table(gpu_name: str) -> None:
    # The tuned tables travel inside the wheel (fp8proj/configs/); the library's compiled-in
    # configs/ path is the source tree's, which an installed package may not have. The table is
    # read once, at the first projection or GEMM plan, so this must run before either.
    if "FP8PROJ_TUNE_FILE" in os.environ:
        return
    f = _HERE / "configs" / _tune_file_name(gpu_name)
    if f.exists():
        os.environ["FP8PROJ_TUNE_FILE"] = str(f)
