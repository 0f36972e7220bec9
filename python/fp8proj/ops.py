"""The torch ops of namespace `fp8proj` (torch.ops.fp8proj.*), over the C ABI.

Each op has a schema, a CUDA implementation (a Python function calling libfp8proj_c through
ctypes on the current stream), a fake implementation (shapes only, for FakeTensor / meta
tracing and torch.compile) and a CPU implementation that raises: the FP8 ops run on CUDA
tensors only (the modules in fp8proj.torch run bf16 on the CPU).

None of them synchronises the host or allocates anything beyond its outputs (the projection
layer's workspaces are sized when it is made), so they can be captured in a CUDA graph, and
torch.compile(fullgraph=True) traces them as single nodes.

    quantize_activation(x[M, K] bf16, scale_fmt="ue8m0") -> (values e4m3 [M, K], scales f32 [K/128, ceil4(M)])
    rmsnorm_quantize(x, weight[K], eps, scale_fmt="ue8m0") -> (values, scales)   x may be a row-strided view
    quantize_weight(w[N, K] bf16, scale_fmt="ue8m0") -> (values e4m3 [N, K], scales f32 [ceil(N/128), ceil(K/128)])

scale_fmt is "ue8m0" (power-of-two scales, the default) or "float" (fp32 amax/448, values x / scale:
the form of FP8 checkpoints and SGLang's / vLLM's activation rule; include/fp8proj/formats.hpp).
    fp8_gemm(xv, xs, wv, ws) -> y[M, N] bf16
    linear(x[..., K], weight[N, K], handle) -> y[..., N]        the gated projection layer
    rmsnorm_linear(x, norm_weight, eps, weight, handle) -> y    norm + gated projection, fused
    linear_gapped(x, weight, handle, wv, ws, groups, split, gap) -> y[..., N + groups * gap]
        linear()'s output with `gap` zero columns after the first `split` of each of `groups`
        equal column groups; FP8 (where the layer's gate says so for M) through wv, ws: the FP8
        copy of the weight with those zero rows inserted (kv_expand.py: the MLA key layout)
"""
from __future__ import annotations

import weakref
import logging
import os
from pathlib import Path
from typing import Dict, Tuple

import torch

from . import _handles, _lib

__all__ = ["quantize_activation", "rmsnorm_quantize", "quantize_weight", "fp8_gemm", "linear", "rmsnorm_linear",
           "linear_gapped", "gapped_columns"]

_log = logging.getLogger("fp8proj")
_BF16 = torch.bfloat16
_E4M3 = torch.float8_e4m3fn
_F32 = torch.float32
_raw_stream = torch._C._cuda_getCurrentRawStream  # int cudaStream_t of the device's current stream


def _ceil4(m):
    return (m + 3) // 4 * 4


def _ceil128(v):
    return (v + 127) // 128


SCALE_FORMATS = {"ue8m0": 0, "float": 1}  # FP8PROJ_SCALES_UE8M0 / FP8PROJ_SCALES_FLOAT (c_api.h)


def scale_format(op: str, scale_fmt: str) -> int:
    try:
        return SCALE_FORMATS[scale_fmt]
    except (KeyError, TypeError):
        raise ValueError(f"fp8proj.{op}: scale_fmt must be \"ue8m0\" or \"float\", got {scale_fmt!r}") from None


# ---- argument checks (metadata only: nothing here reads device memory or syncs) ----------------

def _check(cond: bool, op: str, msg: str, exc=ValueError) -> None:
    if not cond:
        raise exc(f"fp8proj.{op}: {msg}")


def _check_tensor(t: torch.Tensor, op: str, what: str, dtype: torch.dtype, contiguous: bool = True) -> None:
    _check(isinstance(t, torch.Tensor), op, f"{what} must be a tensor, got {type(t).__name__}", TypeError)
    _check(t.dtype == dtype, op, f"{what} must be {dtype}, got {t.dtype}", TypeError)
    if contiguous:
        _check(t.is_contiguous(), op, f"{what} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")


