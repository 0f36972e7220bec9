"""FP8 checkpoints' linear layers through fp8proj's block-scaled GEMM.

DeepSeek-V3/R1, Kimi-K2 and GLM-5-FP8 ship e4m3 weights with one `weight_scale_inv` per 128x128
block (fp32, not powers of two; some newer checkpoints UE8M0). transformers loads them as
`FP8Linear` (or quantizes a bf16 model on load with `FineGrainedFP8Config`), whose forward needs
DeepGEMM or a Triton kernel fetched from the hub by the `kernels` package: offline it raises
ImportError. `Fp8CheckpointLinear` runs such a module with fp8proj instead, on the module's own
tensors as they are -- no bf16 copy, no re-quantization, no hub kernel, no JIT:

    y = dequant(quant(x)) . dequant(weight, weight_scale_inv)^T (+ bias)

  weight            the module's e4m3 [N, K] Parameter (shared, not copied)
  weight_scale_inv  the module's fp32 [ceil(N/128), ceil(K/128)] Parameter (shared); UE8M0 scales
                    (float8_e8m0fnu, or their raw bytes) are widened once to an fp32 tensor of the
                    same shape -- exact, 4 bytes per 128x128 block, reported as extra memory
  x                 quantized per call in 1x128 groups with fp32 scales: scale = fl32(max(amax,
                    1e-10) / 448), code = e4m3(fl32(x / scale)) (ScaleMode::fp32, formats.hpp).

That activation rule is the dynamic one these modules run elsewhere: transformers' Triton
finegrained-fp8 kernel (amax / 448, x / scale; it floors the scale at 1e-12 instead of clamping
amax at 1e-10, which only differs for groups with amax below 4.5e-10) and SGLang's / vLLM's
per_token_group_quant_fp8 (the same rule). transformers' DeepGEMM path quantizes with
DeepGEMM's per_token_cast_to_fp8, which multiplies by 1/scale and clamps amax at 1e-4: on
Gaussian bf16 activations that gives another e4m3 code for about 5 in 10^4 values
(python/tests/test_fp8_checkpoint.py measures it), one unit in the last place of e4m3 each.

Per call: with fp8proj's CUDA library on a Hopper GPU, the ops torch.ops.fp8proj.quantize_activation
(x, "float") and torch.ops.fp8proj.fp8_gemm -- graph-capturable, traced by torch.compile as
single nodes. Elsewhere (a CPU, another GPU, no library) the same numerics in torch: the weight
dequantized per call and an fp32 product, slow but it runs, said once in the log.

Modules that read one input (q_a_proj and kv_a_proj_with_mqa of an MLA attention: both project
the hidden states) can hold one SharedActivation: the first one called quantizes the input, the
other reuses those codes and scales (see SharedActivation for when it may). Better, where their
weights can be laid end to end (fuse_pair_skip_reason), they hold one FusedPair: their weights
and scales become row ranges of one buffer (no extra memory), the first one called runs one
quantization and one GEMM over both, the other takes its columns of that output.
"""
from __future__ import annotations

import ctypes
import inspect
import logging
import re
from typing import List, Optional, Tuple

import torch
from torch import nn

from . import _lib
from .ops import _ceil4, _version

__all__ = ["Fp8CheckpointLinear", "fp8_linear_class", "fp8_linear_skip_reason", "is_fp8_checkpoint_module",
           "quantize_activation_float_reference", "quantize_activation_reference", "dequantize_weight",
           "block_fp8_skip_reason", "activation_scale_format", "block_fp8_linear", "block_fp8_linear_reference",
           "scales_as_fp32", "SharedActivation", "FusedPair", "fuse_pair_skip_reason", "GatedMLP",
           "gated_mlp_skip_reason"]

log = logging.getLogger("fp8proj")
_E4M3 = torch.float8_e4m3fn
_E8M0 = getattr(torch, "float8_e8m0fnu", None)
_said = set()


def _say_once(reason: str) -> None:
    if reason not in _said:
        _said.add(reason)
        log.warning("fp8proj: FP8 checkpoint layers run fp8proj's numerics in torch (slow): %s", reason)


def fp8_linear_class():
    """transformers' FP8Linear class, or None where this transformers has none."""
    try:
        from transformers.integrations.finegrained_fp8 import FP8Linear
    except Exception:  # noqa: BLE001 - an older or broken transformers simply has no FP8 layers to take
        return None
    return FP8Linear


def is_fp8_checkpoint_module(m: nn.Module) -> bool:
    """Any module of transformers' fine-grained FP8 integration (FP8Linear and its subclasses,
    FP8Experts, FP8Embedding): the modules patch() reports on."""
    return type(m).__module__.endswith("integrations.finegrained_fp8") or any(
        c.__module__.endswith("integrations.finegrained_fp8") for c in type(m).__mro__[1:-1])


def fp8_linear_skip_reason(m: nn.Module) -> str:
    """"" when fp8proj can run this module as it is, else why not (for the patch report)."""
    cls = fp8_linear_class()
    name = type(m).__name__
    if cls is None or not isinstance(m, cls):
        if "Experts" in name:
            return f"MoE experts ({name}): per-expert grouped GEMMs, not a dense linear layer"
        return f"a {name}, not an FP8Linear"
    if type(m) is not cls:
        return f"a {name} (block-diagonal grouped linear), not a plain FP8Linear"
    w, s = m.weight, getattr(m, "weight_scale_inv", None)
    if w.dtype != _E4M3:
        return f"weight is {w.dtype}, not float8_e4m3fn (FP4-packed or dequantized)"
    if w.dim() != 2:
        return f"weight has shape {tuple(w.shape)}, not [N, K]"
    block = getattr(m, "block_size", None)
    if block is None:
        return "per-tensor weight scale (block_size None), not 128x128 blocks"
    if tuple(block) != (128, 128):
        return f"block_size {tuple(block)}, not (128, 128)"
    scheme = getattr(m, "activation_scheme", "dynamic")
    if scheme != "dynamic":
        return f"activation_scheme {scheme!r}: a calibrated per-tensor input scale, not 1x128 dynamic groups"
    if getattr(m, "activation_scale", None) is not None:
        return "has a static activation_scale"
    return block_fp8_skip_reason(w, s)


