"""fp8proj in Hugging Face transformers (5.x): swap the MLA attention projections in place.

    from fp8proj.integrations.transformers import patch, unpatch
    report = patch(model)                 # q_a_layernorm + q_b_proj (fused) and o_proj, every layer
    print(report)                         # what was patched, what was skipped and why
    unpatch(model)                        # the original modules back

An attention module qualifies by its layout, not its class: it has q_a_proj, q_a_layernorm,
q_b_proj, kv_a_proj_with_mqa, kv_b_proj and o_proj (DeepSeek-V3 `deepseek_v3`, DeepSeek-V3.2
`deepseek_v32`, GLM-5 `glm_moe_dsa`, and any other class laid out the same way). Modules with
q_proj instead of the q LoRA pair (q_lora_rank = None, e.g. DeepSeek-V2-Lite) get o_proj only.

The norm is fused into q_b_proj only where q_a_layernorm's output feeds q_b_proj alone, which is
read from the attention's forward source: DeepSeek-V3 writes q_b_proj(q_a_layernorm(q_a_proj(x))).
In DeepSeek-V3.2 and GLM-5 (DSA) the indexer also reads that output (q_resid), so there q_b_proj
is patched unfused and the norm stays as it was.

FP8 checkpoints (DeepSeek-V3/R1, Kimi-K2, GLM-5-FP8; or a bf16 model quantized on load with
FineGrainedFP8Config) load their projections as transformers' FP8Linear. Those targets are run
by fp8proj on the module's own e4m3 weight and weight_scale_inv, as they are
(fp8proj.fp8_linear.Fp8CheckpointLinear: no bf16 copy, no hub kernel, activations quantized with
fp32 amax/448 scales); the target "fp8_linear" (ALL_FP8_LINEARS) takes every other FP8Linear of
the model too (the dense MLPs, shared experts). FP8 modules left on transformers' path (MoE
experts, other block sizes, static activation scales, a target not asked for) are listed in
report.left with the reason. A model whose FP8Linears cannot run (no `kernels` package, offline)
runs after patch(). Where the forward allows the norm fusion above, an FP8-checkpoint q_b_proj takes
q_a_layernorm too: one pass normalizes its input and quantizes it with fp32 scales
(Fp8CheckpointLinear.fuse_norm; fuse_norm=False keeps them apart).

Where an attention's q_a_proj and kv_a_proj_with_mqa are both FP8 checkpoint layers taken by
fp8proj and its forward calls both on one variable (DeepSeek-V3, GLM-5: `self.q_a_proj(
hidden_states)` ... `self.kv_a_proj_with_mqa(hidden_states)`), the two hold one SharedActivation:
the input is quantized once for both (report.shared; report.unshared says where not and why;
share_inputs=False turns it off). Where their weights can also be laid end to end (one K, no
bias, q_a_proj's rows whole 128-row blocks: every DeepSeek-V3 and GLM-5 checkpoint), they become
one FusedPair instead: both weights (and fp32 scales) move into one buffer whose row ranges the
modules' Parameters then are -- no extra memory -- and one GEMM over both runs per call, like the
bf16 path's fused_qkv_a (fuse_pair=False: shared quantization only). unpatch gives each module its
own buffers back.

Where kv_b_proj is a target (ALL_TARGETS) and the attention expands its cached latent with
transformers' expand_kv (DeepSeek-V3 and the models built from it: kv_b_proj over the whole
cache, then a key tensor assembled by copies), kv_b_proj writes the key layout itself and the
key copy goes (kv_expand.KeyValueExpand; report.expanded, fuse_kv_expand=False turns it off).
At decode that GEMM is prefill-sized (M = sequences x cache length) and runs in chunks of
max_tokens rows (DEFAULT_MAX_TOKENS).

Parameters are shared, not copied: the patched model's state_dict has the same keys and the
same tensors, and unpatch restores the very modules that were there.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .. import _lib
from ..fp8_linear import (Fp8CheckpointLinear, FusedPair, GatedMLP, SharedActivation, fp8_linear_class,
                          fp8_linear_skip_reason, fuse_pair_skip_reason, gated_mlp_skip_reason,
                          is_fp8_checkpoint_module)
from ..torch import Fp8ProjLinear, Fp8ProjRMSNormLinear, Workspace
from .kv_expand import KeyValueExpand, expand_kv_skip_reason

__all__ = ["patch", "unpatch", "PatchReport", "find_mla_attention", "DEFAULT_TARGETS", "ALL_TARGETS",
           "ALL_FP8_LINEARS"]

MLA_ATTRIBUTES = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
# What patch() replaces by default (q_a_layernorm fused into q_b_proj where the forward allows),
# and every dense projection of the attention (q_proj where there is no q LoRA).
DEFAULT_TARGETS = ("q_b_proj", "o_proj")
ALL_TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_proj")
# The patched modules' workspace rows when patch() is not given max_tokens: a call with more rows runs
# in chunks of this many. transformers' DeepseekV3 decode step calls kv_b_proj on the whole compressed
# cache (M = sequences x cache length), so at decode that module sees prefill-sized M.
DEFAULT_MAX_TOKENS = 8192
# "fp8_linear": every FP8Linear of the model, inside the attention or not (FP8 checkpoints only).
ALL_FP8_LINEARS = ALL_TARGETS + ("fp8_linear",)
_ORIGINALS = "_fp8proj_originals"
_INSTANCE_ATTRIBUTE = object()  # in the originals list: patch() set this attribute on the instance
_FUSED_CALL = re.compile(r"self\.q_b_proj\(\s*self\.q_a_layernorm\(\s*self\.q_a_proj\(")
# The two projections of the attention's input: one quantization of it serves both.
SHARED_PAIR = ("q_a_proj", "kv_a_proj_with_mqa")


@dataclass
class PatchReport:
    patched: List[str] = field(default_factory=list)                 # module names now fp8proj modules
    skipped: List[Tuple[str, str]] = field(default_factory=list)      # (module name, why not)
    fused: List[str] = field(default_factory=list)                    # q_b_proj names with the norm fused in
    note: str = ""                                                    # e.g. why everything runs bf16 here
    # FP8 checkpoint modules (transformers' fine-grained FP8 layers):
    fp8: List[str] = field(default_factory=list)                     # patched FP8Linears (also in `patched`)
    left: List[Tuple[str, str]] = field(default_factory=list)         # left on transformers' path, and why
    fp8_weight_bytes: int = 0   # e4m3 weights + scales of the patched FP8Linears, used as they are
    fp8_extra_bytes: int = 0    # what running them adds: fp32 copies of UE8M0 scales, GEMM plan workspaces
    shared: List[str] = field(default_factory=list)                  # "attn: q_a_proj + kv_a_proj_with_mqa share ..."
    unshared: List[Tuple[str, str]] = field(default_factory=list)    # (attention name, why its pair does not share)
    expanded: List[str] = field(default_factory=list)  # attentions whose kv_b_proj writes the key layout (kv_expand.py)
    expand_extra_bytes: int = 0  # their gapped FP8 copies of kv_b_proj's weight
    fused_input_norm: List[str] = field(default_factory=list)  # layers whose input_layernorm the pair took
    fused_mlp: List[str] = field(default_factory=list)  # MLPs run by GatedMLP (silu * up fused into down_proj's input)

    def __str__(self) -> str:
        lines = [f"fp8proj patch: {len(self.patched)} modules patched ({len(self.fused)} with the norm fused, "
                 f"{len(self.fp8)} FP8 checkpoint layers), {len(self.skipped)} skipped"]
        lines += [f"  patched {n}" + (" (q_a_layernorm fused)" if n in self.fused else "") +
                  (" (FP8 checkpoint layer, its own e4m3 weight and scales)" if n in self.fp8 else "")
                  for n in self.patched]
        lines += [f"  skipped {n}: {why}" for n, why in self.skipped]
        if self.fp8:
            lines.append(f"  FP8 checkpoint layers: {self.fp8_weight_bytes} bytes of e4m3 weights and scales used as "
                         f"they are (no bf16 copy, no re-quantization; a fused pair's two weights moved into one buffer); {self.fp8_extra_bytes} bytes added (fp32 copies of UE8M0 scales, GEMM "
                         "plan workspaces)")
        lines += [f"  left on transformers' path {n}: {why}" for n, why in self.left]
        lines += [f"  shared {n}" for n in self.shared]
        lines += [f"  fused {n}.input_layernorm into its attention's q_a_proj + kv_a_proj_with_mqa (one pass "
                  "normalizes and quantizes the layer's input)" for n in self.fused_input_norm]
        if self.expanded:
            lines.append(f"  kv_b_proj writes the key layout (expand_kv replaced, no key copy) in {len(self.expanded)} "
                         f"attention modules; {self.expand_extra_bytes} bytes of gapped FP8 copies")
        lines += [f"  fused {n}: silu(gate_proj) * up_proj quantized in one pass for down_proj" for n in self.fused_mlp]
        lines += [f"  not shared {n}: {why}" for n, why in self.unshared]
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _is_mla(m: nn.Module) -> bool:
    return all(hasattr(m, a) for a in ("kv_a_proj_with_mqa", "kv_b_proj", "o_proj")) and (
        all(getattr(m, a, None) is not None for a in ("q_a_proj", "q_a_layernorm", "q_b_proj"))
        or isinstance(getattr(m, "q_proj", None), nn.Linear))


def find_mla_attention(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, module) of every module with the MLA attention layout."""
    return [(n, m) for n, m in model.named_modules() if _is_mla(m)]


