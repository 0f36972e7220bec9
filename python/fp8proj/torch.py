"""nn.Modules over the gated projection layer: Fp8ProjLinear (a drop-in for nn.Linear) and
Fp8ProjRMSNormLinear (an RMSNorm followed by a projection, fused: q_a_layernorm + q_b_proj).

The bf16 weight stays THE module parameter (`weight`, same Parameter object as the original
nn.Linear's), so state_dict keys and values are unchanged; the FP8 copy (e4m3 + 128x128
scales) and the workspaces are private to the C++ layer, made on the GPU when the module is
built (and again after .to()/.cuda() or load_state_dict()). They are not torch buffers: they
are not saved, and extra_memory_bytes() says how much they take.

Per call the C++ layer's M-gate picks bf16 (decode-sized batches) or FP8 (prefill), with the
same tuned tables, backends and FP8PROJ_* knobs as in C++ (the environment wins over the
arguments, as there). A module whose layer holds no FP8 copy -- FP8 off (the default), a shape
that is not a multiple of 128, no Hopper GPU, a CPU or non-bf16 weight -- runs torch's own ops on
the original weight, exactly the module it replaced, and says why once in the log.

Eager calls go straight to the C ABI (no dispatcher); under torch.compile the same work is the
op torch.ops.fp8proj.linear / rmsnorm_linear, so graphs have no break.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import _handles, _lib
from . import ops as _ops

__all__ = ["Fp8ProjLinear", "Fp8ProjRMSNormLinear", "DeferredRMSNorm", "Workspace"]

log = logging.getLogger("fp8proj")
# The ops' C++ kernels (libfp8proj_torch.so) when they loaded: the modules' eager calls go through
# them (one dispatcher hop); otherwise straight to the C ABI through ctypes.
_CPP_LINEAR = torch.ops.fp8proj.linear.default if "linear" in _ops.CPP_OPS else None
_CPP_RMSNORM_LINEAR = torch.ops.fp8proj.rmsnorm_linear.default if "rmsnorm_linear" in _ops.CPP_OPS else None
_BF16 = torch.bfloat16
_raw_stream = torch._C._cuda_getCurrentRawStream
_said = set()
Workspace = _handles.Workspace


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        log.warning("fp8proj: projections run bf16 (torch's matmul on the original weight): %s", reason)


def _fp8_wanted(enabled: bool) -> bool:
    """The opt-in as the C++ layer reads it: FP8PROJ_PREFILL_FP8, when set, wins over `enabled`
    (a malformed value counts as on, so that the layer is made and its error names the knob)."""
    v = os.environ.get("FP8PROJ_PREFILL_FP8")
    if v is None:
        return bool(enabled)
    return v.strip().lower() not in ("0", "off", "false", "no")


def _wants_grad(*tensors) -> bool:
    # The FP8 ops have no backward: where autograd would need one, the module runs torch's bf16
    # ops instead (exact gradients), and says so once. Inference runs under torch.no_grad() or
    # torch.inference_mode() and never gets here.
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        if not torch.compiler.is_compiling():
            _say_once("autograd is recording and the inputs require grad (the FP8 ops have no backward; run "
                      "inference under torch.no_grad() or torch.inference_mode())")
        return True
    return False


def _norm_eps(norm: nn.Module) -> float:
    for attr in ("variance_epsilon", "eps"):
        v = getattr(norm, attr, None)
        if isinstance(v, (int, float)):
            return float(v)
    raise ValueError(f"fp8proj: {type(norm).__name__} has no variance_epsilon / eps attribute")


class _GatedBase(nn.Module):
    """The state both modules share: the C++ layer (or the reason there is none)."""

    _rmsnorm_input = False

    def _setup(self, weight: nn.Parameter, bias: Optional[nn.Parameter], name: str, options: dict,
               workspace: Optional[Workspace]):
        if weight.dim() != 2:
            raise ValueError(f"fp8proj: {name}: weight must be 2-D [N, K], got shape {tuple(weight.shape)}")
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        if bias is not None and not isinstance(bias, nn.Parameter):
            bias = nn.Parameter(bias, requires_grad=False)
        self.bias = bias
        self.out_features, self.in_features = (int(s) for s in weight.shape)
        self.name = name
        self._options = options
        self._workspace = workspace
        self._proj: Optional[_handles.Projection] = None
        self._fp8 = False
        self._why_bf16 = ""
        self._built_for = None
        self.refresh()
        self.register_load_state_dict_post_hook(lambda module, incompatible: module.refresh())

    # -- the C++ layer ----------------------------------------------------------------------------
    def _reason_no_layer(self) -> str:
        ok, why = _lib.device_status()
        w = self.weight
        if not ok:
            return why
        if w.device.type != "cuda":
            return f"weight is on {w.device} (the FP8 copy is made on the GPU)"
        if w.dtype != _BF16:
            return f"weight is {w.dtype}, not bfloat16"
        if not w.is_contiguous():
            return "weight is not contiguous"
        return ""

    def refresh(self) -> None:
        """Rebuild the C++ layer (and the FP8 copy) from the current weight: after the weight
        moved, changed dtype, or was loaded. Synchronises (construction), so never in a graph."""
        if self._proj is not None:
            self._proj.close()
        self._proj, self._fp8, self._why_bf16 = None, False, ""
        w = self.weight
        self._built_for = (w.data_ptr(), w.device, w.dtype)
        self._weight_version = _ops._version(w)
        why = self._reason_no_layer()
        if not why and not _fp8_wanted(self._options["enabled"]):
            # No layer at all: it would hold a bf16 GEMM plan (and its 32 MiB cuBLASLt workspace)
            # that this module never calls.
            self._why_bf16 = "FP8 is off (enabled=False and FP8PROJ_PREFILL_FP8 unset or 0, the default)"
            return
        if not why:
            ws = self._workspace
            if ws is not None and (ws.device_index != w.get_device() or ws.max_k < self.in_features or
                                   (self._rmsnorm_input and not ws.with_bf16_rows)):
                ws = None
            try:
                # The C++ layer quantizes the weight on the legacy default stream; the weight may
                # have been written on one of torch's non-blocking streams.
                torch.cuda.synchronize(w.device)
                self._proj = _handles.Projection(w.detach(), name=self.name, rmsnorm_input=self._rmsnorm_input,
                                                 workspace=ws, **self._options)
            except _lib.DeviceFaultError:
                raise  # not a reason to stay bf16: the CUDA context is gone
            except _lib.Fp8ProjError as e:
                why = str(e)
        if self._proj is not None:
            self._fp8 = self._proj.has_fp8
            if not self._fp8:
                try:
                    why = self._proj.explain(4096).split(" -- ", 1)[-1]
                except _lib.Fp8ProjError as e:
                    why = str(e)
                self._why_bf16 = "the layer holds no FP8 copy: " + why
        else:
            self._why_bf16 = why
            _say_once(why)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        w = self.weight
        if (w.data_ptr(), w.device, w.dtype) != self._built_for:
            self.refresh()
        return out

    def _stale(self) -> bool:
        return self.weight.data_ptr() != self._proj.weight_ptr or _ops._version(self.weight) != self._weight_version

    def _check_weight_in_place(self):
        # The layer reads the weight through the pointer it was made with and holds an FP8 copy
        # of its values: a Parameter swapped (param.data = ...) or changed in place (its version
        # counter moved) gets a new layer, said each time (it synchronises).
        log.warning("fp8proj: %s: weight moved or changed since the layer was made; rebuilding it", self.name)
        self.refresh()

    # -- queries ----------------------------------------------------------------------------------
    @property
    def handle(self) -> Optional[int]:
        """The id torch.ops.fp8proj.linear / rmsnorm_linear take for this module's C++ layer
        (None while there is none: FP8 off, no Hopper GPU, a CPU weight)."""
        return self._proj.id if self._proj is not None else None

    def uses_fp8(self, m: int) -> bool:
        """True when a call with m rows runs the FP8 path."""
        return self._fp8 and self._proj.path(m, rmsnorm=self._rmsnorm_input) == "fp8"

    def explain(self, m: int) -> str:
        """Which path a call with m rows takes, through which backend and configuration, and why."""
        if self._proj is None:
            return f"M={m}: bf16 via torch (F.linear on the original weight) -- {self._why_bf16}"
        if not self._fp8:
            return f"M={m}: bf16 via torch (F.linear on the original weight) -- {self._why_bf16}"
        return self._proj.explain(m, rmsnorm=self._rmsnorm_input)

    def weight_scales(self) -> str:
        """The FP8 copy's scale format ("ue8m0" or "float", FP8PROJ_WEIGHT_SCALES applied); what a
        layer would use while there is none."""
        if self._proj is not None:
            return self._proj.weight_scales()
        env = os.environ.get("FP8PROJ_WEIGHT_SCALES")
        return env if env in _handles.SCALE_FORMATS else (self._options.get("weight_scales") or "ue8m0")

    def extra_memory_bytes(self) -> int:
        """Device bytes this module adds to the bf16 weight: the FP8 copy, its scales, and the
        workspaces it owns (a shared workspace is counted by its owner, fp8proj.torch.Workspace)."""
        if self._proj is None:
            return 0
        mem = self._proj.memory()
        return mem["fp8_values"] + mem["fp8_scales"] + mem["workspace"]

    def memory(self) -> dict:
        return self._proj.memory() if self._proj is not None else {
            "bf16_weight": self.weight.numel() * self.weight.element_size(), "fp8_values": 0, "fp8_scales": 0,
            "workspace": 0}

    def extra_repr(self) -> str:
        path = "fp8 above the gate" if self._fp8 else "bf16 (torch)"
        return f"name={self.name!r}, in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}, path={path}"


def _options(enabled, policy, threshold, decode_ceiling, max_tokens, fp8_backend, scales=None) -> dict:
    if policy is not None and policy not in ("prefill", "all"):
        raise ValueError(f"fp8proj: policy must be 'prefill' or 'all', got {policy!r}")
    if scales is not None and scales not in _handles.SCALE_FORMATS:
        raise ValueError(f"fp8proj: scales must be 'ue8m0' or 'float', got {scales!r}")
    return dict(enabled=bool(enabled) if enabled is not None else False, apply_env=True, policy=policy,
                threshold=threshold, decode_ceiling=decode_ceiling, max_tokens=max_tokens, fp8_backend=fp8_backend,
                weight_scales=scales)


class Fp8ProjLinear(_GatedBase):
    """y = x . weight^T (+ bias) through the gated projection layer. Drop-in for nn.Linear."""

    def __init__(self, weight, bias=None, *, name: str = "projection", enabled: Optional[bool] = None,
                 policy: Optional[str] = None, threshold: Optional[int] = None, decode_ceiling: Optional[int] = None,
                 max_tokens: Optional[int] = None, fp8_backend: Optional[str] = None,
                 workspace: Optional[Workspace] = None, scales: Optional[str] = None):
        super().__init__()
        self._setup(weight, bias, name,
                    _options(enabled, policy, threshold, decode_ceiling, max_tokens, fp8_backend, scales), workspace)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, name: str, enabled: Optional[bool] = None, policy: Optional[str] = None,
                    threshold: Optional[int] = None, decode_ceiling: Optional[int] = None,
                    max_tokens: Optional[int] = None, fp8_backend: Optional[str] = None,
                    workspace: Optional[Workspace] = None, scales: Optional[str] = None) -> "Fp8ProjLinear":
        """The module for `linear`, sharing its weight (and bias) Parameters. enabled=None: from
        FP8PROJ_PREFILL_FP8 (off by default); scales: the FP8 copy's scale format, "ue8m0" (None:
        the default) or "float"; the FP8PROJ_* knobs override the arguments."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"fp8proj: from_linear needs an nn.Linear, got {type(linear).__name__}")
        return cls(linear.weight, linear.bias, name=name, enabled=enabled, policy=policy, threshold=threshold,
                   decode_ceiling=decode_ceiling, max_tokens=max_tokens, fp8_backend=fp8_backend, workspace=workspace,
                   scales=scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._fp8 or x.dtype != _BF16 or _wants_grad(x, self.weight):
            if self._fp8 and x.is_cuda and not torch.compiler.is_compiling():  # a dead context is ours to name
                _lib.check_device_fault(self.name)
            return F.linear(x, self.weight, self.bias)
        x = x.contiguous()
        if torch.compiler.is_compiling():
            y = torch.ops.fp8proj.linear(x, self.weight, self._proj.id)
        else:
            y = self._eager(x)
        return y if self.bias is None else y + self.bias

    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        p = self._proj
        if self._stale():
            self._check_weight_in_place()
            return self.forward(x)
        if _CPP_LINEAR is not None:  # the C++ kernel: checks and launch without a Python frame
            return _CPP_LINEAR(x, self.weight, p.id)
        k = x.shape[-1]
        if k != p.k or x.get_device() != p.device_index:
            return _ops._linear_cuda(x, self.weight, p.id)  # raises, naming the mismatch
        m = x.numel() // k
        y = torch.empty(x.shape[:-1] + (p.n,), dtype=_BF16, device=x.device)
        if m and p.forward_fn(p.handle, x.data_ptr(), m, y.data_ptr(), _raw_stream(p.device_index)):
            raise _lib.fail(f"fp8proj.linear ({p.name})")
        return y


class DeferredRMSNorm(nn.Module):
    """Stands where an RMSNorm was when the projection after it fused the norm: keeps the norm's
    weight Parameter under the same name (state_dict unchanged) and passes its input through.
    Only installed where the norm's output feeds that projection alone."""

    def __init__(self, norm: nn.Module, consumer: str):
        super().__init__()
        self.weight = norm.weight
        self.__dict__["original"] = norm  # not a submodule: its weight is already ours
        self.consumer = consumer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{type(self.original).__name__}({tuple(self.weight.shape)}) applied inside {self.consumer}"


class Fp8ProjRMSNormLinear(_GatedBase):
    """y = rmsnorm(x) * norm.weight . weight^T, the norm fused into the activation quantization on
    the FP8 path. x may be a row-strided view (x.stride(-1) == 1). Holds `weight` (+ `bias`);
    the norm's weight stays with `self.norm_passthrough`, a DeferredRMSNorm to install where the
    norm was, so that a model's state_dict keeps both names."""

    _rmsnorm_input = True

    def __init__(self, norm: nn.Module, linear: nn.Linear, *, name: str, enabled: Optional[bool] = None,
                 policy: Optional[str] = None, threshold: Optional[int] = None, decode_ceiling: Optional[int] = None,
                 max_tokens: Optional[int] = None, fp8_backend: Optional[str] = None,
                 workspace: Optional[Workspace] = None, scales: Optional[str] = None):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"fp8proj: {name}: needs an nn.Linear, got {type(linear).__name__}")
        nw = getattr(norm, "weight", None)
        if not isinstance(nw, torch.Tensor) or nw.shape != (linear.in_features,):
            raise ValueError(f"fp8proj: {name}: the norm's weight must have shape ({linear.in_features},), got "
                             f"{None if nw is None else tuple(nw.shape)}")
        self.__dict__["_norm"] = norm  # the original module: the bf16 path runs it as it was
        self.eps = _norm_eps(norm)
        self.__dict__["norm_passthrough"] = DeferredRMSNorm(norm, name)
        self._setup(linear.weight, linear.bias, name,
                    _options(enabled, policy, threshold, decode_ceiling, max_tokens, fp8_backend, scales), workspace)

    @classmethod
    def from_modules(cls, norm: nn.Module, linear: nn.Linear, *, name: str, **options) -> "Fp8ProjRMSNormLinear":
        return cls(norm, linear, name=name, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nw = self._norm.weight
        if not self._fp8 or x.dtype != _BF16 or nw.dtype != _BF16 or _wants_grad(x, self.weight, nw):
            if self._fp8 and x.is_cuda and not torch.compiler.is_compiling():
                _lib.check_device_fault(self.name)
            return F.linear(self._norm(x), self.weight, self.bias)
        if x.stride(-1) != 1:
            x = x.contiguous()
        if torch.compiler.is_compiling():
            y = torch.ops.fp8proj.rmsnorm_linear(x, nw, self.eps, self.weight, self._proj.id)
        else:
            y = self._eager(x, nw)
        return y if self.bias is None else y + self.bias

    def _eager(self, x: torch.Tensor, nw: torch.Tensor) -> torch.Tensor:
        p = self._proj
        if self._stale():
            self._check_weight_in_place()
            return self.forward(x)
        if _CPP_RMSNORM_LINEAR is not None:
            return _CPP_RMSNORM_LINEAR(x, nw, self.eps, self.weight, p.id)
        k = x.shape[-1]
        if x.dim() != 2 or k != p.k or x.get_device() != p.device_index or nw.get_device() != p.device_index:
            return _ops._rmsnorm_linear_cuda(x, nw, self.eps, self.weight, p.id)  # checks, views, names mismatches
        m = x.shape[0]
        y = torch.empty((m, p.n), dtype=_BF16, device=x.device)
        if m and p.forward_rmsnorm_fn(p.handle, x.data_ptr(), x.stride(0) if m > 1 else k, nw.data_ptr(), self.eps,
                                      m, y.data_ptr(), _raw_stream(p.device_index)):
            raise _lib.fail(f"fp8proj.rmsnorm_linear ({p.name})")
        return y
