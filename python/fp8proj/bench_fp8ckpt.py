"""FP8 checkpoints as users load them, on a Hopper GPU (python -m fp8proj.bench --parts fp8ckpt).

For each model (GLM-5 and DeepSeek-V3 attention dimensions, `--layers` dense layers, random
weights): the bf16 model is written as an FP8 checkpoint in DeepSeek-V3's own layout (every
linear layer but lm_head as F8_E4M3 with an F32 weight_scale_inv = block amax / 448 per 128x128
block, config.json's quantization_config {"quant_method": "fp8", "weight_block_size": [128, 128],
"activation_scheme": "dynamic"}), then loaded with transformers twice, as a user would:

  bf16      from_pretrained(..., quantization_config=FineGrainedFP8Config(dequantize=True)): what
            works offline today, bf16 weights (twice the memory), bf16 speed;
  fp8proj   from_pretrained(...) (FP8Linear modules), then fp8proj's patch(targets=ALL_FP8_LINEARS):
            the checkpoint's e4m3 weights and scales as they are;
  deepgemm  the same FP8 model with each FP8Linear run the way transformers' forward runs it when it
            can fetch DeepGEMM (transformers.integrations.deepgemm: DeepGEMM's
            per_token_cast_to_fp8, then deep_gemm.fp8_gemm_nt on the same weight and scales),
            where `deep_gemm` is importable (else skipped, and the reason is written down).

Measured, the variants interleaved call by call (after a GPU-side delay that lets the host queue a
whole round, so device time is what is timed):
  projections  every distinct FP8 linear of layer 0 alone at M = C x 1024 (prefill, C in --chunks)
               and M = C (decode, C in --decode), L2 flushed before each call; each variant's output
               against the fp32 product of its own dequantized operands (the kernel's tolerance,
               2e-3 relative Frobenius), fp8proj's also against DeepGEMM's. A module alone pays
               its own activation quantization; the row "q_a_proj+kv_a_proj_with_mqa" calls both
               on one input as the attention does (fp8proj: one quantization for the two, bf16:
               two matmuls, DeepGEMM: two casts);
  model        the whole model's prefill of C x 1024 tokens; the decode step (one token for C
               sequences at context 1024, static cache) replayed as a CUDA graph where capture
               works, else eager (said in the row);
  memory       the weights each variant holds (bytes of its parameters) and what fp8proj adds.

Writes fp8ckpt_proj.csv, fp8ckpt_model.csv and the fp8ckpt section of results.json / results.md.
"""
from __future__ import annotations

import inspect
import json
import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn

BF16, E4M3, F32 = torch.bfloat16, torch.float8_e4m3fn, torch.float32
QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}


# ---- the checkpoint ---------------------------------------------------------------------------------

def quantize_checkpoint_weight(w: torch.Tensor):
    """(e4m3 [N, K], fp32 weight_scale_inv [ceil(N/128), ceil(K/128)]) in DeepSeek-V3's layout: per
    128x128 block (the last ones partial) scale = amax / 448, codes = e4m3(w / scale)."""
    n, k = w.shape
    rb, cb = -(-n // 128), -(-k // 128)
    wp = torch.zeros(rb * 128, cb * 128, dtype=F32, device=w.device)
    wp[:n, :k] = w.float()
    blocks = wp.view(rb, 128, cb, 128)
    a = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-12)
    s = a / torch.full_like(a, 448.0)
    q = (blocks / s[:, None, :, None]).clamp(-448.0, 448.0).to(E4M3).view(rb * 128, cb * 128)[:n, :k]
    return q.contiguous(), s.contiguous()


def write_fp8_checkpoint(cfg, path: Path, device="cuda", seed: int = 0) -> dict:
    """A random-init DeepseekV3 of `cfg` written to `path` as an FP8 checkpoint (see the module
    doc). Returns {"tensors": count, "bytes": file bytes}."""
    import transformers
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.DeepseekV3ForCausalLM(cfg).to(dtype=BF16).eval()
    tensors = {}
    for name, t in model.state_dict().items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and t.dim() == 2 and module != "lm_head" and "embed_tokens" not in module:
            q, s = quantize_checkpoint_weight(t)
            tensors[name] = q.cpu()
            tensors[module + ".weight_scale_inv"] = s.cpu()
        else:
            tensors[name] = t.detach().cpu().contiguous()
    del model
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg_dict = cfg.to_dict()
    cfg_dict["quantization_config"] = dict(QUANT_CONFIG)
    cfg_dict["torch_dtype"] = "bfloat16"
    cfg_dict["architectures"] = ["DeepseekV3ForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    return {"tensors": len(tensors), "bytes": (path / "model.safetensors").stat().st_size}


def _fp8_model_by_hand(path: Path, device="cuda"):
    """The FP8 model as transformers' quantizer builds it (replace_with_fp8_linear, pre-quantized),
    its tensors loaded from the file: for where from_pretrained cannot (no `accelerate`)."""
    import transformers
    from safetensors.torch import load_file
    from transformers import FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import FP8Linear, replace_with_fp8_linear

    cfg = transformers.AutoConfig.from_pretrained(path)
    with torch.device(device):
        model = transformers.DeepseekV3ForCausalLM(cfg).to(dtype=BF16).eval()
    q = FineGrainedFP8Config(weight_block_size=[128, 128], modules_to_not_convert=["lm_head"])
    replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=q, pre_quantized=True)
    for m in model.modules():
        if isinstance(m, FP8Linear):
            m.to_empty(device=device)
    model.load_state_dict(load_file(str(path / "model.safetensors"), device=device), strict=True)
    return model


def _dequantized_copy(fp8, device="cuda"):
    """A bf16 model holding codes x scales of every FP8Linear of `fp8` (128x128 blocks, the last
    ones partial), what dequantize=True is meant to give."""
    import transformers
    from transformers.integrations.finegrained_fp8 import FP8Linear

    from .fp8_linear import dequantize_weight

    cfg = transformers.DeepseekV3Config.from_dict({k: v for k, v in fp8.config.to_dict().items()
                                                   if k != "quantization_config"})
    with torch.device(device):
        bf16 = transformers.DeepseekV3ForCausalLM(cfg).to(dtype=BF16).eval()
    sd = {}
    for name, m in fp8.named_modules():
        if isinstance(m, FP8Linear):
            sd[name + ".weight"] = dequantize_weight(m.weight, m.weight_scale_inv).to(BF16)
    sd.update({k: v for k, v in fp8.state_dict().items() if k not in sd and not k.endswith("weight_scale_inv")})
    bf16.load_state_dict(sd, strict=True)
    return bf16