def _forward_source(attn: nn.Module) -> str:
    """The attention's forward source ("" where unavailable: a compiled or dynamically made class)."""
    try:
        return inspect.getsource(inspect.unwrap(type(attn).forward))
    except (OSError, TypeError):
        return ""


def _norm_feeds_q_b_alone(attn: nn.Module) -> Tuple[bool, str]:
    if getattr(attn, "indexer", None) is not None:
        return False, "an indexer also reads q_a_layernorm's output (DSA)"
    src = _forward_source(attn)
    if not src:
        return False, f"the source of {type(attn).__name__}.forward is unavailable, so the norm's consumers are unknown"
    if not _FUSED_CALL.search(src) or src.count("self.q_a_layernorm(") != 1:
        return False, f"{type(attn).__name__}.forward uses q_a_layernorm's output other than as q_b_proj's input"
    return True, ""


def _pair_input(attn: nn.Module) -> Tuple[str, str]:
    """(the variable both of SHARED_PAIR are called on, "") where the forward source calls each only
    as self.<name>(<one variable>), the same one for both; else ("", why not). This says where
    sharing is expected; whether a call reuses the quantization is decided per call (the tensor
    object and its version, SharedActivation), so a misread source costs a quantization, never a
    wrong result."""
    cls = type(attn).__name__
    src = _forward_source(attn)
    if not src:
        return "", f"the source of {cls}.forward is unavailable, so what the pair reads is unknown"
    args = []
    for attr in SHARED_PAIR:
        calls = src.count(f"self.{attr}(")
        names = re.findall(rf"self\.{attr}\(\s*([A-Za-z_]\w*)\s*\)", src)
        if calls == 0:
            return "", f"{cls}.forward does not call self.{attr}(...)"
        if len(names) != calls or len(set(names)) != 1:
            return "", f"{cls}.forward calls self.{attr} on something other than one variable"
        args.append(names[0])
    if args[0] != args[1]:
        return "", f"{cls}.forward calls q_a_proj({args[0]}) and kv_a_proj_with_mqa({args[1]}): two inputs"
    return args[0], ""


