"""Python owners of the C ABI's handles: a projection layer and a shared activation workspace.

A Projection is fp8proj::ProjectionLayer over a bf16 CUDA weight (the tensor must stay alive and
in place: the layer reads it on its bf16 path) with its private FP8 copy and workspaces, made
on the GPU at construction. The torch ops name it by an integer id (the op schema carries no
pointers): PROJECTIONS maps ids to live handles, so a stale id is a KeyError-turned-message, not
a wild pointer.
"""
from __future__ import annotations

from ctypes import byref, c_int, c_int64, c_size_t, c_void_p
from typing import Dict, Optional

from . import _lib

PATH_NAMES = {0: "none", 1: "bf16", 2: "fp8"}
SCALE_FORMATS = {"ue8m0": 0, "float": 1}  # FP8PROJ_SCALES_* (c_api.h)
SCALE_NAMES = {v: k for k, v in SCALE_FORMATS.items()}
PROJECTIONS: Dict[int, "Projection"] = {}


class Workspace:
    """Activation scratch for max_tokens rows of up to max_k columns, shared by projections
    whose calls are ordered (one stream): one per model instead of one per layer."""

    def __init__(self, max_tokens: int, max_k: int, with_bf16_rows: bool = False):
        lib = _lib.lib()
        h = c_void_p()
        _lib.check(lib.fp8proj_workspace_create(int(max_tokens), int(max_k), int(bool(with_bf16_rows)), byref(h)),
                   "fp8proj_workspace_create")
        self._h = h.value
        import torch
        self.device_index = torch.cuda.current_device()
        self.max_tokens, self.max_k, self.with_bf16_rows = int(max_tokens), int(max_k), bool(with_bf16_rows)

    @property
    def handle(self) -> int:
        return self._h

    def bytes(self) -> int:
        b = c_size_t()
        _lib.check(_lib.lib().fp8proj_workspace_bytes(self._h, byref(b)), "fp8proj_workspace_bytes")
        return b.value

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None and _lib.LIB is not None:  # _lib is None late in interpreter exit
            _lib.LIB.fp8proj_workspace_destroy(h)


class Projection:
    def __init__(self, weight, *, name: str, enabled: bool, apply_env: bool = True, policy: Optional[str] = None,
                 threshold: Optional[int] = None, decode_ceiling: Optional[int] = None,
                 max_tokens: Optional[int] = None, rmsnorm_input: bool = False, fp8_backend: Optional[str] = None,
                 workspace: Optional[Workspace] = None, weight_scales: Optional[str] = None):
        lib = _lib.lib()
        n, k = weight.shape
        opts = _lib.ProjectionOptions()
        _lib.check(lib.fp8proj_projection_options_init(byref(opts)), "fp8proj_projection_options_init")
        self._name_bytes = name.encode()  # kept alive for the call
        opts.name = self._name_bytes
        opts.enabled = int(bool(enabled))
        opts.policy = policy.encode() if policy else None
        opts.threshold = -1 if threshold is None else int(threshold)
        opts.decode_ceiling = -1 if decode_ceiling is None else int(decode_ceiling)
        opts.max_tokens = 0 if max_tokens is None else int(max_tokens)
        opts.rmsnorm_input = int(bool(rmsnorm_input))
        opts.apply_env = int(bool(apply_env))
        opts.fp8_backend = fp8_backend.encode() if fp8_backend else None
        opts.workspace = workspace.handle if workspace is not None else None
        h = c_void_p()
        fmt = SCALE_FORMATS.get(weight_scales or "ue8m0")
        if fmt is None:
            raise ValueError(f"fp8proj: {name}: scales must be 'ue8m0' or 'float', got {weight_scales!r}")
        _lib.check(lib.fp8proj_projection_create_scaled(weight.data_ptr(), n, k, byref(opts), fmt, byref(h)), name)
        self._h = h.value
        self._workspace = workspace  # the C++ layer holds it too; this keeps the Python owner alive
        self.name, self.n, self.k = name, int(n), int(k)
        self.weight_ptr = weight.data_ptr()
        self.device_index = weight.get_device()
        self.rmsnorm_input = bool(rmsnorm_input)
        self.has_fp8 = self.memory()["fp8_values"] > 0
        pid = c_int64()
        _lib.check(lib.fp8proj_projection_id(self._h, byref(pid)), name)
        self.id = pid.value  # the C ABI's id: the ops' int argument, also for the C++ kernels
        PROJECTIONS[self.id] = self
        # Bound once: the hot path looks these up per call otherwise.
        self.forward_fn = lib.fp8proj_projection_forward
        self.forward_rmsnorm_fn = lib.fp8proj_projection_forward_rmsnorm

    @property
    def handle(self) -> int:
        return self._h

    def path(self, m: int, rmsnorm: bool = False) -> str:
        """The path of a call with m rows through forward, or with rmsnorm through
        forward_rmsnorm (the norm writes the FP8 input: a tuned bucket's GEMM-alone verdict)."""
        p = c_int()
        _lib.check(_lib.lib().fp8proj_projection_path_input(self._h, int(m), int(bool(rmsnorm)), byref(p)), self.name)
        return PATH_NAMES[p.value]

    def explain(self, m: int, rmsnorm: bool = False) -> str:
        return _lib.read_string(_lib.lib().fp8proj_projection_explain_input, self._h, int(m), int(bool(rmsnorm)))

    def weight_scales(self) -> str:
        """The FP8 copy's scale format after FP8PROJ_WEIGHT_SCALES: "ue8m0" or "float"."""
        f = c_int()
        _lib.check(_lib.lib().fp8proj_projection_weight_scales(self._h, byref(f)), self.name)
        return SCALE_NAMES[f.value]

    def memory(self) -> dict:
        v = [c_size_t() for _ in range(4)]
        _lib.check(_lib.lib().fp8proj_projection_memory(self._h, *(byref(x) for x in v)), self.name)
        return dict(zip(("bf16_weight", "fp8_values", "fp8_scales", "workspace"), (x.value for x in v)))

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        # At interpreter exit module globals may already be None: nothing is left to free then.
        if PROJECTIONS is not None:
            PROJECTIONS.pop(getattr(self, "id", None), None)
        if h and _lib is not None and _lib.LIB is not None:
            _lib.LIB.fp8proj_projection_destroy(h)

    def __del__(self):
        self.close()


def projection(handle: int) -> Projection:
    try:
        return PROJECTIONS[handle]
    except KeyError:
        raise ValueError(f"fp8proj: projection handle {handle} is not live (its module was deleted or rebuilt)") \
            from None