def block_fp8_skip_reason(w: torch.Tensor, s: Optional[torch.Tensor], scales_name: str = "weight_scale_inv") -> str:
    """"" when fp8proj's GEMM takes this weight and these block scales as they are, else why not.
    The tensors' own conditions, shared by every FP8-checkpoint path (transformers' FP8Linear, the
    engines' FP8 linear methods): a plain e4m3 [N, K] weight, row-major; one fp32 (or UE8M0) scale
    per 128x128 block, [ceil(N/128), ceil(K/128)] row-major; K a multiple of 128 (1x128 activation
    groups); N a multiple of 16 (the kernel's 16-byte output rows); both on one device."""
    if w.dtype != _E4M3:
        return f"weight is {w.dtype}, not float8_e4m3fn (FP4-packed or dequantized)"
    if w.dim() != 2:
        return f"weight has shape {tuple(w.shape)}, not [N, K]"
    if not w.is_contiguous():
        return f"weight has strides {tuple(w.stride())}, not row-major [N, K] (transposed or re-laid out)"
    n, k = w.shape
    if s is None or s.dtype not in (torch.float32, torch.uint8) + ((_E8M0,) if _E8M0 is not None else ()):
        return f"{scales_name} is {None if s is None else s.dtype}, neither fp32 nor UE8M0"
    want = (-(-n // 128), -(-k // 128))
    if tuple(s.shape) != want:
        return f"{scales_name} has shape {tuple(s.shape)}, not {want} (one scale per 128x128 block)"
    if not s.is_contiguous():
        return f"{scales_name} has strides {tuple(s.stride())}, not row-major (re-laid out)"
    if k % 128 or n % 16:
        return (f"K={k} is not a multiple of 128 (1x128 activation groups)" if k % 128 else
                f"N={n} is not a multiple of 16 (16-byte output rows)")
    if w.device != s.device:
        return f"weight on {w.device}, {scales_name} on {s.device}"
    return ""


def scale_format_of(s: torch.Tensor) -> str:
    return "float" if s.dtype == torch.float32 else "ue8m0"


def scales_as_fp32(s: torch.Tensor) -> Optional[torch.Tensor]:
    """None for fp32 scales (used as they are); UE8M0 ones widened exactly to fp32."""
    if s.dtype == torch.float32:
        return None
    if s.dtype == torch.uint8:  # the raw exponent bytes: 2^(b - 127)
        return torch.ldexp(torch.ones_like(s, dtype=torch.float32), s.to(torch.int32) - 127)
    return s.detach().to(torch.float32)


def dequantize_weight(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] = e4m3 values times their block's scale (the last row block may be partial)."""
    n, k = w.shape
    s = scales.to(torch.float32) if scales.dtype != torch.uint8 else scales_as_fp32(scales)
    full = s.repeat_interleave(128, dim=0)[:n].repeat_interleave(128, dim=1)[:, :k]
    return w.to(torch.float32) * full


def activation_scale_format(scale_fmt: Optional[str]) -> str:
    """fp8proj's activation scale format ("ue8m0" or "float", ops.SCALE_FORMATS) for a checkpoint's
    `scale_fmt`: a "ue8m0" checkpoint's activations get power-of-two scales, any other (None,
    "float") fp32 amax/448 -- the rule of SGLang 0.5.23's Fp8LinearMethod (act_scale_ue8m0 =
    quant_config.scale_fmt == "ue8m0", then per-token-group quantization with scale_ue8m0), so a
    taken layer computes what the engine's own kernels compute."""
    return "ue8m0" if scale_fmt == "ue8m0" else "float"


def quantize_activation_float_reference(x2: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes e4m3 [M, K], scales fp32 [M, K/128]) of the fp32 rule, in torch: the reference the
    CPU path runs (and the tests check against numpy). A group holding NaN or Inf gets a NaN scale
    and NaN codes, as fp8proj's kernels give it."""
    return quantize_activation_reference(x2, "float")


def quantize_activation_reference(x2: torch.Tensor, scale_fmt: str = "float") -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes e4m3 [M, K], scales fp32 [M, K/128]) in torch, for either activation rule of
    formats.hpp: "float" scale = fl32(max(amax, 1e-10) / 448), codes e4m3(x / scale); "ue8m0" the
    power of two at or above that quotient (exponent + (mantissa != 0) of the fp32 quotient), codes
    e4m3(x * 2^-e), exact."""
    if scale_fmt not in ("float", "ue8m0"):
        raise ValueError(f"fp8proj: scale_fmt must be 'ue8m0' or 'float', got {scale_fmt!r}")
    m, k = x2.shape
    g = x2.to(torch.float32).view(m, k // 128, 128)
    finite = torch.isfinite(g).all(dim=-1, keepdim=True)
    amax = torch.where(torch.isfinite(g), g.abs(), torch.zeros((), dtype=torch.float32)).amax(-1, keepdim=True)
    # A tensor divisor: torch divides by a Python scalar as a multiplication by its reciprocal on
    # CUDA, which is not the rule (formats.hpp); tensor / tensor is IEEE division on CPU and GPU.
    s = amax.clamp_min(1e-10) / torch.full_like(amax, 448.0)
    if scale_fmt == "ue8m0":
        mant, exp = torch.frexp(s)  # s = mant * 2^exp, mant in [0.5, 1): a power of two iff mant == 0.5
        s = torch.ldexp(torch.ones_like(s), torch.where(mant == 0.5, exp - 1, exp))
    q = (g / s).clamp(-448.0, 448.0).to(_E4M3)
    nan = torch.full((), float("nan"))
    q = torch.where(finite, q.to(torch.float32), nan).to(_E4M3)
    s = torch.where(finite, s, nan)
    return q.view(m, k), s.view(m, k // 128)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x as the contiguous [M, K] rows the quantizers read."""
    x2 = x.reshape(-1, k)
    return x2 if x2.is_contiguous() else x2.contiguous()


def block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, act_fmt: str = "float",
                     bias: Optional[torch.Tensor] = None,
                     quantized: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """y[..., N] = quant(x) . dequant(weight, scales)^T (+ bias) through fp8proj's torch ops on a
    Hopper GPU: quantize_activation(x, act_fmt) in 1x128 groups, then fp8_gemm on the weight and
    its fp32 block scales as they are (block_fp8_skip_reason says which ones qualify; UE8M0 scales
    are widened to fp32 first). x bf16 [..., K]; the bias is added in the output's dtype.
    quantized: quantize_activation's (codes, scales) of these very rows, made already (a
    SharedActivation's), instead of quantizing again."""
    n, k = weight.shape
    xv, xs = quantized if quantized is not None else torch.ops.fp8proj.quantize_activation(_rows(x, k), act_fmt)
    y = torch.ops.fp8proj.fp8_gemm(xv, xs, weight, scales)
    if bias is not None:
        y = y.add_(bias)
    return y.view(*x.shape[:-1], n)


def block_fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, act_fmt: str = "float",
                               bias: Optional[torch.Tensor] = None,
                               quantized: Optional[Tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """block_fp8_linear's numerics in torch, on any device: the activations quantized by the same
    rule, the weight dequantized, an fp32 product rounded to x's dtype (slow; the CPU path and the
    tests' reference). quantized: quantize_activation_reference's (codes, scales) of these rows,
    made already."""
    n, k = weight.shape
    q, s = quantized if quantized is not None else quantize_activation_reference(x.reshape(-1, k), act_fmt)
    xd = (q.to(torch.float32).view(-1, k // 128, 128) * s.unsqueeze(-1)).view_as(q)
    y = (xd @ dequantize_weight(weight, scales).T).to(x.dtype)
    if bias is not None:
        y = y.add_(bias.to(y.dtype))
    return y.view(*x.shape[:-1], n)


def _norm_and_quantize(norm: nn.Module, eps: float, x: torch.Tensor, k: int, kernel: bool):
    """An RMSNorm fused into the quantization of the rows after it: (x, rmsnorm_quantize's (codes,
    fp32 scales)) on the kernel path (a bf16 norm weight on x's device, no autograd recorded), else
    (norm(x), None) -- the norm module as the model had it, its output quantized as any input."""
    nw = norm.weight
    if kernel and nw.dtype == torch.bfloat16 and nw.device == x.device and not (
            torch.is_grad_enabled() and nw.requires_grad):
        x2 = x.reshape(-1, k)  # a row-strided view is read as it is
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        return x, torch.ops.fp8proj.rmsnorm_quantize(x2, nw.detach(), eps, "float")
    return norm(x), None


def _checked_norm_weight(norm: nn.Module, k: int, who: str) -> None:
    nw = getattr(norm, "weight", None)
    if not isinstance(nw, torch.Tensor) or tuple(nw.shape) != (k,):
        raise ValueError(f"fp8proj: {who}: the norm's weight must have shape ({k},), got "
                         f"{None if nw is None else tuple(nw.shape)}")


def _capturing_graph():
    """None outside a CUDA graph capture; inside one the graph being captured, or False where this
    torch cannot say which. Part of a SharedActivation entry's key: codes kept outside a capture
    (or in another graph's) hold values of that time, which a replay of this graph would not
    refresh, so they may be used only in the capture that made them."""
    if not torch.cuda.is_current_stream_capturing():
        return None
    get = getattr(torch.cuda.CUDAGraph, "get_currently_capturing_graph", None)
    try:
        graph = get() if get is not None else None
    except Exception:  # noqa: BLE001 - not knowing the graph only means not sharing
        graph = None
    return graph if graph is not None else False


class _OneInputGroup:
    """Modules that read one input, handing one call's result on to the others (SharedActivation,
    FusedPair). The entry rule is the same for both; see SharedActivation's doc."""

    def __init__(self):
        self.members: List[str] = []
        self._entry = None  # (input, its version, key, payload, members still to use it)
        self.hits = 0       # host-side counts, to check that sharing happens (the tests read them)
        self.quantizations = 0

    @property
    def holding(self) -> bool:
        """True while an input and its result are kept for a member still to come."""
        return self._entry is not None

    def clear(self) -> None:
        self._entry = None

    def take(self, member: str, x: torch.Tensor, key: tuple):
        """The payload kept for x for `member` where the rule allows, else None -- then the entry is
        dropped before the caller computes (its memory is free for that) and the caller gives its
        result to keep()."""
        e = self._entry
        if e is not None and e[0] is x and e[2] == key and member in e[4]:
            ver = _version(x)
            if ver >= 0 and ver == e[1]:
                e[4].discard(member)
                if not e[4]:
                    self._entry = None
                self.hits += 1
                return e[3]
        self._entry = None
        return None

    def lookup(self, member: str, x: torch.Tensor, kernel: bool, k: int):
        """(key, the payload kept for member's call on x, or None); key is None where nothing may
        be shared now (torch.compile, autograd, a capture whose graph this torch cannot name)."""
        if not _sharing_allowed(x):
            return None, None
        key = _group_key(x, kernel, k)
        if key is None:
            self.clear()  # an entry kept outside this capture can never be used in it: free it now
            return None, None
        return key, self.take(member, x, key)

    def keep(self, member: str, x: torch.Tensor, key: tuple, payload) -> None:
        """Keep member's fresh result on x for the other members."""
        self.quantizations += 1
        ver = _version(x)
        pending = {m for m in self.members if m != member}
        self._entry = (x, ver, key, payload, pending) if ver >= 0 and pending else None


def _group_key(x: torch.Tensor, kernel: bool, k: int):
    """The key under which a group's entry may be used (see SharedActivation), or None where
    nothing may be shared (a capture whose graph this torch cannot name)."""
    stream = torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None
    capture = _capturing_graph() if x.is_cuda else None
    if capture is False:
        return None
    return ("float", "kernel" if kernel else "torch", stream, capture, k)


def _sharing_allowed(x: torch.Tensor) -> bool:
    """Host-side sharing is bypassed under torch.compile (Dynamo does not trace it) and for calls
    that record autograd."""
    return not (torch.compiler.is_compiling() or (torch.is_grad_enabled() and x.requires_grad))


class SharedActivation(_OneInputGroup):
    """One activation quantization for several Fp8CheckpointLinear modules that read one input.

    In an MLA attention q_a_proj and kv_a_proj_with_mqa both project the hidden states. Each
    quantizing them itself costs a second pass over the input: at M = 4096, K = 7168 about 25 us
    on an H200 (58 MB of bf16 read, 29 MB of codes and scales written), against a 30 us GEMM for
    kv_a_proj_with_mqa (N = 576). The members of a group hand their quantization on instead: the
    first member called with an input quantizes it and keeps (input, codes, scales); another
    member called next reuses them only when all of these hold, and quantizes again otherwise:

      - the input is the very tensor object kept (`is`), its version counter unchanged (no
        in-place write since; views share that counter). An inference tensor has no counter, so
        under torch.inference_mode nothing is shared;
      - the same activation format, the same path (fp8proj's ops or the torch fallback, whose
        results differ in layout) and, on a GPU, the same current CUDA stream and the same CUDA
        graph capture, or none (a torch without CUDAGraph.get_currently_capturing_graph cannot
        name the graph being captured: there nothing is shared during a capture);
      - this member has not used this entry yet (each other member once: a member called twice
        on one input quantizes twice, so timing one module alone still includes its quantization).

    The entry is dropped when every other member has used it, or replaced by the next miss, so
    nothing is held from one forward to the next. Under torch.compile the group is bypassed (the
    modules quantize each call; Dynamo does not trace this host-side state), and so is a call that
    records autograd. The hit path only compares Python objects and ints: nothing synchronizes or
    allocates, so a manual CUDA graph capture records one quantization and the members' GEMMs."""

    def add(self, module: "Fp8CheckpointLinear") -> None:
        """Make `module` a member (it then asks this group before quantizing)."""
        if module.shared_activation is not None and module.shared_activation is not self:
            raise ValueError(f"fp8proj: {module.name} already shares its activation with "
                             f"{module.shared_activation.members}")
        if module.fused_pair is not None:
            raise ValueError(f"fp8proj: {module.name} is already fused with {module.fused_pair.members}")
        if module.name in self.members:
            raise ValueError(f"fp8proj: {module.name} is already a member of this SharedActivation")
        self.members.append(module.name)
        module.shared_activation = self


def fuse_pair_skip_reason(a: "Fp8CheckpointLinear", b: "Fp8CheckpointLinear") -> str:
    """"" when the two modules' weights can be laid end to end as one GEMM's weight, else why not:
    one K, one device, one scale dtype, no bias, the first one's rows a whole number of 128-row
    scale blocks (so that each scale block stays one module's) whose scales end on a 16-byte
    boundary (true for every K that is a multiple of 512: DeepSeek-V3's 7168, GLM-5's 6144),
    neither grouped already."""
    for m in (a, b):
        if m.shared_activation is not None or m.fused_pair is not None:
            return f"{m.name} is already grouped"
        if m.bias is not None:
            return f"{m.name} has a bias"
    if a.in_features != b.in_features:
        return f"in_features {a.in_features} and {b.in_features} differ"
    if a.weight.device != b.weight.device:
        return f"weights on {a.weight.device} and {b.weight.device}"
    if a.weight_scale_inv.dtype != b.weight_scale_inv.dtype:
        return f"weight_scale_inv {a.weight_scale_inv.dtype} and {b.weight_scale_inv.dtype} differ"
    if a.out_features % 128:
        return (f"{a.name} has {a.out_features} rows, not a multiple of 128: its last scale block would "
                f"hold rows of {b.name}")
    row_bytes = -(-a.in_features // 128) * 4
    if (a.out_features // 128) * row_bytes % 16:
        # The kernel reads each weight's scales with 16-byte loads; b's own GEMM (a call the pair
        # cannot share) would start at this offset of the joint scale buffer.
        return (f"{b.name}'s scales would start {(a.out_features // 128) * row_bytes} bytes into the joint "
                "buffer, not a multiple of 16 (the kernel's scale alignment)")
    return ""


class FusedPair(_OneInputGroup):
    """Two Fp8CheckpointLinear modules that read one input, run as one GEMM.

    q_a_proj (N = 1536 or 2048) and kv_a_proj_with_mqa (N = 576) of an MLA attention both project
    the hidden states. Run apart they cost two activation quantizations (or one, shared) and two
    GEMMs, the second a narrow one that loses to bf16 (N = 576: 0.7-0.95x). Laid end to end they
    are one [N1 + N2, K] weight, the shape of fp8proj's fused_qkv_a: the constructor copies both
    weights (and their fp32 scales) into one buffer and makes each module's Parameters row ranges
    of it, so the model holds the same bytes as before (the old buffers are freed; the peak while
    fusing is one pair's weights more).

    Per call, the first member called with an input quantizes it once and runs one GEMM over both
    weights; its own columns of the output are its result (a view: row stride N1 + N2), the other
    member's are kept for it under SharedActivation's rule (the same tensor object, unmodified, on
    the same stream and capture; each other member once) and handed over when it is called. Where
    the rule does not allow it (torch.compile, autograd, another input), each member runs its own
    GEMM on its own rows of the buffer: the same numbers, one GEMM more.

    If a member's weight stops being its range of the buffer (.to() another device, a Parameter
    replaced), the pair falls apart: each module runs alone from then on and the buffer is let go.
    unfuse() gives each module its own buffers back (unpatch calls it)."""

    def __init__(self, a: "Fp8CheckpointLinear", b: "Fp8CheckpointLinear"):
        super().__init__()
        why = fuse_pair_skip_reason(a, b)
        if why:
            raise ValueError(f"fp8proj: cannot fuse {a.name} and {b.name}: {why}")
        n1, n2, k = a.out_features, b.out_features, a.in_features
        dev = a.weight.device
        with torch.no_grad():
            w = torch.empty((n1 + n2, k), dtype=_E4M3, device=dev)
            w[:n1].copy_(a.weight)
            w[n1:].copy_(b.weight)
            s1, s2 = a._scales(), b._scales()
            r1, r2 = s1.shape[0], s2.shape[0]
            s = torch.empty((r1 + r2, s1.shape[1]), dtype=torch.float32, device=dev)
            s[:r1].copy_(s1)
            s[r1:].copy_(s2)
        self.weight, self.scales = w, s
        self.joint_calls = 0  # GEMMs over both weights run eagerly (tests)
        self.__dict__["norm"] = None  # the RMSNorm before both members, once fuse_norm() took it
        self.norm_eps = 0.0
        self._rows = {a.name: (0, n1, 0, r1), b.name: (n1, n1 + n2, r1, r1 + r2)}
        self._modules = (a, b)
        # Where each member's weight and scales must start while the pair holds (checked per call).
        self._starts = {a.name: (w.data_ptr(), s.data_ptr()),
                        b.name: (w[n1].data_ptr(), s[r1].data_ptr())}
        for m in (a, b):
            lo, hi, slo, shi = self._rows[m.name]
            m.weight.data = w[lo:hi]
            if m.scales_fp32 is None:  # fp32 scales: the Parameter itself becomes the range
                m.weight_scale_inv.data = s[slo:shi]
            else:  # UE8M0 Parameter untouched; its fp32 widening (what the GEMM reads) is the range
                m.scales_fp32 = s[slo:shi]
            self.members.append(m.name)
            m.fused_pair = self

    def intact(self) -> bool:
        """True while both members' weights and scales are still their ranges of the buffer."""
        if self.weight is None:
            return False
        dev = self.weight.device
        for m in self._modules:
            w, sc = m.weight, m._scales()
            if w.device != dev or sc.device != dev or (w.data_ptr(), sc.data_ptr()) != self._starts[m.name]:
                self.weight = self.scales = None  # fallen apart: let the buffer go
                self.clear()
                return False
        return True

    def fuse_norm(self, norm: nn.Module) -> nn.Module:
        """Take the RMSNorm whose output only the two members read (a decoder layer's input_layernorm
        before q_a_proj and kv_a_proj_with_mqa): the members are then called on the un-normalized rows
        and the pair normalizes and quantizes them in one pass (rmsnorm_quantize, fp32 amax/448
        scales) before its GEMM; off the kernel path the norm module runs first, as it was. A member
        that runs alone (torch.compile, another input) applies the norm itself. Returns the
        DeferredRMSNorm to install where the norm was (its weight stays under the same name)."""
        from .torch import DeferredRMSNorm, _norm_eps  # noqa: PLC0415 - fp8proj.torch imports this module's users
        a, b = self._modules
        _checked_norm_weight(norm, a.in_features, f"{a.name} + {b.name}")
        if self.norm is not None or a.pre_norm is not None or b.pre_norm is not None:
            raise ValueError(f"fp8proj: {a.name} + {b.name} already have a norm fused")
        self.norm_eps = _norm_eps(norm)
        self.__dict__["norm"] = norm
        return DeferredRMSNorm(norm, f"{a.name} + {b.name}")

    def run(self, member: "Fp8CheckpointLinear", x: torch.Tensor, kernel: bool) -> Optional[torch.Tensor]:
        """member's output through the pair, or None where the member should run alone."""
        # lookup() first: it says None under torch.compile, where intact()'s data_ptr() checks
        # cannot be traced.
        key, y = self.lookup(member.name, x, kernel, member.in_features)
        if key is None or not self.intact():
            return None
        if y is not None:
            return y
        if _version(x) < 0:
            # An inference tensor (torch.inference_mode) keeps no version counter, so the other
            # member's columns could not be handed on: the joint GEMM would run once per member,
            # twice the work of the two modules apart. Each runs alone instead.
            return None
        outs = dict(zip(self.members, self._joint(x, kernel)))
        self.keep(member.name, x, key, {n: o for n, o in outs.items() if n != member.name})
        return outs[member.name]

    def outputs(self, x: torch.Tensor, kernel: bool) -> Optional[Tuple[torch.Tensor, ...]]:
        """Both members' outputs of one call on x (one quantization, one GEMM), in member order,
        nothing kept: for a caller that uses both at once (GatedMLP). None where the pair fell apart."""
        if not self.intact():
            return None
        return self._joint(x, kernel)

    def _joint(self, x: torch.Tensor, kernel: bool) -> Tuple[torch.Tensor, ...]:
        xq, q = x, None  # x itself is the key the other member's call is matched by
        if self.norm is not None:
            xq, q = _norm_and_quantize(self.norm, self.norm_eps, x, self._modules[0].in_features, kernel)
            # The norm module ran: its output's dtype and autograd state decide.
            kernel = kernel and xq.dtype == torch.bfloat16 and not (torch.is_grad_enabled() and xq.requires_grad)
        fn = block_fp8_linear if kernel else block_fp8_linear_reference
        y2 = fn(xq, self.weight, self.scales, "float", quantized=q)
        if not torch.compiler.is_compiling():
            self.joint_calls += 1
        return tuple(y2[..., self._rows[n][0]:self._rows[n][1]] for n in self.members)

    def take(self, member: str, x: torch.Tensor, key: tuple):
        kept = super().take(member, x, key)
        return None if kept is None else kept[member]

    def unfuse(self) -> None:
        """Each member's own buffers back (copies of its ranges); the pair is dissolved."""
        whole = self.intact()
        for m in self._modules:
            if m.fused_pair is not self:
                continue
            with torch.no_grad():
                if whole:
                    m.weight.data = m.weight.data.clone()
                    if m.scales_fp32 is None:
                        m.weight_scale_inv.data = m.weight_scale_inv.data.clone()
                    else:
                        m.scales_fp32 = m.scales_fp32.clone()
            m.fused_pair = None
        self.weight = self.scales = None
        self.__dict__["norm"] = None
        self.clear()


class Fp8CheckpointLinear(nn.Module):
    """Runs an FP8Linear of transformers (see the module doc) through fp8proj. Holds the source
    module's Parameters (weight, weight_scale_inv, bias) under the same names, so the model's
    state_dict is unchanged; `source` is the module it stands in for (unpatch puts it back)."""

    def __init__(self, source: nn.Module, *, name: str):
        super().__init__()
        why = fp8_linear_skip_reason(source)
        if why:
            raise ValueError(f"fp8proj: {name}: {why}")
        self.__dict__["source"] = source  # not a submodule: its Parameters are ours already
        self.weight = source.weight
        self.weight_scale_inv = source.weight_scale_inv
        self.register_parameter("bias", source.bias)
        self.out_features, self.in_features = (int(v) for v in source.weight.shape)
        self.name = name
        self.scale_format = scale_format_of(source.weight_scale_inv)
        self.register_buffer("scales_fp32", scales_as_fp32(source.weight_scale_inv), persistent=False)
        self._workspace_bytes = 0
        self._fp8, self._why = False, ""
        self.shared_activation: Optional[SharedActivation] = None  # SharedActivation.add sets it
        self.fused_pair: Optional[FusedPair] = None  # FusedPair sets it
        self.__dict__["pre_norm"] = None  # the RMSNorm before this module, once fuse_norm() took it
        self.norm_eps = 0.0
        self.refresh()

    # -- state -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Decide the path for the weight where it is now (after .to()/.cuda())."""
        ok, why = _lib.device_status()
        w = self.weight
        if ok and w.device.type != "cuda":
            ok, why = False, f"weight is on {w.device} (fp8proj's FP8 GEMM runs on the GPU)"
        self._fp8, self._why = ok, ("" if ok else why)
        if not ok:
            _say_once(why)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.refresh()
        return out

    def _scales(self) -> torch.Tensor:
        return self.scales_fp32 if self.scales_fp32 is not None else self.weight_scale_inv.detach()

    @property
    def uses_fp8_kernel(self) -> bool:
        """True when calls run fp8proj's GEMM (a Hopper GPU), False for the torch fallback."""
        return self._fp8

    def fuse_norm(self, norm: nn.Module) -> nn.Module:
        """Take the RMSNorm whose output this module alone reads (q_a_layernorm before q_b_proj): calls
        then get the un-normalized rows and, on the kernel path, normalize and quantize them in one
        pass (rmsnorm_quantize with fp32 amax/448 scales, the checkpoint's activation format); else
        the norm module runs as it was, then this module. Returns the DeferredRMSNorm to install
        where the norm was (its weight stays under the same name)."""
        from .torch import DeferredRMSNorm, _norm_eps  # noqa: PLC0415 - fp8proj.torch imports this module's users
        if self.shared_activation is not None or self.fused_pair is not None:
            raise ValueError(f"fp8proj: {self.name} reads a shared input; its norm cannot be fused")
        _checked_norm_weight(norm, self.in_features, self.name)
        self.norm_eps = _norm_eps(norm)
        self.__dict__["pre_norm"] = norm
        return DeferredRMSNorm(norm, self.name)

    # -- forward ---------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self._fp8 and x.dtype == torch.bfloat16 and not (torch.is_grad_enabled() and x.requires_grad)
        if not kernel and x.is_cuda and not torch.compiler.is_compiling():
            _lib.check_device_fault(self.name)
        # The bias in the output's dtype, as transformers' FP8Linear adds it.
        bias = self.bias.detach() if self.bias is not None else None
        pair = self.fused_pair
        if pair is not None:
            y = pair.run(self, x, kernel)  # no bias: fuse_pair_skip_reason
            if y is not None:
                return y
        norm, eps = self.pre_norm, self.norm_eps
        if norm is None and pair is not None:  # alone, but still behind the pair's norm
            norm, eps = pair.norm, pair.norm_eps
        q = None
        if norm is not None:
            x, q = _norm_and_quantize(norm, eps, x, self.in_features, kernel)
            # Where the norm module ran (a norm weight that is not bf16, or one that records
            # autograd), its output decides the path: the kernel takes bf16 rows without autograd.
            kernel = kernel and x.dtype == torch.bfloat16 and not (torch.is_grad_enabled() and x.requires_grad)
        if q is None:
            q = self._activation(x, kernel)
        if kernel:
            return block_fp8_linear(x, self.weight.detach(), self._scales(), "float", bias, quantized=q)
        return block_fp8_linear_reference(x, self.weight.detach(), self._scales(), "float", bias, quantized=q)

    def _activation(self, x: torch.Tensor, kernel: bool):
        """(codes, scales) of x through the shared group, or None: the caller quantizes (no group,
        torch.compile, autograd)."""
        g = self.shared_activation
        if g is None:
            return None
        key, q = g.lookup(self.name, x, kernel, self.in_features)
        if key is None:
            return None
        if q is None:
            x2 = _rows(x, self.in_features)
            q = (torch.ops.fp8proj.quantize_activation(x2, "float") if kernel else
                 quantize_activation_reference(x2, "float"))
            g.keep(self.name, x, key, q)
        return q

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        """fp8proj's numerics in torch: the weight dequantized per call, an fp32 product."""
        bias = self.bias.detach() if self.bias is not None else None
        return block_fp8_linear_reference(x, self.weight.detach(), self._scales(), "float", bias)

    # -- queries ---------------------------------------------------------------------------------
    def _gemm_handle(self, max_m: int, pair: bool = False):
        """A throwaway plan through the C ABI for this weight, or the fused pair's (what fp8_gemm's
        cached one runs)."""
        w, s = (self.fused_pair.weight, self.fused_pair.scales) if pair else (self.weight, self._scales())
        lib = _lib.lib()
        h = ctypes.c_void_p()
        _lib.check(lib.fp8proj_fp8_gemm_create(w.data_ptr(), s.data_ptr(), int(w.shape[0]), self.in_features,
                                               max(4, _ceil4(max_m)), None, ctypes.byref(h)), self.name)
        return h.value

    def explain(self, m: int) -> str:
        """Which kernel a call with m rows runs, and why."""
        what = (f"the checkpoint's e4m3 weight and {self.scale_format} weight_scale_inv as loaded (no copy, no "
                "re-quantization); activations 1x128 groups, fp32 scales amax/448")
        if m <= 0:
            return f"M={m}: nothing to run"
        g, f = self.shared_activation, self.fused_pair
        has_norm = self.pre_norm is not None or (f is not None and f.norm is not None)
        if has_norm:
            what += ("; the RMSNorm before it fused: normalized and quantized in one pass (rmsnorm_quantize, fp32 "
                     "scales)" + ("" if self.pre_norm is not None else ", once for the pair"))
        norm_first = "" if not has_norm else "; the RMSNorm before it runs first, as its module"
        shared = "" if g is None else (
            "; the input's quantization shared with " + ", ".join(n for n in g.members if n != self.name) +
            " (one quantization when they read the same tensor)")
        if f is not None:
            n = f.weight.shape[0] if f.intact() else None
            others = ", ".join(n_ for n_ in f.members if n_ != self.name)
            shared = (f"; fused with {others}: one quantization and one GEMM over both weights (N={n}) when "
                      "they read the same tensor, this module's columns of its output" if n is not None else
                      f"; was fused with {others}, no longer (its weight moved): runs alone")
        if not self._fp8:
            return f"M={m}: torch (weight dequantized per call, fp32 product) -- {self._why}{norm_first}{shared}"
        lib = _lib.lib()
        h = self._gemm_handle(m, pair=f is not None and f.intact())
        try:
            desc = _lib.read_string(lib.fp8proj_fp8_gemm_describe, h, int(m))
        finally:
            lib.fp8proj_fp8_gemm_destroy(h)
        return f"M={m}: fp8 via {desc} -- {what}{shared}"

    def prepare(self, max_m: int = 8192) -> None:
        """Make fp8_gemm's plan for this weight now (it allocates, which a CUDA graph capture
        refuses) and note the plan's workspace. patch() calls it; a no-op off the kernel path."""
        if not self._fp8:
            return
        with torch.no_grad():
            z = torch.zeros(4, self.in_features, dtype=torch.bfloat16, device=self.weight.device)
            self.forward(z)  # a fused pair's GEMM plan
            if self.fused_pair is not None:  # and this module's own, for calls the pair cannot share
                block_fp8_linear(z, self.weight.detach(), self._scales())
        for g in (self.shared_activation, self.fused_pair):
            if g is not None:
                g.clear()  # the warm-up input: no member will read it
        lib = _lib.lib()
        f = self.fused_pair
        self._workspace_bytes = 0
        # This module's own plan, and the pair's (counted by its first member).
        for pair in (False, True) if f is not None and f.intact() and f.members[0] == self.name else (False,):
            h = self._gemm_handle(max_m, pair=pair)
            try:
                b = ctypes.c_size_t()
                _lib.check(lib.fp8proj_fp8_gemm_workspace_bytes(h, ctypes.byref(b)), self.name)
                self._workspace_bytes += int(b.value)
            finally:
                lib.fp8proj_fp8_gemm_destroy(h)

    def memory(self) -> dict:
        """Bytes: the checkpoint's weight and scales (held by the model as before) and what this
        module adds (fp32 scales for UE8M0 ones, the GEMM plans' workspaces: its own, and a fused
        pair's for the pair's first member)."""
        s = self.weight_scale_inv
        extra = (self.scales_fp32.numel() * 4 if self.scales_fp32 is not None else 0) + self._workspace_bytes
        return {"fp8_weight": self.weight.numel() * self.weight.element_size(),
                "scales": s.numel() * s.element_size(), "extra": extra}

    def extra_memory_bytes(self) -> int:
        return self.memory()["extra"]

    def extra_repr(self) -> str:
        path = "fp8proj fp8 GEMM" if self._fp8 else "torch fallback"
        return (f"name={self.name!r}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight_scale_inv={self.scale_format}, path={path}" +
                ("" if self.shared_activation is None else
                 f", shared_activation={self.shared_activation.members}") +
                ("" if self.fused_pair is None else f", fused_pair={self.fused_pair.members}") +
                ("" if self.pre_norm is None else f", fused_norm={type(self.pre_norm).__name__}"))


def gated_mlp_skip_reason(mlp: nn.Module) -> str:
    """"" where GatedMLP can run `mlp`'s forward, else why not: gate_proj, up_proj and down_proj are
    Fp8CheckpointLinear modules (down_proj with no norm fused, not grouped), act_fn is SiLU, and the
    forward computes down_proj(act_fn(gate_proj(x)) * up_proj(x)) (read from its source, as
    DeepSeek-V3's MLP writes it)."""
    mods = [getattr(mlp, a, None) for a in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(m, Fp8CheckpointLinear) for m in mods):
        return "gate_proj, up_proj and down_proj are not all FP8 checkpoint layers run by fp8proj"
    g, u, d = mods
    if g.out_features != u.out_features or d.in_features != g.out_features:
        return (f"gate_proj ({g.out_features}), up_proj ({u.out_features}) and down_proj's input "
                f"({d.in_features}) differ")
    if d.pre_norm is not None or d.shared_activation is not None or d.fused_pair is not None:
        return "down_proj already takes its input another way"
    act = getattr(mlp, "act_fn", None)
    if not isinstance(act, nn.SiLU) and type(act).__name__ not in ("SiLUActivation", "SiLU"):
        return f"act_fn is a {type(act).__name__}, not SiLU"
    try:
        src = inspect.getsource(inspect.unwrap(type(mlp).forward))
    except (OSError, TypeError):
        return f"the source of {type(mlp).__name__}.forward is unavailable"
    call = re.search(r"self\.down_proj\(\s*self\.act_fn\(\s*self\.gate_proj\(\s*(\w+)\s*\)\s*\)\s*\*\s*"
                     r"self\.up_proj\(\s*(\w+)\s*\)\s*\)", src)
    if call is None or call.group(1) != call.group(2) or src.count("self.down_proj(") != 1:
        return f"{type(mlp).__name__}.forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x))"
    return ""


def _hooked(*mods: nn.Module) -> bool:
    """True where a forward hook (global, or on one of mods) would see calls that a fused path makes
    without calling the module."""
    g = torch.nn.modules.module
    return bool(g._global_forward_hooks or g._global_forward_pre_hooks or
                any(m._forward_hooks or m._forward_pre_hooks for m in mods))


class GatedMLP:
    """mlp.forward(x) = down_proj(silu(gate_proj(x)) * up_proj(x)) with the activation fused into
    down_proj's input quantization: one silu_mul_quantize pass reads gate's and up's outputs and
    writes down_proj's e4m3 codes and fp32 scales, where the module-by-module forward runs silu,
    the product (two bf16 passes) and then down_proj's own quantization. The values quantized are
    the same: the pass keeps PyTorch's two bf16 roundings of act_fn(gate) * up (ops.hpp). Where
    gate_proj and up_proj are one FusedPair, their outputs are the two column halves of one GEMM's
    output and the pass reads them there (one row stride). Installed on the MLP instance as its
    forward (patch(); unpatch removes it); not an nn.Module, it holds no Parameters. Calls it
    cannot take (off the kernel path, autograd, another dtype, act_fn replaced since, a forward hook
    on down_proj or act_fn, or a global one) run the class's forward."""

    def __init__(self, mlp: nn.Module, name: str):
        why = gated_mlp_skip_reason(mlp)
        if why:
            raise ValueError(f"fp8proj: {name}: {why}")
        self._mlp = mlp  # a cycle (the MLP holds this object) that the collector frees
        self._cls = type(mlp)
        self._act = mlp.act_fn  # the SiLU checked above; another act_fn later means the class's forward
        self.name = name
        self.fused_calls = 0  # eager calls that took the fused pass (tests, explain)

    def _fits(self, x: torch.Tensor) -> bool:
        """The fused pass takes this call: down_proj on the kernel path, bf16 CUDA rows, no autograd, the
        act_fn checked at install, and no forward hook that the pass would skip (down_proj's and act_fn's
        are never called as modules there)."""
        mlp = self._mlp
        d = mlp.down_proj
        return (isinstance(d, Fp8CheckpointLinear) and d.uses_fp8_kernel and x.dtype == torch.bfloat16 and x.is_cuda
                and not (torch.is_grad_enabled() and x.requires_grad) and d.pre_norm is None
                and mlp.act_fn is self._act and not _hooked(d, self._act))

    def _gate_up(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """gate_proj(x) and up_proj(x): where the two are one FusedPair, one GEMM whose two column
        halves they are, called here directly -- the pair's hand-over from one member's call to the
        other's needs a version counter, which inference tensors (torch.inference_mode) lack."""
        mlp = self._mlp
        gate, up = mlp.gate_proj, mlp.up_proj
        pair = getattr(gate, "fused_pair", None)
        if (pair is not None and pair._modules[0] is gate and pair._modules[1] is up and gate.uses_fp8_kernel
                and not torch.compiler.is_compiling() and not _hooked(gate, up)):
            both = pair.outputs(x, kernel=True)
            if both is not None:
                return both
        return gate(x), up(x)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        mlp = self._mlp
        if not self._fits(x):
            return self._cls.forward(mlp, x)
        g, u = self._gate_up(x)
        inter = g.shape[-1]
        g2, u2 = g.reshape(-1, inter), u.reshape(-1, inter)  # views: a pair's halves keep their row stride
        if g2.stride() != u2.stride() or g2.stride(-1) != 1:
            g2, u2 = g2.contiguous(), u2.contiguous()
        q = torch.ops.fp8proj.silu_mul_quantize(g2, u2, "float")
        if not torch.compiler.is_compiling():
            self.fused_calls += 1
        d = mlp.down_proj
        bias = d.bias.detach() if d.bias is not None else None
        return block_fp8_linear(g, d.weight.detach(), d._scales(), "float", bias, quantized=q)

    def explain(self, m: int) -> str:
        d = self._mlp.down_proj
        if not (isinstance(d, Fp8CheckpointLinear) and d.uses_fp8_kernel):
            return f"{self.name}: the MLP's own forward (down_proj off fp8proj's kernel path)"
        return (f"{self.name}: silu(gate) * up quantized in one pass (silu_mul_quantize, fp32 scales), then "
                f"down_proj -- {d.explain(m)}")