def _share_pairs(model: nn.Module, attns, fp8_plan, report: "PatchReport", share_inputs: bool,
                 fuse: bool = True) -> None:
    """One FusedPair (where fuse and fuse_pair_skip_reason allow), else one SharedActivation, for
    each attention's SHARED_PAIR where both are taken as FP8 checkpoint layers and read one input;
    report.shared / report.unshared say where and why not. Only attentions with at least one of the
    pair taken are reported (nothing to share otherwise)."""
    left = dict(report.left)
    for aname, attn in attns:
        full = [f"{aname}.{t}" if aname else t for t in SHARED_PAIR]
        taken = [f in fp8_plan for f in full]
        where = aname or type(attn).__name__
        if not any(taken):
            continue
        if not all(taken):
            i = taken.index(False)
            attr = SHARED_PAIR[i]
            why = left.get(full[i]) or f"a {type(getattr(attn, attr, None)).__name__}, not an FP8 checkpoint layer"
            report.unshared.append((where, f"{attr} is not run by fp8proj as an FP8 checkpoint layer ({why})"))
            continue
        if not share_inputs:
            report.unshared.append((where, "share_inputs=False"))
            continue
        mods = [model.get_submodule(f) for f in full]
        if mods[0].in_features != mods[1].in_features:
            report.unshared.append((where, f"in_features {mods[0].in_features} and {mods[1].in_features} differ"))
            continue
        var, why = _pair_input(attn)
        if why:
            report.unshared.append((where, why))
            continue
        why_unfused = "fuse_pair=False" if not fuse else fuse_pair_skip_reason(*mods)
        if not why_unfused:
            FusedPair(*mods)
            report.shared.append(f"{where}: q_a_proj + kv_a_proj_with_mqa fused: one quantization and one GEMM "
                                 f"(N={mods[0].out_features}+{mods[1].out_features}) over their weights laid end "
                                 f"to end, no extra memory (both read {var})")
            continue
        group = SharedActivation()
        for mod in mods:
            group.add(mod)
        report.shared.append(f"{where}: q_a_proj + kv_a_proj_with_mqa share one activation quantization "
                             f"(both read {var}; not fused: {why_unfused})")


