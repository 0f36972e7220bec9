"""kv_b_proj writing the key layout of transformers' MLA attention.

transformers' DeepseekV3Attention (and the models built from it) caches the compressed latent and
expands it in `expand_kv` on every call: kv_b_proj over the whole cache, viewed as
[B, L, H, nope + v], then a new key tensor [B, H, L, nope + rope] filled by two copies (k_nope, and
k_rot broadcast over the heads); value is a view. At decode L is the cache length, so that GEMM is
prefill-sized (M = B x L) and the key copy reads and writes about as many bytes as the GEMM writes.

KeyValueExpand stands in for `expand_kv` where kv_b_proj is fp8proj's (an Fp8ProjLinear): one
torch.ops.fp8proj.linear_gapped call writes kv_b_proj's output with `rope` zero columns after each
head's nope columns, [B, L, H, nope + rope + v]; k_rot is written into those columns and key and
value are views of that one tensor. The key copy is gone; the GEMM computes rope / (nope + v) more
columns (DeepSeek-V3 25%, GLM-5 14%). Where the layer's gate says FP8 for M, the GEMM runs on an
FP8 copy of the weight with the zero rows inserted (made once, from the bf16 weight, in the layer's
weight-scale format); else the layer's bf16 path runs and its columns are moved apart (the copy
is then where it was). Numerics: the layer's (1x128 UE8M0 activations, 128x128 weight blocks);
the blocks of the gapped copy hold other rows than the layer's own copy, so the values may differ
from kv_b_proj's FP8 output by the rounding of a block scale, within the same contract.

Installed by patch() where the attention's own expand_kv is checked to produce exactly this layout
(kv_b_proj run on a small input both ways); unpatch() removes it.
"""
from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..ops import gapped_columns
from ..torch import Fp8ProjLinear

__all__ = ["KeyValueExpand", "expand_kv_skip_reason"]

_DIMS = ("num_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _dims(attn: nn.Module) -> Tuple[int, int, int, int]:
    return tuple(int(getattr(attn, a)) for a in _DIMS)


def _gapped_expand(y: torch.Tensor, k_rot: torch.Tensor, dims) -> Tuple[torch.Tensor, torch.Tensor]:
    """(key, value) from the gapped output y [B, 1, L, H * (nope + rope + v)] (or [B, L, ...]) and
    k_rot [B, 1, L, rope]: k_rot written into the gap, key and value as views [B, H, L, *]."""
    heads, nope, rope, v = dims
    b, l = k_rot.shape[0], k_rot.shape[2]
    out = y.view(b, l, heads, nope + rope + v)
    out[..., nope:nope + rope].copy_(k_rot.transpose(1, 2))  # [B, L, 1, rope], broadcast over the heads
    t = out.transpose(1, 2)
    return t[..., :nope + rope], t[..., nope + rope:]


def expand_kv_skip_reason(attn: nn.Module) -> str:
    """Why `attn`'s expand_kv cannot be replaced ("" where it can): the attributes, the shapes, and
    the layout itself -- the class's expand_kv run on a small random latent against the gapped
    route with the same kv_b_proj (nn.Linear here, before patching), bitwise."""
    cls = type(attn)
    if not callable(getattr(cls, "expand_kv", None)):
        return f"{cls.__name__} has no expand_kv (the attention expands its cache another way)"
    if "expand_kv" in attn.__dict__:
        return "expand_kv is already replaced on this module"
    missing = [a for a in _DIMS if not isinstance(getattr(attn, a, None), int)]
    if missing:
        return f"{cls.__name__} lacks {', '.join(missing)}"
    heads, nope, rope, v = _dims(attn)
    lin = getattr(attn, "kv_b_proj", None)
    if type(lin) is not nn.Linear or lin.bias is not None:
        return "kv_b_proj is not a bias-free nn.Linear"
    if lin.out_features != heads * (nope + v):
        return f"kv_b_proj has {lin.out_features} outputs, not heads x (nope + v) = {heads * (nope + v)}"
    w = lin.weight
    if w.dtype != torch.bfloat16:
        return f"kv_b_proj's weight is {w.dtype}, not bfloat16"
    if w.device.type == "meta":
        return "kv_b_proj's weight is on the meta device (no values to check the layout with)"
    g = torch.Generator(device=w.device).manual_seed(0)
    with torch.no_grad():
        kv = torch.randn(2, 1, 3, lin.in_features, generator=g, device=w.device).to(w.dtype)
        k_rot = torch.randn(2, 1, 3, rope, generator=g, device=w.device).to(w.dtype)
        try:
            key, value = cls.expand_kv(attn, kv, k_rot)
        except Exception as e:  # noqa: BLE001 - any failure means the layout is not the one known here
            return f"{cls.__name__}.expand_kv did not run on a test latent ({type(e).__name__}: {e})"
        k2, v2 = _gapped_expand(gapped_columns(F.linear(kv, w), heads, nope, rope), k_rot, (heads, nope, rope, v))
    if not (isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor) and key.shape == k2.shape and
            value.shape == v2.shape and torch.equal(key, k2) and torch.equal(value, v2)):
        return (f"{cls.__name__}.expand_kv does not give the layout this replacement writes (key [B, H, L, nope + rope] "
                "= k_nope | k_rot, value [B, H, L, v], from kv_b_proj's [B, L, H, nope + v])")
    return ""