def load_models(path: Path):
    """(bf16 model, FP8 model with FP8Linear modules, notes), as a user loads them: from_pretrained,
    and from_pretrained with FineGrainedFP8Config(dequantize=True). Where either does not work here
    the notes say why and what stands in: the FP8 model built the way transformers' quantizer builds
    it, or the bf16 model dequantized correctly. transformers' Fp8Dequantize takes the block size
    from the scale grid (rows / scale rows), which is wrong for a partial last block (192 rows, 2
    scale rows: 96-row blocks) and raises for 576 rows (kv_a_proj_with_mqa of GLM-5 / DeepSeek-V3:
    "not divisible by scale grid (5, ...)")."""
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import FP8Linear

    from .fp8_linear import dequantize_weight

    notes = {}
    try:
        fp8 = AutoModelForCausalLM.from_pretrained(path, device_map="cuda", dtype=BF16).eval()
        notes["fp8"] = "from_pretrained"
    except ImportError as e:
        fp8 = _fp8_model_by_hand(path)
        notes["fp8"] = f"from_pretrained failed ({e}); built as transformers' quantizer builds it"
    try:
        bf16 = AutoModelForCausalLM.from_pretrained(path, device_map="cuda", dtype=BF16,
                                                    quantization_config=FineGrainedFP8Config(dequantize=True)).eval()
        wrong = [n for n, m in fp8.named_modules() if isinstance(m, FP8Linear) and not torch.equal(
            bf16.get_submodule(n).weight, dequantize_weight(m.weight, m.weight_scale_inv).to(BF16))]
        notes["bf16"] = "from_pretrained(dequantize=True)"
        if wrong:
            del bf16
            bf16 = _dequantized_copy(fp8)
            notes["bf16"] = (f"dequantize=True gave other values than codes x scales for {len(wrong)} weights "
                             f"(e.g. {wrong[0]}); the checkpoint dequantized by fp8proj.fp8_linear.dequantize_weight")
    except (ValueError, ImportError, RuntimeError) as e:
        bf16 = _dequantized_copy(fp8)
        notes["bf16"] = (f"from_pretrained(dequantize=True) failed ({type(e).__name__}: {str(e)[:200]}); the "
                         "checkpoint dequantized by fp8proj.fp8_linear.dequantize_weight instead")
    torch.cuda.empty_cache()
    return bf16, fp8, notes


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


# ---- DeepGEMM through the module interface -------------------------------------------------------

def deepgemm_status():
    """(module, "") where `deep_gemm` imports, else (None, why)."""
    try:
        import deep_gemm
    except Exception as e:  # noqa: BLE001 - the reason goes into the results
        return None, f"deep_gemm is not importable here ({type(e).__name__}: {e})"
    if not hasattr(deep_gemm, "fp8_gemm_nt"):
        return None, "this deep_gemm has no fp8_gemm_nt"
    return deep_gemm, ""


def _per_token_cast(deep_gemm):
    """DeepGEMM's own per_token_cast_to_fp8 (the one transformers' DeepGEMM path calls) with
    transformers' SM90 arguments (use_ue8m0=False, gran_k=128); where this build lacks it, the
    same rule in torch: amax clamped at 1e-4, scale amax / 448, codes e4m3(x * (1 / scale))."""
    fn = None
    for mod in ("deep_gemm.utils", "deep_gemm.utils.math"):
        try:
            fn = getattr(__import__(mod, fromlist=["per_token_cast_to_fp8"]), "per_token_cast_to_fp8")
            break
        except (ImportError, AttributeError):
            continue
    if fn is not None:
        kw = {"use_ue8m0": False}
        if "gran_k" in inspect.signature(fn).parameters:
            kw["gran_k"] = 128
        return lambda x: fn(x, **kw), "deep_gemm.utils.per_token_cast_to_fp8"

    def cast(x):
        m, k = x.shape
        v = x.view(m, k // 128, 128)
        sf = v.abs().float().amax(dim=2).clamp(1e-4) / 448.0
        return (v * (1.0 / sf.unsqueeze(2))).to(E4M3).view(m, k), sf
    return cast, "torch (DeepGEMM's per_token_cast_to_fp8 rule)"


class DeepGemmLinear(nn.Module):
    """An FP8Linear run as transformers.integrations.deepgemm.deepgemm_fp8_fp4_linear runs it on
    SM90: per_token_cast_to_fp8(x) (fp32 scales [M, K/128], DeepGEMM lays them out itself), then
    deep_gemm.fp8_gemm_nt((x, sx), (weight, weight_scale_inv), out), plus the bias."""

    def __init__(self, source: nn.Module, deep_gemm, cast):
        super().__init__()
        self.__dict__["source"] = source
        self.weight, self.bias = source.weight, source.bias
        s = source.weight_scale_inv
        self.register_buffer("scale", s.detach().float() if s.dtype != F32 else s.detach(), persistent=False)
        self.dg, self.cast = deep_gemm, cast
        self.n = source.weight.shape[0]

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        xq, xs = self.cast(x2)
        out = torch.empty(x2.shape[0], self.n, device=x.device, dtype=x.dtype)
        self.dg.fp8_gemm_nt((xq, xs), (self.weight, self.scale), out)
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*x.shape[:-1], self.n)


# ---- timing ----------------------------------------------------------------------------------------