def _fuse_input_norms(model: nn.Module, attns, report: "PatchReport", originals: list) -> None:
    """Each decoder layer's input_layernorm into its attention's FusedPair, where
    _input_norm_fusion_skip_reason allows; report.fused_input_norm / report.skipped say where."""
    layers = {id(getattr(m, "self_attn", None)): (n, m) for n, m in model.named_modules()
              if isinstance(getattr(m, "input_layernorm", None), nn.Module)}
    for aname, attn in attns:
        pair = getattr(getattr(attn, "q_a_proj", None), "fused_pair", None)
        if pair is None or id(attn) not in layers:
            continue
        lname, layer = layers[id(attn)]
        var, why = _pair_input(attn)
        why = why or _input_norm_fusion_skip_reason(layer, attn, var)
        if why:
            report.skipped.append((f"{lname}.input_layernorm" if lname else "input_layernorm",
                                   f"not fused into the attention's q_a_proj + kv_a_proj_with_mqa: {why}"))
            continue
        norm = layer.input_layernorm
        passthrough = pair.fuse_norm(norm)
        originals.append((layer, "input_layernorm", norm))
        layer.input_layernorm = passthrough
        report.fused_input_norm.append(lname)


def _fuse_mlps(model: nn.Module, report: "PatchReport", originals: list, fuse_pair: bool) -> None:
    """A GatedMLP for every MLP whose three projections patch() took as FP8 checkpoint layers (and
    gate_proj + up_proj as one FusedPair where fuse_pair and their weights allow); report.fused_mlp /
    report.skipped say where and why not."""
    taken = set(report.fp8)
    for name, mlp in model.named_modules():
        full = [f"{name}.{a}" if name else a for a in ("gate_proj", "up_proj", "down_proj")]
        if not all(f in taken for f in full):
            continue
        why = gated_mlp_skip_reason(mlp)
        if why:
            report.skipped.append((name or type(mlp).__name__, f"MLP not fused: {why}"))
            continue
        gate, up = mlp.gate_proj, mlp.up_proj
        if fuse_pair and not fuse_pair_skip_reason(gate, up):
            FusedPair(gate, up)
        mlp.__dict__["forward"] = GatedMLP(mlp, name=f"{name}.forward" if name else "forward")
        originals.append((mlp, "forward", _INSTANCE_ATTRIBUTE))
        report.fused_mlp.append(name + (" (gate_proj + up_proj one GEMM)" if gate.fused_pair is not None else ""))


def _norm_is_plain_rmsnorm(norm: nn.Module, what: str = "q_a_layernorm") -> Tuple[bool, str]:
    # Our fused kernel computes x * rsqrt(mean(x^2) + eps) * weight; a (1 + weight) norm (Gemma) or
    # one with a bias is another function.
    if not type(norm).__name__.endswith("RMSNorm"):
        return False, f"{what} is a {type(norm).__name__}, not an RMSNorm"
    if getattr(norm, "bias", None) is not None:
        return False, f"{what} has a bias"
    try:
        src = inspect.getsource(type(norm).forward)
    except (OSError, TypeError):
        src = ""
    if re.search(r"1(\.0)?\s*\+\s*self\.weight", src):
        return False, f"{what} scales by (1 + weight)"
    if not any(isinstance(getattr(norm, a, None), (int, float)) for a in ("variance_epsilon", "eps")):
        return False, f"{what} has no eps attribute"
    return True, ""