class KeyValueExpand:
    """attn.expand_kv(kv_nope, k_rot) -> (key, value) through kv_b_proj's layer (see the module
    doc). Not an nn.Module: it holds no Parameters (the FP8 copy of the gapped weight is derived
    from kv_b_proj's weight, like the layer's own copy) and leaves the model's state_dict and
    submodules as they are. Calls it cannot take (no FP8 layer, autograd, another dtype) run the
    class's own expand_kv."""

    def __init__(self, attn: nn.Module, name: str):
        kv_b = attn.kv_b_proj
        if not isinstance(kv_b, Fp8ProjLinear):
            raise TypeError(f"fp8proj: {name}: kv_b_proj must be an Fp8ProjLinear, got {type(kv_b).__name__}")
        self._cls = type(attn)  # its expand_kv serves the calls this cannot take
        self._attn = attn  # a cycle (the attention holds this object) that the collector frees
        self.name = name
        self.dims = _dims(attn)
        self.values = self.scales = None
        self._built_for = None
        self.calls_gapped = 0  # eager calls that took the gapped route (tests, explain)

    @property
    def kv_b(self) -> Fp8ProjLinear:
        return self._attn.kv_b_proj

    def _fp8_copy(self) -> bool:
        """The gapped FP8 copy for kv_b_proj's current layer (remade when the layer was); False
        where there is no FP8 layer."""
        kv_b = self.kv_b
        if not isinstance(kv_b, Fp8ProjLinear) or kv_b.handle is None or not kv_b._fp8:
            return False
        if not torch.compiler.is_compiling() and kv_b._stale():
            # The weight was replaced or changed in place since kv_b_proj's layer was made: the
            # layer is rebuilt (as kv_b_proj's own call would), so its handle moves and the
            # gapped copy is made again below.
            kv_b._check_weight_in_place()
            if kv_b.handle is None or not kv_b._fp8:
                return False
        if self._built_for != kv_b.handle:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"fp8proj: {self.name}: kv_b_proj's layer was rebuilt; run a call outside the "
                                   "CUDA graph capture first (the gapped FP8 copy is made then)")
            heads, nope, rope, v = self.dims
            with torch.no_grad():
                w = kv_b.weight.detach()
                gapped = gapped_columns(w.t(), heads, nope, rope).t().contiguous()  # zero rows in the gaps
                self.values, self.scales = torch.ops.fp8proj.quantize_weight(gapped, kv_b.weight_scales())
                del gapped
            self._built_for = kv_b.handle
        return True

    def __call__(self, kv_nope: torch.Tensor, k_rot: torch.Tensor):
        kv_b = self.kv_b
        if (kv_nope.dtype != torch.bfloat16 or not kv_nope.is_cuda or
                (torch.is_grad_enabled() and (kv_nope.requires_grad or kv_b.weight.requires_grad)) or
                not self._fp8_copy()):
            return self._cls.expand_kv(self._attn, kv_nope, k_rot)
        heads, nope, rope, _ = self.dims
        y = torch.ops.fp8proj.linear_gapped(kv_nope.contiguous(), kv_b.weight, kv_b.handle, self.values, self.scales,
                                            heads, nope, rope)
        if not torch.compiler.is_compiling():
            self.calls_gapped += 1
        return _gapped_expand(y, k_rot, self.dims)

    def prepare(self) -> None:
        """Make the gapped FP8 copy now (it allocates, which a CUDA graph capture refuses)."""
        self._fp8_copy()

    def explain(self, m: int) -> str:
        heads, nope, rope, v = self.dims
        if not self._fp8_copy():
            return f"M={m}: the class's expand_kv (kv_b_proj has no FP8 layer: {self.kv_b.explain(m)})"
        return (f"M={m}: kv_b_proj writes the key layout ({heads} heads x [{nope} nope | {rope} rope | {v} v]): "
                f"{self.kv_b.explain(m)}")

    def extra_memory_bytes(self) -> int:
        """The gapped FP8 copy and its scales (kv_b_proj's own copy is counted by kv_b_proj)."""
        if self.values is None:
            return 0
        return self.values.numel() * self.values.element_size() + self.scales.numel() * self.scales.element_size()