class Flush:
    """Writes twice the L2 before a timed call: the weight comes from HBM, as in a model where other
    layers' weights pass through the cache between two calls of one layer."""

    def __init__(self):
        props = torch.cuda.get_device_properties(0)
        self.buf = torch.empty(2 * max(props.L2_cache_size, 50 << 20), dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buf.fill_(1)


def time_rounds(fns, reps: int, warmup: int, flush=None, delay_us: float = 0.0, samples: bool = False):
    """Median device ms of each fn, interleaved call by call (A B C A B C ...): clock and power drift
    hit every variant alike. delay_us of GPU sleep before each round lets the host queue the round
    ahead, so host overhead is not what is timed. samples=True: each fn's ms per timed round
    instead of the median (rounds aligned across fns, for paired differences)."""
    per = [[] for _ in fns]
    for r in range(warmup + reps):
        if delay_us:
            torch.cuda._sleep(int(delay_us * 1.5e3))  # ~1.5 GHz: cycles per us
        evs = []
        for fn in fns:
            if flush:
                flush()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            evs.append((a, b))
        torch.cuda.synchronize()
        if r >= warmup:
            for i, (a, b) in enumerate(evs):
                per[i].append(a.elapsed_time(b))
    return per if samples else [statistics.median(p) for p in per]


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _dequant_w(w, s):
    n, k = w.shape
    s = s.float()
    return w.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


def _dequant_codes(xv, xs):
    """e4m3 codes [M, K] and their scales [K/128, ld >= M] (the ops' layout) as fp32 values."""
    return xv.float() * xs[:, :xv.shape[0]].t().repeat_interleave(128, dim=1)


def _dequant_x_ours(x, quantize=None):
    """fp8proj's codes of x dequantized: quantize_activation's, or those of `quantize` (the fused
    norm's pass, the same layout)."""
    from fp8proj import ops
    return _dequant_codes(*(ops.quantize_activation(x, "float") if quantize is None else quantize(x)))


def _dequant_x_deepgemm(x, cast):
    xq, xs = cast(x)
    return xq.float() * xs.float().repeat_interleave(128, dim=1)[:, :x.shape[1]]


# ---- the benchmark ----------------------------------------------------------------------------------

def _projection_point(model, lins_bf16, mos, mds, cast, kind, m, reps, warmup, flush, device="cuda",
                      alt=None, norm=None) -> dict:
    """One row: the modules of `mos` (fp8proj), `lins_bf16` and `mds` (DeepGEMM, or None) called one
    after another on one input of m rows, timed together. One module: it alone, its activation
    quantization included. q_a_proj and kv_a_proj_with_mqa together: the attention's pattern, where
    fp8proj's modules run one fused GEMM (patch()'s FusedPair) or share one quantization
    (SharedActivation) and DeepGEMM's wrapper casts twice, as transformers' path does. alt: the
    same pair as a SharedActivation (two GEMMs), timed in the same rounds beside the fused one.
    Each output against the fp32 product of its own dequantized operands; the row gets the largest
    error of its modules.
    norm: (the model's RMSNorm module before the pair, the same norm in one pass, the fused pass's
    quantizer) where fp8proj's pair has taken that norm (FusedPair.fuse_norm): every variant then
    starts from the un-normalized rows -- bf16, DeepGEMM and the unfused pair behind the norm
    module, fp8proj's pair alone (its one rmsnorm_quantize pass) -- and the row also times bf16
    behind the one-pass norm (bf16_onepass_us; speedup_vs_bf16 is against the faster bf16) and each
    norm by itself."""
    kk = mos[0].in_features
    x = torch.randn(m, kk, dtype=BF16, device=device)
    if norm is not None:
        norm_mod, norm_onepass, norm_quant = norm
        x = x * 3  # rows of a residual stream: the norm's scale matters
    use_dg, dg_err = mds, ""
    if mds is not None:
        try:
            for md in mds:
                md(x)  # the first call: DeepGEMM's JIT compiles this problem's kernel
        except Exception as e:  # noqa: BLE001 - a shape DeepGEMM declines is a result
            use_dg, dg_err = None, f"{type(e).__name__}: {str(e)[:160]}"

    def calls(mods, pre=None):
        if pre is None:
            return lambda: [f(x) for f in mods]
        return lambda: [f(xn) for xn in [pre(x)] for f in mods]  # the norm once, then each module

    before = norm_mod if norm is not None else None
    fns = [calls(lins_bf16, before), calls(mos)] + ([calls(use_dg, before)] if use_dg is not None else [])
    if alt is not None:
        fns.append(calls(alt, before))
    extra = [] if norm is None else [calls(lins_bf16, norm_onepass), lambda: norm_mod(x), lambda: norm_onepass(x)]
    outs = [f() for f in fns + extra]  # also the first calls: plans
    if x.is_cuda:
        torch.cuda.synchronize()
    # Errors over the first 4096 rows (activations are quantized per row: a subset is exact).
    r_ = min(m, 4096)
    w_refs = [_dequant_w(mo.weight, mo._scales()).t() for mo in mos]
    xn = x[:r_] if norm is None else norm_mod(x[:r_])  # what the unfused variants quantize
    xo = _dequant_x_ours(x[:r_], norm_quant) if norm is not None else _dequant_x_ours(xn)
    err_ours = max(_rel(y[:r_], xo @ w) for y, w in zip(outs[1], w_refs))
    err_dg = ours_vs_dg = err_alt = None
    if alt is not None:
        xa = xo if norm is None else _dequant_x_ours(xn)
        err_alt = max(_rel(y[:r_], xa @ w) for y, w in zip(outs[len(fns) - 1], w_refs))
    if use_dg is not None:
        xd = _dequant_x_deepgemm(xn, cast)
        err_dg = max(_rel(y[:r_], xd @ w) for y, w in zip(outs[2], w_refs))
        ours_vs_dg = max(_rel(a[:r_], b[:r_]) for a, b in zip(outs[1], outs[2]))
    del outs, w_refs, xo, xn
    t = time_rounds(fns + extra, reps, warmup, flush, delay_us=1000 + 0.05 * m * len(mos))
    t, t_extra = t[:len(fns)], t[len(fns):]
    t_bf16_module = t[0]
    if norm is not None:
        t = [min(t[0], t_extra[0])] + t[1:]  # the faster bf16: the bar is against it
    shared = [mo.shared_activation for mo in mos]
    fused = [mo.fused_pair for mo in mos]
    pair = len(mos) > 1
    if pair:
        g, f = shared[0], fused[0]
        sharing = g is not None and all(s is g for s in shared)
        fusing = f is not None and all(x is f for x in fused) and f.intact()
        how = ("one fused GEMM over both weights after one quantization (fused)" if fusing else
               "quantizes it once (shared), two GEMMs" if sharing else "quantizes it twice (not shared)")
        note = (f"both on one input as the attention calls them: fp8proj {how}; bf16 two matmuls; DeepGEMM two "
                "casts" + ("; fp8proj_shared_us: the same pair unfused, quantization shared" if alt else ""))
        if norm is not None:
            note = ("the decoder layer's input_layernorm, then " + note + "; fp8proj's pair normalizes and quantizes "
                    "in one pass (rmsnorm_quantize), the others run the norm module first; bf16_us: the faster of "
                    "bf16 behind the norm module and behind the one-pass norm")
    else:
        note = "one module alone: its own activation quantization included"
        if norm is not None:
            note = ("q_a_layernorm, then the module: fp8proj's normalizes and quantizes in one pass (rmsnorm_quantize), "
                    "bf16 runs the norm module first; bf16_us: the faster of bf16 behind the norm module and behind the "
                    "one-pass norm")
    for g in {id(s): s for s in shared + fused + [a.shared_activation for a in alt or []] if s is not None}.values():
        g.clear()  # the timed input: nothing to keep after the row
    short = (("input_layernorm+" if pair else "q_a_layernorm+") if norm is not None else "") + "+".join(
        mo.name.split(".layers.0.")[1] if i == 0 else mo.name.rsplit(".", 1)[1] for i, mo in enumerate(mos))
    row = dict(model=model, projection=short, n="+".join(str(mo.out_features) for mo in mos) if pair else
               mos[0].out_features, k=kk, kind=kind, m=m, pair=pair, note=note,
               bf16_us=round(t[0] * 1e3, 2), fp8proj_us=round(t[1] * 1e3, 2), speedup_vs_bf16=round(t[0] / t[1], 4),
               fp8proj_shared_us=round(t[-1] * 1e3, 2) if alt is not None else None,
               fused_over_shared=round(t[-1] / t[1], 4) if alt is not None else None,
               deepgemm_us=round(t[2] * 1e3, 2) if use_dg is not None else None,
               speedup_vs_deepgemm=round(t[2] / t[1], 4) if use_dg is not None else None,
               deepgemm_error=dg_err,
               fp8proj_err_vs_dequant=float(f"{err_ours:.3e}"),
               fp8proj_shared_err_vs_dequant=None if err_alt is None else float(f"{err_alt:.3e}"),
               deepgemm_err_vs_dequant=None if err_dg is None else float(f"{err_dg:.3e}"),
               fp8proj_vs_deepgemm=None if ours_vs_dg is None else float(f"{ours_vs_dg:.3e}"),
               within_tolerance=err_ours <= 2e-3, explain=" | ".join(mo.explain(m) for mo in mos))
    if norm is not None:
        row.update(bf16_module_norm_us=round(t_bf16_module * 1e3, 2), bf16_onepass_us=round(t_extra[0] * 1e3, 2),
                   norm_module_us=round(t_extra[1] * 1e3, 2), norm_onepass_us=round(t_extra[2] * 1e3, 2))
    del x
    return row


def _onepass_silu_mul():
    """bf16 silu(g) * u as one fused kernel (torch.compile, Triton), or (None, why) where it cannot
    be built here: the bf16 side's best elementwise pass, beside eager's two."""
    try:
        fn = torch.compile(lambda g, u: torch.nn.functional.silu(g) * u)
        g = torch.randn(4, 256, dtype=BF16, device="cuda")
        fn(g, g)
        return fn, ""
    except Exception as e:  # noqa: BLE001 - no compiler here: the row says so
        return None, f"{type(e).__name__}: {str(e)[:160]}"


def _dequant_silu_mul(g, u):
    """fp8proj's codes of silu(g) * u, as GatedMLP makes them, dequantized."""
    return _dequant_codes(*torch.ops.fp8proj.silu_mul_quantize(g, u, "float"))


def _mlp_point(model, bf16_mlp, mlp, dg, alt, onepass, kind, m, reps, warmup, flush, device="cuda") -> dict:
    """One row for a gated MLP as its forward calls the three projections, timed together:
    fp8proj's patched MLP (GatedMLP: gate_proj + up_proj as one FusedPair where fused, one
    silu_mul_quantize pass, down_proj's GEMM); bf16 the dequantized model's MLP (three matmuls,
    eager silu and product) and the same with the elementwise part as one compiled kernel
    (bf16_onepass_us; speedup_vs_bf16 is against the faster); DeepGEMM's three wrappers in the MLP's
    own forward; fp8proj_shared_us: fp8proj's three modules unfused in the MLP's own forward. The
    error is down_proj's output against the fp32 product of its own dequantized codes (those of the
    fused pass over fp8proj's gate and up outputs)."""
    g_mod, u_mod, d_mod = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    kk, inter = g_mod.in_features, g_mod.out_features
    x = torch.randn(m, kk, dtype=BF16, device=device)
    silu = torch.nn.functional.silu

    def own(gate, up, down):
        return lambda: down(silu(gate(x)) * up(x))

    fns = [lambda: bf16_mlp(x), lambda: mlp(x)]
    use_dg, dg_err = dg, ""
    if dg is not None:
        try:
            own(*dg)()  # DeepGEMM's JIT for these problems
        except Exception as e:  # noqa: BLE001 - a shape DeepGEMM declines is a result
            use_dg, dg_err = None, f"{type(e).__name__}: {str(e)[:160]}"
    if use_dg is not None:
        fns.append(own(*use_dg))
    fns.append(own(*alt))
    b_lins = (bf16_mlp.gate_proj, bf16_mlp.up_proj, bf16_mlp.down_proj)
    extra = [] if onepass is None else [lambda: b_lins[2](onepass(b_lins[0](x), b_lins[1](x)))]
    outs = [f() for f in fns + extra]
    if x.is_cuda:
        torch.cuda.synchronize()
    r_ = min(m, 4096)
    xs = x[:r_]
    g, u = g_mod(xs), u_mod(xs)
    xo = _dequant_silu_mul(g, u)
    y_ref = xo @ _dequant_w(d_mod.weight, d_mod._scales()).t()
    err = _rel(outs[1][:r_], y_ref)
    err_alt = _rel(outs[len(fns) - 1][:r_], outs[1][:r_])
    e2e = _rel(outs[1], outs[0])
    del outs, g, u, xs, xo, y_ref
    t = time_rounds(fns + extra, reps, warmup, flush, delay_us=1000 + 0.15 * m)
    t, t_extra = t[:len(fns)], t[len(fns):]
    t_bf16 = min([t[0]] + t_extra)
    n_dg = 2 if use_dg is not None else None
    for grp in {id(v): v for v in (g_mod.fused_pair, g_mod.shared_activation) if v is not None}.values():
        grp.clear()
    row = dict(model=model, projection="mlp.gate_proj+up_proj+down_proj", n=f"{inter}+{inter}+{d_mod.out_features}",
               k=kk, kind=kind, m=m, pair=True,
               note=("the MLP as its forward calls them: fp8proj gate_proj + up_proj "
                     f"{'as one fused GEMM' if g_mod.fused_pair is not None else 'apart'}, silu(gate) * up quantized in "
                     "one pass, down_proj; bf16 three matmuls and eager silu, product (bf16_onepass_us: the elementwise "
                     "part as one compiled kernel; bf16_us the faster); DeepGEMM three wrappers, eager silu and "
                     "product; fp8proj_shared_us: fp8proj's three modules in the MLP's own forward"),
               bf16_us=round(t_bf16 * 1e3, 2), fp8proj_us=round(t[1] * 1e3, 2), speedup_vs_bf16=round(t_bf16 / t[1], 4),
               bf16_eager_us=round(t[0] * 1e3, 2),
               bf16_onepass_us=round(t_extra[0] * 1e3, 2) if t_extra else None,
               fp8proj_shared_us=round(t[-1] * 1e3, 2), fused_over_shared=round(t[-1] / t[1], 4),
               deepgemm_us=round(t[n_dg] * 1e3, 2) if n_dg else None,
               speedup_vs_deepgemm=round(t[n_dg] / t[1], 4) if n_dg else None, deepgemm_error=dg_err,
               fp8proj_err_vs_dequant=float(f"{err:.3e}"), fp8proj_shared_err_vs_dequant=None,
               deepgemm_err_vs_dequant=None, fp8proj_vs_deepgemm=None,
               fused_vs_unfused_rel=float(f"{err_alt:.3e}"), fp8proj_vs_bf16_rel=float(f"{e2e:.3e}"),
               within_tolerance=err <= 2e-3, explain=mlp.forward.explain(m) if hasattr(mlp.forward, "explain") else "")
    del x
    return row


@torch.no_grad()
def bench_model(name, cfg, ckpt: Path, chunks, decode, reps, warmup, log=print, dg_prewarm: int = 0):
    import transformers
    from fp8proj.fp8_linear import Fp8CheckpointLinear, SharedActivation
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch

    t0 = time.time()
    if not (ckpt / "model.safetensors").exists():
        info = write_fp8_checkpoint(cfg, ckpt)
        log(f"[fp8ckpt] {name}: wrote {ckpt} ({info['tensors']} tensors, {info['bytes'] / 1e9:.2f} GB) "
            f"in {time.time() - t0:.0f} s")
    bf16, fp8, load_notes = load_models(ckpt)
    log(f"[fp8ckpt] {name}: loaded: {load_notes}")
    FP8Linear = transformers.integrations.finegrained_fp8.FP8Linear
    fp8_names = [n for n, m in fp8.named_modules() if isinstance(m, FP8Linear)]
    bytes_bf16, bytes_fp8 = param_bytes(bf16), param_bytes(fp8)
    log(f"[fp8ckpt] {name}: loaded in {time.time() - t0:.0f} s; {len(fp8_names)} FP8Linear modules; weights "
        f"bf16 {bytes_bf16 / 1e9:.3f} GB, FP8 {bytes_fp8 / 1e9:.3f} GB")

    # The three variants of the FP8 model, by swapping its modules in place.
    originals = {n: fp8.get_submodule(n) for n in fp8_names}
    max_tokens = max(chunks) * 1024
    report = patch(fp8, targets=ALL_FP8_LINEARS, max_tokens=max_tokens)
    log(str(report))
    ours = {n: fp8.get_submodule(n) for n in fp8_names}
    assert all(isinstance(m, Fp8CheckpointLinear) and m.uses_fp8_kernel for m in ours.values()), report
    dg_mod, dg_why = deepgemm_status()
    dg, cast, cast_name = {}, None, ""
    if dg_mod is not None and dg_prewarm > 0:
        prewarm_deepgemm(cfg, chunks, decode, dg_prewarm, log)
    if dg_mod is not None:
        cast, cast_name = _per_token_cast(dg_mod)
        dg = {n: DeepGemmLinear(originals[n], dg_mod, cast) for n in fp8_names}
    else:
        log(f"[fp8ckpt] DeepGEMM skipped: {dg_why}")
    # The norms patch() fused (q_a_layernorm into q_b_proj, input_layernorm into the pair) stand as
    # pass-throughs in the patched model: fp8proj's variant keeps them, the others get the norm back.
    from fp8proj.torch import DeferredRMSNorm
    for n, mod in list(fp8.named_modules()):
        if isinstance(mod, DeferredRMSNorm):
            ours[n], originals[n] = mod, mod.original
            if dg:
                dg[n] = mod.original

    def use(mods):
        for n, m in mods.items():
            parent, _, attr = n.rpartition(".")
            setattr(fp8.get_submodule(parent), attr, m)

    variants = [("bf16", None), ("fp8proj", ours)] + ([("deepgemm", dg)] if dg else [])
    flush = Flush()
    proj_rows, model_rows = [], []

    # -- every distinct FP8 linear of layer 0 alone, then the pair that reads one input -------------------
    layer0 = [n for n in fp8_names if ".layers.0." in n]
    pair = [n for end in (".self_attn.q_a_proj", ".self_attn.kv_a_proj_with_mqa") for n in layer0 if n.endswith(end)]
    pair_fused = len(pair) == 2 and ours[pair[0]].fused_pair is not None
    # A fused pair's member alone would run the pair's GEMM: the pair is timed as the attention calls it.
    mlp0 = next((n.rsplit(".", 1)[0] for n in layer0 if n.endswith(".mlp.down_proj")), None)
    mlp_mod = fp8.get_submodule(mlp0) if mlp0 else None
    from fp8proj.fp8_linear import GatedMLP
    mlp_fused = mlp_mod is not None and isinstance(vars(mlp_mod).get("forward"), GatedMLP)
    mlp_paired = mlp_fused and mlp_mod.gate_proj.fused_pair is not None
    # A fused pair's member alone would run the pair's GEMM: gate_proj and up_proj are timed in the MLP's row.
    groups = [[n] for n in layer0 if not (pair_fused and n in pair)
              and not (mlp_paired and n.rsplit(".", 1)[-1] in ("gate_proj", "up_proj") and ".mlp." in n)]
    alt = None
    if len(pair) == 2:
        groups.append(pair)  # as the attention calls them: both on one input
        if pair_fused:  # the same two weights unfused (shared quantization, two GEMMs), same rounds
            alt = [Fp8CheckpointLinear(originals[n], name=n + " (unfused)") for n in pair]
            group = SharedActivation()
            for a in alt:
                group.add(a)
            for a in alt:
                a.prepare(max_tokens)
            log(f"[fp8ckpt] {name}: q_a_proj and kv_a_proj_with_mqa fused (one GEMM, N={ours[pair[0]].fused_pair.weight.shape[0]}): "
                "timed as the pair, beside the same pair unfused")
    def norm_spec(bf16_norm, fused_norm, eps):
        """(the bf16 model's norm module, the same norm in one pass, fp8proj's fused pass) for a row
        whose fp8proj side took that norm: every side then starts from the norm's input."""
        nw = bf16_norm.weight
        return (bf16_norm, lambda x: torch.nn.functional.rms_norm(x, (x.shape[-1],), nw, eps),
                lambda x: torch.ops.fp8proj.rmsnorm_quantize(x, fused_norm.weight.detach(), eps, "float"))

    norms = {}  # group (tuple of names) -> norm_spec
    if pair_fused and ours[pair[0]].fused_pair.norm is not None:
        fp = ours[pair[0]].fused_pair
        norms[tuple(pair)] = norm_spec(bf16.get_submodule(pair[0].rsplit(".self_attn.", 1)[0] + ".input_layernorm"),
                                       fp.norm, fp.norm_eps)
    for n in layer0:
        if ours[n].pre_norm is not None:  # q_a_layernorm fused into q_b_proj
            norms[(n,)] = norm_spec(bf16.get_submodule(n.rsplit(".", 1)[0] + ".q_a_layernorm"), ours[n].pre_norm,
                                    ours[n].norm_eps)
    if norms:
        log(f"[fp8ckpt] {name}: the norms fused into " + ", ".join("+".join(k) for k in norms) + ": their rows "
            "time the norm on every side, bf16 also behind torch.nn.functional.rms_norm (one pass)")
    for names in groups:
        for kind, ms in (("prefill", [c * 1024 for c in chunks]), ("decode", list(decode))):
            for m in ms:
                row = _projection_point(name, [bf16.get_submodule(n) for n in names], [ours[n] for n in names],
                                        [dg[n] for n in names] if dg else None, cast, kind, m, reps, warmup, flush,
                                        alt=alt if names == pair else None,
                                        norm=norms.get(tuple(names)))
                proj_rows.append(row)
                log(f"[fp8ckpt] {name} {row['projection']} {row['n']}x{row['k']} {kind} M={m}: bf16 "
                    f"{row['bf16_us']:.1f} us, fp8proj {row['fp8proj_us']:.1f} us ({row['speedup_vs_bf16']:.3f}x)" +
                    (f", deepgemm {row['deepgemm_us']:.1f} us ({row['speedup_vs_deepgemm']:.3f}x)"
                     if row["deepgemm_us"] is not None else
                     f", deepgemm: {row['deepgemm_error']}" if row["deepgemm_error"] else "") +
                    (f", unfused {row['fp8proj_shared_us']:.1f} us (fused {row['fused_over_shared']:.3f}x)"
                     if row["fp8proj_shared_us"] is not None else "") +
                    (f"; bf16 behind the norm module {row['bf16_module_norm_us']:.1f} us, behind the one-pass norm "
                     f"{row['bf16_onepass_us']:.1f} us; the norms alone {row['norm_module_us']:.1f} / "
                     f"{row['norm_onepass_us']:.1f} us" if "bf16_onepass_us" in row else "") +
                    f"; err {row['fp8proj_err_vs_dequant']:.2e}")
        torch.cuda.empty_cache()

    if mlp_fused:
        # The MLP as its forward calls the three projections: fp8proj's GatedMLP against bf16's MLP
        # (eager, and with a one-kernel silu * up), DeepGEMM and fp8proj's modules unfused.
        onepass, why_onepass = _onepass_silu_mul()
        if onepass is None:
            log(f"[fp8ckpt] {name}: bf16 one-pass silu * up unavailable ({why_onepass}): eager bf16 only")
        names3 = [f"{mlp0}.{a}" for a in ("gate_proj", "up_proj", "down_proj")]
        alt3 = [Fp8CheckpointLinear(originals[n], name=n + " (unfused)") for n in names3]
        for a in alt3:
            a.prepare(max_tokens)
        dg3 = [dg[n] for n in names3] if dg else None
        for kind, ms in (("prefill", [c * 1024 for c in chunks]), ("decode", list(decode))):
            for m in ms:
                row = _mlp_point(name, bf16.get_submodule(mlp0), mlp_mod, dg3, alt3, onepass, kind, m, reps, warmup,
                                 flush)
                proj_rows.append(row)
                log(f"[fp8ckpt] {name} {row['projection']} {kind} M={m}: bf16 {row['bf16_us']:.1f} us (eager "
                    f"{row['bf16_eager_us']:.1f}, one-pass act {row['bf16_onepass_us']}), fp8proj "
                    f"{row['fp8proj_us']:.1f} us ({row['speedup_vs_bf16']:.3f}x), unfused {row['fp8proj_shared_us']:.1f} "
                    f"us (fused {row['fused_over_shared']:.3f}x)" +
                    (f", deepgemm {row['deepgemm_us']:.1f} us ({row['speedup_vs_deepgemm']:.3f}x)"
                     if row["deepgemm_us"] is not None else "") +
                    f"; err {row['fp8proj_err_vs_dequant']:.2e}, vs unfused {row['fused_vs_unfused_rel']:.2e}")
        del alt3
        torch.cuda.empty_cache()

    # -- the whole model: prefill ------------------------------------------------------------------------
    def forward_of(label, mods):
        def run(ids, **kw):
            if mods is None:
                return bf16(input_ids=ids, use_cache=False, **kw).logits
            use(mods)
            return fp8(input_ids=ids, use_cache=False, **kw).logits
        return run

    runs = {label: forward_of(label, mods) for label, mods in variants}
    for c in chunks:
        ids = torch.randint(0, cfg.vocab_size, (c, 1024), device="cuda")
        logits = {label: run(ids)[:, ::16].float() for label, run in runs.items()}  # every 16th position
        errs = {label: _rel(v, logits["bf16"]) for label, v in logits.items() if label != "bf16"}
        del logits
        t = time_rounds([lambda r=r: r(ids) for r in runs.values()], reps, warmup)
        row = dict(model=name, kind="prefill", seqs=c, tokens=c * 1024, cuda_graph=False,
                   **{f"{label}_ms": round(v, 3) for label, v in zip(runs, t)},
                   fp8proj_speedup_vs_bf16=round(t[0] / t[1], 4),
                   deepgemm_ms_over_fp8proj=round(t[2] / t[1], 4) if len(t) > 2 else None,
                   **{f"{label}_logits_rel_err_vs_bf16": float(f"{e:.3e}") for label, e in errs.items()})
        model_rows.append(row)
        log(f"[fp8ckpt] {name} prefill C={c}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in zip(runs, t)) +
            f"; fp8proj {t[0] / t[1]:.3f}x bf16")
        del ids
        torch.cuda.empty_cache()

    # -- the whole model: a decode step at context 1024 ----------------------------------------------------
    for c in decode:
        step_rows = decode_step(name, cfg, bf16, fp8, variants, use, c, reps, warmup, log)
        model_rows.extend(step_rows)
        torch.cuda.empty_cache()

    use(originals)  # the FP8 model as loaded, for whoever holds it
    memory = dict(model=name, bf16_weight_bytes=bytes_bf16, fp8_weight_bytes=bytes_fp8,
                  fp8_over_bf16=round(bytes_fp8 / bytes_bf16, 4), fp8proj_extra_bytes=report.fp8_extra_bytes,
                  fp8_linears=len(fp8_names), fp8proj_taken=len(report.fp8), left=report.left,
                  deepgemm=dg_why or f"deep_gemm {getattr(dg_mod, '__version__', '?')}, activations by {cast_name}",
                  loading=load_notes)
    del bf16, fp8, ours, dg, originals
    torch.cuda.empty_cache()
    return proj_rows, model_rows, memory


def cache_kwargs(model: nn.Module, cache, position: torch.Tensor) -> dict:
    """Keyword arguments of a forward step of `model` against `cache` at `position` (the positions of
    the step's tokens), named as this transformers names them: `cache` where the forward declares
    it (`past_key_values` is deprecated there and goes in 5.40), else `past_key_values`.
    cache_position is passed either way: older releases place the step's tokens by it, newer ones
    take it among **kwargs and ignore it (see _rewind)."""
    params = inspect.signature(type(model).forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache, "cache_position": position, "use_cache": True}


def _rewind(cache, length: int) -> None:
    """Every step decodes the token at position `length`: transformers' static layers write at their
    own running count (`cumulative_length`, advanced by each update, cache_position ignored), so
    without this a replayed step writes one slot further each time and runs off the cache's end."""
    for layer in getattr(cache, "layers", ()):
        n = getattr(layer, "cumulative_length", None)
        if isinstance(n, torch.Tensor):
            n.fill_(length)
        elif isinstance(n, int):
            layer.cumulative_length = length


def capture_graph(step):
    """(run, "") where `step` captures as a CUDA graph (warmed up three times on a side stream
    first, as torch.cuda.graphs asks): run() replays it and returns the step's output tensor, which
    the graph rewrites in place. Where capture fails: (step, why), run eagerly."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = step()
        if not (isinstance(out, torch.Tensor) and out.is_cuda):
            # Work on CPU tensors runs while capturing and leaves an empty graph: replaying it
            # would time nothing.
            raise RuntimeError(f"the step's output is on {getattr(out, 'device', type(out).__name__)}: "
                               "a CUDA graph records only CUDA work")
    except Exception as e:  # noqa: BLE001 - eager then, and the reason goes into the row
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return step, f"{type(e).__name__}: {str(e)[:200]}"

    def run(g=g, out=out):
        g.replay()
        return out
    return run, ""


def decode_step(name, cfg, bf16, fp8, variants, use, c, reps, warmup, log):
    """One decode step for c sequences at context 1024 (static cache, filled by a prefill), per
    variant, replayed as a CUDA graph where capture works (else eager); interleaved."""
    from transformers import StaticCache

    L = 1024
    steps, notes = [], {}
    caches = {}
    for label, mods in variants:
        model = bf16 if mods is None else fp8
        if mods is not None:
            use(mods)
        key = "bf16" if mods is None else "fp8"
        if key not in caches:  # one cache per model: the FP8 variants write the same slots
            cache = StaticCache(config=model.config, max_cache_len=L + 8)
            ids = torch.randint(0, cfg.vocab_size, (c, L), device="cuda")
            model(input_ids=ids, **cache_kwargs(model, cache, torch.arange(L, device="cuda")))
            caches[key] = cache
        cache = caches[key]
        tok = torch.randint(0, cfg.vocab_size, (c, 1), device="cuda")
        pos = torch.tensor([L], device="cuda")

        def step(model=model, cache=cache, tok=tok, pos=pos, mods=mods):
            if mods is not None:
                use(mods)
            _rewind(cache, L)
            return model(input_ids=tok, **cache_kwargs(model, cache, pos)).logits

        run, why = capture_graph(step)
        steps.append(run)
        notes[label] = why
    t = time_rounds(steps, reps, warmup, delay_us=500)
    labels = [label for label, _ in variants]
    graphs = all(not notes[label] for label in labels)
    row = dict(model=name, kind="decode", seqs=c, tokens=c, context=L + 1, cuda_graph=graphs,
               **{f"{label}_ms": round(v, 4) for label, v in zip(labels, t)},
               fp8proj_speedup_vs_bf16=round(t[0] / t[1], 4),
               deepgemm_ms_over_fp8proj=round(t[2] / t[1], 4) if len(t) > 2 else None,
               capture_errors={k: v for k, v in notes.items() if v})
    log(f"[fp8ckpt] {name} decode C={c} ({'CUDA graphs' if graphs else 'eager: ' + str(row['capture_errors'])}): " +
        ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in zip(labels, t)) + f"; fp8proj {t[0] / t[1]:.3f}x bf16")
    del caches
    return [row]


def _pair_members(projection: str) -> list:
    """["q_a_proj", "kv_a_proj_with_mqa"] of a pair row's "self_attn.q_a_proj+kv_a_proj_with_mqa"."""
    return [p.rsplit(".", 1)[-1] for p in projection.split("+")]


def summarize(proj_rows, model_rows, memories) -> list:
    """Markdown lines: the bars of the FP8-checkpoint issue against the measured rows."""
    md = ["## FP8 checkpoints as users load them (transformers FP8Linear), same run", ""]
    md += ["| model | projection | N x K | kind | M | bf16 us | fp8proj us | vs bf16 | DeepGEMM us | DeepGEMM / fp8proj | "
           "err vs dequant |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in proj_rows:
        nk = f"({r['n']})x{r['k']}" if r.get("pair") else f"{r['n']}x{r['k']}"
        md.append(f"| {r['model']} | {r['projection']} | {nk} | {r['kind']} | {r['m']} | {r['bf16_us']:.1f} | "
                  f"{r['fp8proj_us']:.1f} | {r['speedup_vs_bf16']:.3f}x | "
                  f"{'' if r['deepgemm_us'] is None else format(r['deepgemm_us'], '.1f')} | "
                  f"{'' if r['speedup_vs_deepgemm'] is None else format(r['speedup_vs_deepgemm'], '.3f') + 'x'} | "
                  f"{r['fp8proj_err_vs_dequant']:.2e} |")
    md += ["", "| model | kind | C | bf16 ms | fp8proj ms | fp8proj vs bf16 | DeepGEMM ms | DeepGEMM / fp8proj | CUDA graph |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in model_rows:
        md.append(f"| {r['model']} | {r['kind']} | {r['seqs']} | {r['bf16_ms']:.3f} | {r['fp8proj_ms']:.3f} | "
                  f"{r['fp8proj_speedup_vs_bf16']:.3f}x | {r.get('deepgemm_ms', '') or ''} | "
                  f"{'' if r.get('deepgemm_ms_over_fp8proj') is None else format(r['deepgemm_ms_over_fp8proj'], '.3f') + 'x'} | "
                  f"{'yes' if r['cuda_graph'] else 'no'} |")
    md += ["", "| model | bf16 weights | FP8 weights | FP8 / bf16 | fp8proj adds | FP8Linears taken | DeepGEMM |",
           "|---|---|---|---|---|---|---|"]
    for m in memories:
        md.append(f"| {m['model']} | {m['bf16_weight_bytes'] / 1e9:.3f} GB | {m['fp8_weight_bytes'] / 1e9:.3f} GB | "
                  f"{m['fp8_over_bf16']:.3f} | {m['fp8proj_extra_bytes'] / 1e6:.2f} MB | "
                  f"{m['fp8proj_taken']}/{m['fp8_linears']} | {m['deepgemm']} |")
    singles = [r for r in proj_rows if not r.get("pair")]
    pairs = [r for r in proj_rows if r.get("pair")]
    members = {m for r in pairs for m in _pair_members(r["projection"])}
    # What the attention calls: each projection alone, except the pair's members, counted as their pair.
    called = [r for r in singles if r["projection"].rsplit(".", 1)[-1] not in members] + pairs
    if pairs:
        md += ["", "A single projection's row times that module alone, its own activation quantization included. "
               "The q_a_proj+kv_a_proj_with_mqa rows call both on one input, as the attention does: fp8proj runs "
               "one quantization and one GEMM over both weights laid end to end (patch()'s fused pair; where the "
               "rows have an unfused column, the same two modules with one shared quantization and two GEMMs, "
               "same rounds), bf16 runs two matmuls, DeepGEMM's wrapper casts twice. A fused pair's members are "
               "not timed alone (either one called alone runs the pair's GEMM)."]
    if called:
        md += ["", "Bars (every taken projection >= 1.6x bf16 at M >= 1024 and never below 1.0; DeepGEMM geo-mean "
               ">= 1.05x; outputs within 2e-3 of the dequantized product):", ""]
    alone_members = [r for r in singles if r["projection"].rsplit(".", 1)[-1] in members]
    if alone_members:
        big = [r for r in singles if r["m"] >= 1024]
        lo_big = min((r["speedup_vs_bf16"] for r in big), default=float("nan"))
        lo_all = min(r["speedup_vs_bf16"] for r in singles)
        md.append(f"- every module alone: lowest fp8proj / bf16 at M >= 1024: {lo_big:.3f}x "
                  f"({'met' if lo_big >= 1.6 else 'MISSED'}); lowest anywhere: {lo_all:.3f}x "
                  f"({'met' if lo_all >= 1.0 else 'MISSED'})")
    for r in pairs:
        alone = {m: s["speedup_vs_bf16"] for s in singles for m in _pair_members(r["projection"])
                 if (s["model"], s["kind"], s["m"]) == (r["model"], r["kind"], r["m"])
                 and s["projection"].rsplit(".", 1)[-1] == m}
        md.append(f"- {r['model']} {r['projection']} {r['kind']} M={r['m']}: {r['speedup_vs_bf16']:.3f}x bf16" +
                  (" (alone: " + ", ".join(f"{m} {v:.3f}x" for m, v in alone.items()) + ")" if alone else "") +
                  (f"; fused / unfused {r['fused_over_shared']:.3f}x" if r.get("fused_over_shared") else "") +
                  (f"; DeepGEMM / fp8proj {r['speedup_vs_deepgemm']:.3f}x" if r["speedup_vs_deepgemm"] else ""))
    if called:
        lo_big = min((r["speedup_vs_bf16"] for r in called if r["m"] >= 1024), default=float("nan"))
        lo_all = min(r["speedup_vs_bf16"] for r in called)
        md.append("- as the attention calls them" + (" (q_a_proj and kv_a_proj_with_mqa counted as their pair)"
                                                       if pairs else "") +
                  f": lowest fp8proj / bf16 at M >= 1024: {lo_big:.3f}x ({'met' if lo_big >= 1.6 else 'MISSED'}); "
                  f"lowest anywhere: {lo_all:.3f}x ({'met' if lo_all >= 1.0 else 'MISSED'})")
        under = sorted({r["projection"] for r in called if r["m"] >= 1024 and r["speedup_vs_bf16"] < 1.6})
        if under:
            md.append("- below 1.6x at M >= 1024: " + ", ".join(under))
        dgs = [r["speedup_vs_deepgemm"] for r in called if r["speedup_vs_deepgemm"]]
        if dgs:
            gm = math.exp(sum(math.log(v) for v in dgs) / len(dgs))
            md.append(f"- DeepGEMM time / fp8proj time, geometric mean over {len(dgs)} points as the attention "
                      f"calls them: {gm:.3f}x ({'met' if gm >= 1.05 else 'MISSED'}); lowest {min(dgs):.3f}x")
    if proj_rows:
        bad = [r for r in proj_rows if not r["within_tolerance"]]
        md.append(f"- fp8proj outputs within 2e-3 of the dequantized product: {len(proj_rows) - len(bad)}/{len(proj_rows)}")
    return md


# ---- DeepGEMM's JIT, compiled ahead in parallel -----------------------------------------------------

def problems(cfg, chunks, decode):
    """(N, K) of every distinct FP8 linear of one layer, and every M the benchmark runs."""
    h, heads, ql, kvl = cfg.hidden_size, cfg.num_attention_heads, cfg.q_lora_rank, cfg.kv_lora_rank
    nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    shapes = [(ql, h), (heads * (nope + rope), ql), (kvl + rope, h), (heads * (nope + v), kvl), (h, heads * v),
              (cfg.intermediate_size, h), (h, cfg.intermediate_size)]
    return sorted(set(shapes)), sorted({c * 1024 for c in chunks} | set(decode))


def prewarm_deepgemm(cfg, chunks, decode, shards: int, log=print) -> None:
    """DeepGEMM JIT-compiles a kernel at the first call of each problem: do that for every
    (N, K, M) of the run in `shards` processes at once, before anything is timed."""
    import subprocess
    import sys

    shapes, ms = problems(cfg, chunks, decode)
    spec = json.dumps({"shapes": shapes, "ms": ms})
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "fp8proj.bench_fp8ckpt", "--prewarm", f"{i}/{shards}", spec],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(shards)]
    errs = [p.communicate()[1] for p in procs]
    bad = [e for p, e in zip(procs, errs) if p.returncode != 0]
    log(f"[fp8ckpt] DeepGEMM JIT prewarm of {len(shapes) * len(ms)} problems in {shards} processes: "
        f"{time.time() - t0:.0f} s" + (f"; {len(bad)} failed: {bad[0][-300:]}" if bad else ""))


def _prewarm_shard(which: str, spec: str) -> int:
    deep_gemm, why = deepgemm_status()
    if deep_gemm is None:
        print(why)
        return 0
    i, n_shards = map(int, which.split("/"))
    cast, _ = _per_token_cast(deep_gemm)
    todo = [(n, k, m) for n, k in json.loads(spec)["shapes"] for m in json.loads(spec)["ms"]]
    for idx, (n, k, m) in enumerate(todo):
        if idx % n_shards != i:
            continue
        x = torch.zeros(m, k, dtype=BF16, device="cuda")
        w = torch.zeros(n, k, device="cuda").to(E4M3)
        ws = torch.ones(-(-n // 128), k // 128, device="cuda")
        xq, xs = cast(x)
        deep_gemm.fp8_gemm_nt((xq, xs), (w, ws), torch.empty(m, n, dtype=BF16, device="cuda"))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--prewarm":
        sys.exit(_prewarm_shard(sys.argv[2], sys.argv[3]))
    sys.exit("usage: python -m fp8proj.bench_fp8ckpt --prewarm I/N SPEC_JSON (run by the benchmark itself)")


# ---- q_a_layernorm fused into an FP8-checkpoint q_b_proj (python -m fp8proj.bench --parts fp8ckpt_norm)

def norm_fold(name: str, cfg, ms, reps: int, warmup: int, log=print) -> list:
    """q_a_layernorm + q_b_proj of one layer with `cfg`'s dimensions, the q_b_proj an FP8Linear with
    random e4m3 weights and fp32 block scales (the checkpoints' layout), timed three ways at each M,
    interleaved call by call behind 1 ms of GPU sleep per round, L2 flushed before each call:
      unfused  transformers' RMSNorm module, then fp8proj's Fp8CheckpointLinear (its own 1x128 fp32-scale
               quantization of the norm's bf16 output);
      fused    the same module after fuse_norm(norm): one rmsnorm_quantize pass, then the GEMM;
      bf16     the RMSNorm module, then a bf16 matmul on the dequantized weight (dequantize=True's path).
    Each row also holds both outputs' relative error against the fp32 product of the exact norm and the
    dequantized weight (both carry the activations' FP8 rounding), and the fused one's against the
    unfused one's."""
    from transformers.integrations.finegrained_fp8 import FP8Linear
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    from .fp8_linear import Fp8CheckpointLinear, dequantize_weight
    k = cfg.q_lora_rank
    n = cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
    torch.manual_seed(5)
    lin = FP8Linear(k, n, block_size=(128, 128), scale_fmt="float").to("cuda")
    q, s = quantize_checkpoint_weight(torch.randn(n, k, device="cuda") * 0.02)
    lin.weight.data, lin.weight_scale_inv.data = q, s
    norm = DeepseekV3RMSNorm(k, eps=cfg.rms_norm_eps).to("cuda", BF16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, device="cuda") + 0.5)
    unfused = Fp8CheckpointLinear(lin, name=f"{name}.q_b_proj")
    fused = Fp8CheckpointLinear(lin, name=f"{name}.q_b_proj (norm fused)")
    fused.fuse_norm(norm)
    w16 = dequantize_weight(q, s).to(BF16)
    flush = Flush()
    rows = []
    with torch.no_grad():
        for mod in (unfused, fused):
            mod.prepare(max(ms))
        for m in ms:
            x = torch.randn(m, k, dtype=BF16, device="cuda") * 3
            fns = [lambda: unfused(norm(x)), lambda: fused(x), lambda: torch.nn.functional.linear(norm(x), w16)]
            for f in fns:
                f()
            t = time_rounds(fns, reps, warmup, flush=flush, delay_us=1000.0)
            yf, yu = fused(x), unfused(norm(x))
            xf = x.float()
            exact = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * norm.weight.float()) \
                @ w16.float().t()
            err = _rel(yf, yu)
            row = dict(model=name, projection="q_a_layernorm+q_b_proj", m=m, n=n, k=k,
                       unfused_us=1e3 * t[0], fused_us=1e3 * t[1], bf16_us=1e3 * t[2],
                       fused_over_unfused=t[0] / t[1], fused_over_bf16=t[2] / t[1], unfused_over_bf16=t[2] / t[0],
                       rel_err_fused_vs_unfused=err, rel_err_fused=_rel(yf, exact), rel_err_unfused=_rel(yu, exact))
            rows.append(row)
            log(f"[fp8ckpt_norm] {name} M={m}: unfused {row['unfused_us']:.1f} us, fused {row['fused_us']:.1f} us "
                f"({row['fused_over_unfused']:.3f}x), bf16 {row['bf16_us']:.1f} us (fused {row['fused_over_bf16']:.3f}x, "
                f"unfused {row['unfused_over_bf16']:.3f}x); rel err vs the exact norm's product: fused "
                f"{row['rel_err_fused']:.2e}, unfused {row['rel_err_unfused']:.2e}")
    return rows