def _call_arguments(src: str, start: int) -> str:
    """The text between the parenthesis at src[start] and its match ("" if unbalanced)."""
    depth = 0
    for i in range(start, len(src)):
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        if depth == 0:
            return src[start + 1:i]
    return ""


def _input_norm_fusion_skip_reason(layer: nn.Module, attn: nn.Module, var: str) -> str:
    """"" where the decoder layer's input_layernorm can be fused into its attention's FusedPair, else
    why not. Read from both forwards' source: the layer assigns the norm's output to one variable,
    passes it to self.self_attn as the attention's `var` argument and uses it nowhere else (the
    attention's output replaces it); the attention reads `var` only as the pair's input and for its
    shape. DeepSeek-V3: `hidden_states = self.input_layernorm(hidden_states)`, then `hidden_states,
    _ = self.self_attn(hidden_states=hidden_states, ...)`."""
    lcls, acls = type(layer).__name__, type(attn).__name__
    if getattr(attn, "indexer", None) is not None:
        return "an indexer also reads the attention's input (DSA)"
    ok, why = _norm_is_plain_rmsnorm(layer.input_layernorm, "input_layernorm")
    if not ok:
        return why
    src = _forward_source(layer)
    if not src:
        return f"the source of {lcls}.forward is unavailable, so the norm's consumers are unknown"
    assign = re.search(r"\n(\s*)([A-Za-z_]\w*)\s*=\s*self\.input_layernorm\(\s*[A-Za-z_]\w*\s*\)", src)
    if src.count("self.input_layernorm(") != 1 or src.count("self.self_attn(") != 1 or assign is None:
        return f"{lcls}.forward does not call input_layernorm and self_attn once each, the norm's output in a variable"
    out, rest = assign.group(2), src[assign.end():]
    call = rest.find("self.self_attn(")
    line = rest.rfind("\n", 0, call)
    if call < 0 or line < 0 or re.search(rf"\b{out}\b", rest[:line]):
        return f"{lcls}.forward uses input_layernorm's output before the attention"
    if not re.fullmatch(rf"\s*{out}\b[\w\s,]*=\s*", rest[line:call]):
        return f"{lcls}.forward keeps input_layernorm's output past the attention (its output does not replace it)"
    args = _call_arguments(rest, call + len("self.self_attn"))
    if len(re.findall(rf"\b{out}\b(?!\s*=(?!=))", args)) != 1 or not re.search(  # uses, not keyword names
            rf"(\b{var}\s*=\s*{out}\b|^\s*{out}\s*(,|$))", args):
        return f"{lcls}.forward passes input_layernorm's output to the attention other than as its {var}"
    asrc = _forward_source(attn)
    head = asrc.find("def forward(")
    body = asrc[head + len("def forward") + len(_call_arguments(asrc, head + len("def forward"))) + 2:] if head >= 0 else ""
    allowed = [rf"self\.(q_a_proj|kv_a_proj_with_mqa)\(\s*{var}\s*\)", rf"\b{var}\.shape\b"]
    if getattr(attn, "q_proj", None) is None:  # the q_lora_rank = None branch: never taken here
        allowed.append(rf"self\.q_proj\(\s*{var}\s*\)")
    for pattern in allowed:
        body = re.sub(pattern, "", body)
    if not body or re.search(rf"\b{var}\b", body):
        return f"{acls}.forward reads {var} other than through q_a_proj and kv_a_proj_with_mqa"
    return ""


def _norm_fusion_skip_reason(attn: nn.Module) -> str:
    """"" where q_a_layernorm can be fused into q_b_proj (bf16 or FP8-checkpoint alike): its output
    feeds q_b_proj alone and it is a plain RMSNorm; else why not."""
    ok, why = _norm_feeds_q_b_alone(attn)
    if ok:
        ok, why = _norm_is_plain_rmsnorm(attn.q_a_layernorm)
    return "" if ok else why