def _check_cuda(op: str, **tensors) -> None:
    # After the shape checks, so that those are testable (and reported) on any machine.
    for what, t in tensors.items():
        _check(t.is_cuda, op, f"{what} is on {t.device}; the fp8proj ops run on CUDA tensors")


def _rows(x: torch.Tensor, op: str, what: str = "x") -> Tuple[int, int]:
    _check(x.dim() >= 1, op, f"{what} must have at least one dimension")
    k = x.shape[-1]
    return x.numel() // k if k else 0, k


def _row_view(x: torch.Tensor, op: str) -> torch.Tensor:
    """x[..., K] with unit column stride as [M, K] rows some stride apart (a view, no copy)."""
    _check(x.stride(-1) == 1 or x.shape[-1] == 1, op, f"x's last dimension must have stride 1, got {x.stride()}")
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        raise ValueError(f"fp8proj.{op}: x (shape {tuple(x.shape)}, strides {x.stride()}) is not rows of K elements "
                         "a fixed stride apart; pass x.contiguous() or a 2-D row-strided view") from None


# ---- CUDA implementations (also called directly, without the dispatcher, by the modules) ---------

def _activation_outputs(like: torch.Tensor, m: int, k: int):
    """(codes shaped like `like`, fp32 scales [K/128, ceil4(M)], ld) on like's device."""
    ld = _ceil4(m)
    return (torch.empty(like.shape, dtype=_E4M3, device=like.device),
            torch.empty((k // 128, ld), dtype=_F32, device=like.device), ld)


def _quantize_activation_cuda(x: torch.Tensor, scale_fmt: str = "ue8m0"):
    op = "quantize_activation"
    fmt = scale_format(op, scale_fmt)
    _check_tensor(x, op, "x", _BF16)
    m, k = _rows(x, op)
    _check(k % 128 == 0 and k > 0, op, f"K={k} must be a positive multiple of 128 (1x128 scale groups)")
    _check_cuda(op, x=x)
    values, scales, ld = _activation_outputs(x, m, k)
    if m == 0:
        return values, scales
    rc = _lib.LIB.fp8proj_quantize_activation_scaled(x.data_ptr(), k, m, k, fmt, values.data_ptr(), scales.data_ptr(),
                                                     ld, _raw_stream(x.get_device()))
    if rc:
        raise _lib.fail("fp8proj.quantize_activation")
    return values, scales


def _rmsnorm_quantize_cuda(x: torch.Tensor, weight: torch.Tensor, eps: float, scale_fmt: str = "ue8m0"):
    op = "rmsnorm_quantize"
    fmt = scale_format(op, scale_fmt)
    _check_tensor(x, op, "x", _BF16, contiguous=False)
    _check_tensor(weight, op, "weight", _BF16)
    x2 = _row_view(x, op)
    m, k = x2.shape
    _check(weight.shape == (k,), op, f"weight must have shape ({k},), got {tuple(weight.shape)}")
    _check(k % 128 == 0 and k > 0, op, f"K={k} must be a positive multiple of 128 (1x128 scale groups)")
    _check_cuda(op, x=x, weight=weight)
    _check(weight.device == x.device, op, f"weight is on {weight.device}, x on {x.device}")
    values, scales, ld = _activation_outputs(x, m, k)
    if m == 0:
        return values, scales
    stride = x2.stride(0) if m > 1 else k
    rc = _lib.LIB.fp8proj_rmsnorm_quantize_scaled(x2.data_ptr(), stride, weight.data_ptr(), float(eps), m, k, fmt,
                                                  values.data_ptr(), scales.data_ptr(), ld, _raw_stream(x.get_device()))
    if rc:
        raise _lib.fail("fp8proj.rmsnorm_quantize")
    return values, scales


def _quantize_weight_cuda(w: torch.Tensor, scale_fmt: str = "ue8m0"):
    op = "quantize_weight"
    fmt = scale_format(op, scale_fmt)
    _check_tensor(w, op, "w", _BF16)
    _check(w.dim() == 2, op, f"w must be 2-D [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    _check_cuda(op, w=w)
    values = torch.empty((n, k), dtype=_E4M3, device=w.device)
    scales = torch.empty((_ceil128(n), _ceil128(k)), dtype=_F32, device=w.device)
    if n == 0 or k == 0:
        return values, scales
    rc = _lib.LIB.fp8proj_quantize_weight_scaled(w.data_ptr(), n, k, fmt, values.data_ptr(), scales.data_ptr(),
                                                 _raw_stream(w.get_device()))
    if rc:
        raise _lib.fail("fp8proj.quantize_weight")
    return values, scales


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter
        return -1


def _storage_ref(t: torch.Tensor):
    """A weak reference to the storage under t: alive while any tensor on that memory is."""
    return weakref.ref(t.untyped_storage())


class _GemmPlans:
    """fp8_gemm's plans, one per FP8 weight. A plan is bound to the weight's buffers when it is
    made (a backend may stage a converted copy of the scales), so it is remade when the tensors
    it was made for have died (their addresses may now hold another weight) or were modified in
    place (their version counters moved). It is made at the first call for a weight, outside a CUDA graph capture (it
    may allocate), for up to max_m rows; a larger M makes a larger one."""

    def __init__(self):
        self.plans: Dict[tuple, tuple] = {}
        self.retired: list = []  # plans outgrown by a larger M: kept, a CUDA graph may still launch them

    def get(self, wv: torch.Tensor, ws: torch.Tensor, m: int) -> int:
        n, k = wv.shape
        key = (wv.data_ptr(), ws.data_ptr(), n, k, wv.get_device())
        hit = self.plans.get(key)
        if hit is not None:
            h, max_m, wref, sref, wver, sver = hit
            # Alive, the addresses cannot have been reused; a view of the same buffer is the same weight.
            # The references are to the storages: a caller passing weight.detach() hands a new
            # tensor object each call, which dies with the call while its storage lives on.
            if max_m >= m and wref() is not None and sref() is not None and wver == _version(wv) and \
                    sver == _version(ws):
                return h
        _check(not torch.cuda.is_current_stream_capturing(), "fp8_gemm",
               f"no plan yet for this {n}x{k} weight at M={m}: run fp8_gemm once before capturing a CUDA graph")
        max_m = max(8192, _ceil4(m))
        h = _lib.c_void_p()
        lib = _lib.lib()
        _lib.check(lib.fp8proj_fp8_gemm_create(wv.data_ptr(), ws.data_ptr(), n, k, max_m, None, _lib.ctypes.byref(h)),
                   "fp8proj.fp8_gemm")
        if hit is not None:
            if hit[2]() is not None and hit[3]() is not None and hit[4] == _version(wv) and hit[5] == _version(ws):
                self.retired.append(hit[0])  # the same weight, grown: a graph captured with it stays valid
            else:
                lib.fp8proj_fp8_gemm_destroy(hit[0])
        self.plans[key] = (h.value, max_m, _storage_ref(wv), _storage_ref(ws), _version(wv), _version(ws))
        return h.value


_GEMMS = _GemmPlans()


def _fp8_gemm_cuda(xv: torch.Tensor, xs: torch.Tensor, wv: torch.Tensor, ws: torch.Tensor):
    op = "fp8_gemm"
    _check_tensor(xv, op, "xv", _E4M3)
    _check_tensor(xs, op, "xs", _F32)
    _check_tensor(wv, op, "wv", _E4M3)
    _check_tensor(ws, op, "ws", _F32)
    _check(xv.dim() == 2 and wv.dim() == 2 and xs.dim() == 2 and ws.dim() == 2, op,
           "xv [M, K], xs [K/128, ld], wv [N, K] and ws [ceil(N/128), K/128] must be 2-D")
    m, k = xv.shape
    n = wv.shape[0]
    _check(wv.shape[1] == k, op, f"xv has K={k}, wv has K={wv.shape[1]}")
    _check(xs.shape[0] == _ceil128(k) and xs.shape[1] >= m and xs.shape[1] % 4 == 0, op,
           f"xs must be [K/128={_ceil128(k)}, ld >= M={m}, ld a multiple of 4], got {tuple(xs.shape)}")
    _check(tuple(ws.shape) == (_ceil128(n), _ceil128(k)), op,
           f"ws must be [{_ceil128(n)}, {_ceil128(k)}], got {tuple(ws.shape)}")
    _check_cuda(op, xv=xv, xs=xs, wv=wv, ws=ws)
    y = torch.empty((m, n), dtype=_BF16, device=xv.device)
    if m == 0:
        return y
    plan = _GEMMS.get(wv, ws, m)
    rc = _lib.LIB.fp8proj_fp8_gemm_run(plan, xv.data_ptr(), xs.data_ptr(), xs.shape[1], m, y.data_ptr(),
                                       _raw_stream(xv.get_device()))
    if rc:
        raise _lib.fail("fp8proj.fp8_gemm")
    return y


def _projection_for(op: str, weight: torch.Tensor, handle: int) -> "_handles.Projection":
    p = _handles.projection(handle)
    if weight.data_ptr() != p.weight_ptr:
        raise ValueError(f"fp8proj.{op}: weight is not the tensor projection '{p.name}' was made from (moved or "
                         "replaced since); rebuild the module (Fp8ProjLinear.refresh())")
    return p


def _linear_cuda(x: torch.Tensor, weight: torch.Tensor, handle: int):
    op = "linear"
    p = _projection_for(op, weight, handle)
    _check_tensor(x, op, "x", _BF16)
    m, k = _rows(x, op)
    _check(k == p.k, op, f"x has K={k}, projection '{p.name}' has K={p.k}")
    _check_cuda(op, x=x)
    _check(x.get_device() == p.device_index, op, f"x is on {x.device}, the projection on cuda:{p.device_index}")
    y = torch.empty(x.shape[:-1] + (p.n,), dtype=_BF16, device=x.device)
    if m and p.forward_fn(p.handle, x.data_ptr(), m, y.data_ptr(), _raw_stream(p.device_index)):
        raise _lib.fail(f"fp8proj.linear ({p.name})")
    return y


def _rmsnorm_linear_cuda(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, handle: int):
    op = "rmsnorm_linear"
    p = _projection_for(op, weight, handle)
    _check(p.rmsnorm_input, op, f"projection '{p.name}' was made without rmsnorm_input")
    _check_tensor(x, op, "x", _BF16, contiguous=False)
    _check_tensor(norm_weight, op, "norm_weight", _BF16)
    x2 = _row_view(x, op)
    m, k = x2.shape
    _check(k == p.k, op, f"x has K={k}, projection '{p.name}' has K={p.k}")
    _check(norm_weight.shape == (k,), op, f"norm_weight must have shape ({k},), got {tuple(norm_weight.shape)}")
    _check_cuda(op, x=x, norm_weight=norm_weight)
    _check(norm_weight.get_device() == p.device_index, op, f"norm_weight is on {norm_weight.device}")
    _check(x.get_device() == p.device_index, op, f"x is on {x.device}, the projection on cuda:{p.device_index}")
    y = torch.empty(x.shape[:-1] + (p.n,), dtype=_BF16, device=x.device)
    if m and p.forward_rmsnorm_fn(p.handle, x2.data_ptr(), x2.stride(0) if m > 1 else k, norm_weight.data_ptr(),
                                  float(eps), m, y.data_ptr(), _raw_stream(p.device_index)):
        raise _lib.fail(f"fp8proj.rmsnorm_linear ({p.name})")
    return y


def gapped_columns(y: torch.Tensor, groups: int, split: int, gap: int) -> torch.Tensor:
    """y[..., N] with `gap` zero columns inserted after the first `split` of each of `groups`
    equal column groups: [..., N + groups * gap] (what linear_gapped returns, from a dense output)."""
    n = y.shape[-1]
    per = n // groups
    out = y.new_empty(y.shape[:-1] + (n + groups * gap,))
    dst, src = out.view(-1, groups, per + gap), y.reshape(-1, groups, per)
    dst[..., :split].copy_(src[..., :split])
    dst[..., split:split + gap].zero_()
    dst[..., split + gap:].copy_(src[..., split:])
    return out


def _check_gapped(op, weight, wv, ws, groups, split, gap, k):
    n = weight.shape[0]
    _check(groups > 0 and n % groups == 0, op, f"groups must divide N={n}, got {groups}")
    _check(0 <= split <= n // groups and gap >= 0, op,
           f"split must be in [0, N/groups={n // groups}] and gap >= 0, got split={split}, gap={gap}")
    n_gapped = n + groups * gap
    _check_tensor(wv, op, "wv", _E4M3)
    _check_tensor(ws, op, "ws", _F32)
    _check(tuple(wv.shape) == (n_gapped, k) and tuple(ws.shape) == (_ceil128(n_gapped), _ceil128(k)), op,
           f"wv must be [{n_gapped}, {k}] and ws [{_ceil128(n_gapped)}, {_ceil128(k)}] (N + groups x gap rows), "
           f"got {tuple(wv.shape)} and {tuple(ws.shape)}")
    return n_gapped


def _linear_gapped_cuda(x: torch.Tensor, weight: torch.Tensor, handle: int, wv: torch.Tensor, ws: torch.Tensor,
                        groups: int, split: int, gap: int):
    op = "linear_gapped"
    p = _projection_for(op, weight, handle)
    _check_tensor(x, op, "x", _BF16)
    m, k = _rows(x, op)
    _check(k == p.k, op, f"x has K={k}, projection '{p.name}' has K={p.k}")
    n_gapped = _check_gapped(op, weight, wv, ws, groups, split, gap, k)
    _check_cuda(op, x=x, wv=wv, ws=ws)
    _check(x.get_device() == p.device_index and wv.get_device() == p.device_index and
           ws.get_device() == p.device_index, op, f"x, wv and ws must be on cuda:{p.device_index}")
    if m == 0:
        return x.new_empty(x.shape[:-1] + (n_gapped,))
    if p.path(m) != "fp8":  # the layer's bf16 path, then the columns moved apart
        return gapped_columns(_linear_cuda(x, weight, handle), groups, split, gap)
    # The layer's numerics on the gapped copy: activations in 1x128 groups with UE8M0 scales.
    xv, xs = _quantize_activation_cuda(x.reshape(m, k), "ue8m0")
    return _fp8_gemm_cuda(xv, xs, wv, ws).view(x.shape[:-1] + (n_gapped,))


def _silu_mul_quantize_cuda(gate: torch.Tensor, up: torch.Tensor, scale_fmt: str = "ue8m0"):
    op = "silu_mul_quantize"
    fmt = scale_format(op, scale_fmt)
    _check_tensor(gate, op, "gate", _BF16, contiguous=False)
    _check_tensor(up, op, "up", _BF16, contiguous=False)
    _check(gate.shape == up.shape, op, f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape")
    g2, u2 = _row_view(gate, op), _row_view(up, op)
    m, k = g2.shape
    _check(k % 128 == 0 and k > 0, op, f"K={k} must be a positive multiple of 128 (1x128 scale groups)")
    stride = g2.stride(0) if m > 1 else k
    _check(m <= 1 or u2.stride(0) == stride, op, f"gate and up must have one row stride, got {g2.stride(0)} and "
           f"{u2.stride(0)}; pass .contiguous() copies")
    _check(stride % 8 == 0, op, f"the row stride {stride} must be a multiple of 8 elements (16-byte rows)")
    _check_cuda(op, gate=gate, up=up)
    _check(gate.device == up.device, op, f"gate is on {gate.device}, up on {up.device}")
    values, scales, ld = _activation_outputs(gate, m, k)
    if m == 0:
        return values, scales
    rc = _lib.LIB.fp8proj_silu_mul_quantize(g2.data_ptr(), u2.data_ptr(), stride, m, k, fmt, values.data_ptr(),
                                            scales.data_ptr(), ld, _raw_stream(gate.get_device()))
    if rc:
        raise _lib.fail("fp8proj.silu_mul_quantize")
    return values, scales


# ---- fake implementations (shapes only) ---------------------------------------------------------

def _quantize_activation_fake(x, scale_fmt="ue8m0"):
    scale_format("quantize_activation", scale_fmt)
    m, k = _rows(x, "quantize_activation")
    return x.new_empty(x.shape, dtype=_E4M3), x.new_empty((k // 128, _ceil4(m)), dtype=_F32)


def _rmsnorm_quantize_fake(x, weight, eps, scale_fmt="ue8m0"):
    return _quantize_activation_fake(x, scale_fmt)


def _silu_mul_quantize_fake(gate, up, scale_fmt="ue8m0"):
    _check(gate.shape == up.shape, "silu_mul_quantize", f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ "
           "in shape")
    return _quantize_activation_fake(gate, scale_fmt)


def _quantize_weight_fake(w, scale_fmt="ue8m0"):
    scale_format("quantize_weight", scale_fmt)
    n, k = w.shape
    return w.new_empty((n, k), dtype=_E4M3), w.new_empty((_ceil128(n), _ceil128(k)), dtype=_F32)


def _fp8_gemm_fake(xv, xs, wv, ws):
    return xv.new_empty((xv.shape[0], wv.shape[0]), dtype=_BF16)


def _linear_fake(x, weight, handle):
    return x.new_empty(x.shape[:-1] + (weight.shape[0],), dtype=_BF16)


def _rmsnorm_linear_fake(x, norm_weight, eps, weight, handle):
    return x.new_empty(x.shape[:-1] + (weight.shape[0],), dtype=_BF16)


def _linear_gapped_fake(x, weight, handle, wv, ws, groups, split, gap):
    return x.new_empty(x.shape[:-1] + (weight.shape[0] + groups * gap,), dtype=_BF16)


# ---- registration -------------------------------------------------------------------------------

_SCHEMAS = {
    "quantize_activation": ('quantize_activation(Tensor x, str scale_fmt="ue8m0") -> (Tensor, Tensor)',
                            _quantize_activation_cuda, _quantize_activation_fake),
    "rmsnorm_quantize": ('rmsnorm_quantize(Tensor x, Tensor weight, float eps, str scale_fmt="ue8m0") -> (Tensor, Tensor)',
                         _rmsnorm_quantize_cuda, _rmsnorm_quantize_fake),
    "silu_mul_quantize": ('silu_mul_quantize(Tensor gate, Tensor up, str scale_fmt="ue8m0") -> (Tensor, Tensor)',
                          _silu_mul_quantize_cuda, _silu_mul_quantize_fake),
    "quantize_weight": ('quantize_weight(Tensor w, str scale_fmt="ue8m0") -> (Tensor, Tensor)', _quantize_weight_cuda,
                        _quantize_weight_fake),
    "fp8_gemm": ("fp8_gemm(Tensor xv, Tensor xs, Tensor wv, Tensor ws) -> Tensor", _fp8_gemm_cuda, _fp8_gemm_fake),
    "linear": ("linear(Tensor x, Tensor weight, int handle) -> Tensor", _linear_cuda, _linear_fake),
    "rmsnorm_linear": ("rmsnorm_linear(Tensor x, Tensor norm_weight, float eps, Tensor weight, int handle) -> Tensor",
                       _rmsnorm_linear_cuda, _rmsnorm_linear_fake),
    "linear_gapped": ("linear_gapped(Tensor x, Tensor weight, int handle, Tensor wv, Tensor ws, int groups, int split, "
                      "int gap) -> Tensor", _linear_gapped_cuda, _linear_gapped_fake),
}


def _cpu_impl(name):
    def impl(*args, **kwargs):
        raise ValueError(f"fp8proj.{name}: got CPU tensors; the fp8proj ops run on CUDA tensors (a Hopper GPU). "
                         "fp8proj.torch's modules run bf16 on the CPU.")
    return impl


def _cuda_impl(name, fn):
    def impl(*args):
        _lib.raise_if_device_fault(f"fp8proj.{name}")
        if _lib.LIB is None or not _lib.device_status()[0]:
            raise _lib.Fp8ProjError(f"fp8proj.{name}: {cuda_status_reason()}")
        return fn(*args)
    return impl


def cuda_status_reason() -> str:
    ok, why = _lib.device_status()
    return "" if ok else why


def _load_kernels() -> str:
    """Loads libfp8proj_torch.so (python/csrc/torch_ops.cpp: C++ CUDA kernels of the ops over
    the stable ABI, one dispatcher hop per call instead of a Python frame) from beside the C
    library; returns where it came from, or "" when it is absent or does not load here (then
    the Python implementations above serve)."""
    if _lib.LIB is None or os.environ.get("FP8PROJ_TORCH_KERNELS", "1") == "0":
        return ""
    path = Path(_lib.LIB.path).with_name("libfp8proj_torch.so")
    if not path.exists():
        return ""
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as e:
        _log.info("fp8proj: %s did not load (%s); the torch ops use their Python implementations", path, e)
        return ""
    return str(path)


_LIBRARY = torch.library.Library("fp8proj", "DEF")
for _name, (_schema, _cuda, _fake) in _SCHEMAS.items():
    _LIBRARY.define(_schema)
KERNELS = _load_kernels()
# The ops whose CUDA kernel is C++ (libfp8proj_torch.so); the others get the Python one.
CPP_OPS = frozenset(n for n in _SCHEMAS if KERNELS and torch._C._dispatch_has_kernel_for_dispatch_key(
    f"fp8proj::{n}", "CUDA"))
for _name, (_schema, _cuda, _fake) in _SCHEMAS.items():
    if _name not in CPP_OPS:
        _LIBRARY.impl(_name, _cuda_impl(_name, _cuda), "CUDA")
    _LIBRARY.impl(_name, _cpu_impl(_name), "CPU")
    torch.library.register_fake(f"fp8proj::{_name}", _fake, lib=_LIBRARY)


# ---- Python wrappers with the ops' names --------------------------------------------------------

def quantize_activation(x: torch.Tensor, scale_fmt: str = "ue8m0"):
    return torch.ops.fp8proj.quantize_activation(x, scale_fmt)


def rmsnorm_quantize(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, scale_fmt: str = "ue8m0"):
    return torch.ops.fp8proj.rmsnorm_quantize(x, weight, eps, scale_fmt)


def silu_mul_quantize(gate: torch.Tensor, up: torch.Tensor, scale_fmt: str = "ue8m0"):
    return torch.ops.fp8proj.silu_mul_quantize(gate, up, scale_fmt)


def quantize_weight(w: torch.Tensor, scale_fmt: str = "ue8m0"):
    return torch.ops.fp8proj.quantize_weight(w, scale_fmt)


def fp8_gemm(xv: torch.Tensor, xs: torch.Tensor, wv: torch.Tensor, ws: torch.Tensor):
    return torch.ops.fp8proj.fp8_gemm(xv, xs, wv, ws)


def linear(x: torch.Tensor, weight: torch.Tensor, handle: int):
    return torch.ops.fp8proj.linear(x, weight, handle)


def rmsnorm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor, handle: int):
    return torch.ops.fp8proj.rmsnorm_linear(x, norm_weight, eps, weight, handle)


def linear_gapped(x: torch.Tensor, weight: torch.Tensor, handle: int, wv: torch.Tensor, ws: torch.Tensor,
                  groups: int, split: int, gap: int):
    return torch.ops.fp8proj.linear_gapped(x, weight, handle, wv, ws, groups, split, gap)