def _is_fp8_linear(lin: Optional[nn.Module]) -> bool:
    cls = fp8_linear_class()
    return cls is not None and isinstance(lin, cls)


def _fp8_unavailable_here() -> str:
    """Why FP8Linears should stay on transformers' path on this machine, or "". fp8proj takes
    them wherever its kernel runs, and also wherever transformers' own cannot (no `kernels`
    package, offline: the model would not run at all); it leaves them where fp8proj cannot run
    and transformers' hub kernels can (another GPU with `kernels` installed)."""
    ok, why = _lib.device_status()
    if ok:
        return ""
    try:
        from transformers.utils.import_utils import is_kernels_available
        kernels = is_kernels_available()
    except Exception:  # noqa: BLE001
        kernels = False
    if kernels and torch.cuda.is_available():
        return f"fp8proj's FP8 GEMM cannot run here ({why}) and transformers' hub kernels can"
    return ""


def _linear_skip_reason(lin: Optional[nn.Module]) -> str:
    if lin is None:
        return "absent"
    if isinstance(lin, (Fp8ProjLinear, Fp8ProjRMSNormLinear, Fp8CheckpointLinear)):
        return "already patched"
    if type(lin) is not nn.Linear:
        return f"a {type(lin).__name__}, not an nn.Linear (quantized or parallel layers are left alone)"
    return ""


def patch(model: nn.Module, *, enabled: Optional[bool] = True, policy: str = "prefill",
          targets: Sequence[str] = DEFAULT_TARGETS, fuse_norm: bool = True, share_workspace: bool = True,
          scales: Optional[str] = None, share_inputs: bool = True, fuse_pair: bool = True,
          fuse_input_norm: bool = True, fuse_mlp: bool = True, fuse_kv_expand: bool = True,
          **layer_opts) -> PatchReport:
    """Replace `targets` of every MLA attention module of `model` in place (see the module doc).
    scales: the scale format of the FP8 copies made from bf16 weights, "ue8m0" (None: the
    default) or "float" (fp32 amax/448). layer_opts: threshold, decode_ceiling, max_tokens,
    fp8_backend (as for Fp8ProjLinear). The FP8PROJ_* knobs override enabled/policy/threshold/
    scales as in C++. Patch again after moving the model to another device only if it was
    patched on the CPU: modules rebuild their FP8 copies on .to()/.cuda() themselves.
    share_inputs: where q_a_proj and kv_a_proj_with_mqa are both FP8 checkpoint layers run by
    fp8proj and the attention calls both on one variable, quantize that input once for both
    (fp8_linear.SharedActivation: reused only for the same tensor object, unmodified, on the same
    stream; bypassed under torch.compile). False: each quantizes its input itself.
    fuse_pair: with share_inputs, and where their weights can be laid end to end, run the two as
    one GEMM over one buffer that their Parameters become row ranges of (fp8_linear.FusedPair; no
    extra memory). False: shared quantization, two GEMMs, the checkpoint's buffers untouched.
    fuse_input_norm: where such a pair is fused and the decoder layer feeds its input_layernorm's
    output to the attention alone, which reads it only through the pair (checked in both forwards'
    source), the pair takes the norm: one rmsnorm_quantize pass per layer instead of the norm
    module and a quantization (FusedPair.fuse_norm; report.fused_input_norm). False: the norm stays.
    fuse_mlp: where an MLP's gate_proj, up_proj and down_proj are all FP8 checkpoint layers taken
    (targets ALL_FP8_LINEARS) and its forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)) with
    SiLU, silu(gate) * up is quantized for down_proj in one pass (fp8_linear.GatedMLP, installed
    as the MLP's forward; report.fused_mlp) and, with fuse_pair, gate_proj and up_proj run as one
    FusedPair. False: the MLP's own forward.
    fuse_kv_expand: where kv_b_proj is a target and the attention expands its cached latent with
    transformers' expand_kv (checked on a test input), kv_b_proj writes the key layout itself and
    the key copy goes (kv_expand.KeyValueExpand). False: expand_kv stays the class's."""
    if isinstance(targets, str):
        raise TypeError(f"fp8proj: targets must be a sequence of names (e.g. ALL_TARGETS), got the string {targets!r}")
    unknown = set(targets) - set(ALL_FP8_LINEARS)
    if unknown:
        raise ValueError(f"fp8proj: unknown targets {sorted(unknown)}")
    if scales is not None and scales not in ("ue8m0", "float"):
        raise ValueError(f"fp8proj: scales must be 'ue8m0' or 'float', got {scales!r}")
    report = PatchReport()
    originals: List[Tuple[nn.Module, str, nn.Module]] = model.__dict__.get(_ORIGINALS, [])
    attns = find_mla_attention(model)
    fp8_here = _fp8_unavailable_here()
    fp8_plan: Dict[str, Tuple[nn.Module, str, nn.Module]] = {}  # full name -> (parent, attribute, FP8Linear)
    ok, why = _lib.device_status()
    if not attns:
        report.note = "no module with the MLA attention layout (" + ", ".join(MLA_ATTRIBUTES) + ")"
    elif not ok:
        report.note = f"modules run bf16 (torch's matmul on the original weights): {why}"

    # One workspace per kind for the whole model (calls on one stream run one after another):
    # without it every layer would hold max_tokens x K bytes of its own.
    spaces: Dict[bool, Optional[Workspace]] = {False: None, True: None}
    opts = dict(enabled=enabled, policy=policy, scales=scales, **layer_opts)
    plan = []  # (attn name, attn, target, fused?)
    norm_folds: Dict[str, nn.Module] = {}  # FP8-checkpoint q_b_proj name -> its attention (q_a_layernorm fused)
    for aname, attn in attns:
        for t in targets:
            if t == "fp8_linear":
                continue
            full = f"{aname}.{t}" if aname else t
            lin = getattr(attn, t, None)
            if _is_fp8_linear(lin):
                why_not = fp8_here or fp8_linear_skip_reason(lin)
                if why_not:
                    report.left.append((full, why_not))
                else:
                    fp8_plan[full] = (attn, t, lin)
                    if t == "q_b_proj" and fuse_norm:
                        why_unfused = _norm_fusion_skip_reason(attn)
                        if not why_unfused:
                            norm_folds[full] = attn
                        else:
                            report.skipped.append((f"{aname}.q_a_layernorm", f"not fused into q_b_proj: {why_unfused}"))
                continue
            why_not = _linear_skip_reason(lin)
            if why_not:
                if t != "q_proj" or lin is not None:
                    report.skipped.append((full, why_not))
                continue
            fused = False
            if t == "q_b_proj" and fuse_norm:
                why_unfused = _norm_fusion_skip_reason(attn)
                fused = not why_unfused
                if not fused:
                    report.skipped.append((f"{aname}.q_a_layernorm", f"not fused into q_b_proj: {why_unfused}"))
            plan.append((aname, attn, t, fused, full))

    if share_workspace and ok:
        dev_w = [getattr(a, t).weight for _, a, t, _, _ in plan]
        if dev_w and all(w.device.type == "cuda" for w in dev_w):
            max_tokens = int(layer_opts.get("max_tokens") or DEFAULT_MAX_TOKENS)
            for fused in (False, True):
                ks = [getattr(a, t).in_features for _, a, t, f, _ in plan if f == fused]
                ks = [k for k in ks if k % 128 == 0]
                if ks:
                    with torch.cuda.device(dev_w[0].device):
                        spaces[fused] = Workspace(max_tokens, max(ks), with_bf16_rows=fused)
        else:
            pass  # CPU weights: each module makes its own when the model moves to the GPU

    # Every other FP8 module of the model: taken under "fp8_linear", else listed with the reason.
    seen = set(fp8_plan) | {n for n, _ in report.left}
    for name, mod in model.named_modules():
        if name in seen or not is_fp8_checkpoint_module(mod) or not name:
            continue
        if any(name.startswith(p + ".") for p in fp8_plan):
            continue
        parent_name, _, attr = name.rpartition(".")
        why_not = fp8_linear_skip_reason(mod)
        if not why_not and "fp8_linear" not in targets:
            in_attn = any(parent_name == a for a, _ in attns)
            why_not = (f"not a target ({attr} of an MLA attention; targets={tuple(targets)})" if in_attn else
                       "not a target (outside the MLA attention; targets ALL_FP8_LINEARS take it)")
        why_not = why_not or fp8_here
        if why_not:
            report.left.append((name, why_not))
        else:
            fp8_plan[name] = (model.get_submodule(parent_name) if parent_name else model, attr, mod)

    # expand_kv checked now, while kv_b_proj is still the model's nn.Linear.
    expand = []
    for aname, attn, t, fused, full in plan:
        if t == "kv_b_proj" and fuse_kv_expand:
            why_not = expand_kv_skip_reason(attn)
            if why_not:
                report.skipped.append((f"{aname}.expand_kv" if aname else "expand_kv", f"not fused: {why_not}"))
            else:
                expand.append((aname, attn))

    for aname, attn, t, fused, full in plan:
        lin = getattr(attn, t)
        if fused:
            norm = attn.q_a_layernorm
            mod = Fp8ProjRMSNormLinear(norm, lin, name=full, workspace=spaces[True], **opts)
            originals.append((attn, "q_a_layernorm", norm))
            attn.q_a_layernorm = mod.norm_passthrough
            report.fused.append(full)
        else:
            mod = Fp8ProjLinear.from_linear(lin, name=full, workspace=spaces[False], **opts)
        originals.append((attn, t, lin))
        setattr(attn, t, mod)
        report.patched.append(full)

    for aname, attn in expand:
        kv = KeyValueExpand(attn, name=f"{aname}.expand_kv" if aname else "expand_kv")
        attn.expand_kv = kv
        originals.append((attn, "expand_kv", _INSTANCE_ATTRIBUTE))
        kv.prepare()
        report.expanded.append(aname)
        report.expand_extra_bytes += kv.extra_memory_bytes()

    for full, (parent, attr, lin) in fp8_plan.items():
        mod = Fp8CheckpointLinear(lin, name=full)
        originals.append((parent, attr, lin))
        setattr(parent, attr, mod)
        report.patched.append(full)
        report.fp8.append(full)
        if full in norm_folds:
            norm = parent.q_a_layernorm
            passthrough = mod.fuse_norm(norm)
            originals.append((parent, "q_a_layernorm", norm))
            parent.q_a_layernorm = passthrough
            report.fused.append(full)
    _share_pairs(model, attns, fp8_plan, report, share_inputs, fuse_pair)
    if fuse_input_norm:
        _fuse_input_norms(model, attns, report, originals)
    if fuse_mlp:
        _fuse_mlps(model, report, originals, share_inputs and fuse_pair)
    for full in report.fp8:
        # Each GEMM plan made now, outside any CUDA graph capture (a no-op off the GPU path).
        mod = model.get_submodule(full)
        mod.prepare(int(layer_opts.get("max_tokens") or DEFAULT_MAX_TOKENS))
        mem = mod.memory()
        report.fp8_weight_bytes += mem["fp8_weight"] + mem["scales"]
        report.fp8_extra_bytes += mem["extra"]
    if report.fp8 and not any(model.get_submodule(n).uses_fp8_kernel for n in report.fp8):
        note = (f"FP8 checkpoint layers run fp8proj's numerics in torch (each call dequantizes its weight): "
                f"{Fp8CheckpointLinear.__name__}s need fp8proj's CUDA library on a Hopper GPU ({why})")
        report.note = f"{report.note}; {note}" if report.note else note
    model.__dict__[_ORIGINALS] = originals
    return report


def unpatch(model: nn.Module) -> int:
    """Put back every module patch() replaced; returns how many."""
    originals = model.__dict__.pop(_ORIGINALS, [])
    for attn, attr, orig in reversed(originals):
        cur = getattr(attn, attr, None)
        if isinstance(cur, Fp8CheckpointLinear) and cur.fused_pair is not None:
            cur.fused_pair.unfuse()  # each module's own buffers again, as loaded
        if isinstance(cur, (Fp8ProjLinear, Fp8ProjRMSNormLinear)) and cur.__dict__.get("_proj") is not None:
            cur._proj.close()
        if orig is _INSTANCE_ATTRIBUTE:  # a method replaced on the instance: the class's shows again
            attn.__dict__.pop(attr, None)
        else:
            setattr(attn, attr, orig)
    return len(originals)
