"""Where the transformers decode step's attention time goes, and whether a kv_b_proj that writes the
key layout directly (zero rows in the rope slots, key/value as views, no key_states copy) removes it."""
import json, statistics, sys, types
import torch
from torch import nn
import transformers
from transformers import StaticCache
from fp8proj.bench import model_config
from fp8proj.bench_fp8ckpt import _rewind, capture_graph, time_rounds, _rel
from fp8proj.integrations.transformers import patch, unpatch, ALL_TARGETS
from fp8proj.torch import Fp8ProjLinear

dev = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16


def padded(lin, H, nope, rope, v, fp8):
    K = lin.in_features
    w = lin.weight.detach().view(H, nope + v, K)
    wp = torch.zeros(H, nope + rope + v, K, dtype=w.dtype, device=w.device)
    wp[:, :nope] = w[:, :nope]
    wp[:, nope + rope:] = w[:, nope:]
    l2 = nn.Linear(K, H * (nope + rope + v), bias=False, device=w.device, dtype=w.dtype)
    l2.weight.data.copy_(wp.view(-1, K))
    return Fp8ProjLinear.from_linear(l2, name="kv_b_padded", enabled=True, policy="all") if fp8 else l2


def expand_kv_padded(self, kv_nope, k_rot):
    B, _, L, _ = kv_nope.shape
    nope, rope, v = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
    out = self._kvb_pad(kv_nope).view(B, L, -1, nope + rope + v)
    out[..., nope:nope + rope].copy_(k_rot.view(B, L, 1, rope))
    t = out.transpose(1, 2)
    return t[..., :nope + rope], t[..., nope + rope:]


def kernels(fn, label, top=14):
    from torch.profiler import profile, ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    fn(); torch.cuda.synchronize() if dev == "cuda" else None
    with profile(activities=acts) as prof:
        fn()
        if dev == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:
            t = getattr(e, "self_cuda_time_total", 0)
        if t and t > 0:
            rows.append((t, e.count, e.key[:110]))
    rows.sort(reverse=True)
    tot = sum(r[0] for r in rows)
    print(f"--- {label}: device time {tot:.0f} us in {sum(r[1] for r in rows)} kernels/ops")
    for t, n, k in rows[:top]:
        print(f"  {t:9.1f} us  x{n:<4d} {k}")
    return dict(total_us=tot, top=[dict(us=t, n=n, name=k) for t, n, k in rows[:top]])


@torch.no_grad()
def run(name, cfg, decode, reps, context=1024):
    torch.manual_seed(0)
    with torch.device(dev):
        model = transformers.DeepseekV3ForCausalLM(cfg).to(dtype=BF16).eval()
    attns = [l.self_attn for l in model.model.layers]
    H, nope, rope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    pad_bf16 = [padded(a.kv_b_proj, H, nope, rope, v, False) for a in attns]
    orig = {id(a): {k: getattr(a, k) for k in ("q_a_layernorm",) + ALL_TARGETS if hasattr(a, k)} for a in attns}
    patch(model, enabled=True, policy="all", targets=ALL_TARGETS)
    fp8mods = {id(a): {k: getattr(a, k) for k in orig[id(a)]} for a in attns}
    pad_fp8 = [padded(a.kv_b_proj.weight is not None and orig[id(a)]["kv_b_proj"], H, nope, rope, v, True) for a in attns]

    def setv(label):
        for i, a in enumerate(attns):
            src = fp8mods if label.startswith("fp8") else orig
            for k, m in src[id(a)].items():
                setattr(a, k, m)
            if label.endswith("_pad"):
                a._kvb_pad = pad_fp8[i] if label.startswith("fp8") else pad_bf16[i]
                a.expand_kv = types.MethodType(expand_kv_padded, a)
            else:
                a.__dict__.pop("expand_kv", None)
    labels = ("bf16", "bf16_pad", "fp8", "fp8_pad")
    out = []
    for c in decode:
        setv("bf16")
        cache = StaticCache(config=model.config, max_cache_len=context + 8)
        ids = torch.randint(0, cfg.vocab_size, (c, context), device=dev)
        model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(context, device=dev), use_cache=True)
        tok = torch.randint(0, cfg.vocab_size, (c, 1), device=dev)
        pos = torch.tensor([context], device=dev)

        def step(label):
            setv(label)
            _rewind(cache, context)
            return model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits

        # SDPA's inputs as it sees them
        seen = []
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def spy(q, k, vv, *a, **kw):
            if len(seen) < 8:
                seen.append(dict(q=(tuple(q.shape), q.stride()), k=(tuple(k.shape), k.stride()),
                                 v=(tuple(vv.shape), vv.stride()), mask=None if kw.get("attn_mask") is None else
                                 (tuple(kw["attn_mask"].shape), str(kw["attn_mask"].dtype))))
            return sdpa(q, k, vv, *a, **kw)
        torch.nn.functional.scaled_dot_product_attention = spy
        logits = {}
        for lab in labels:
            logits[lab] = step(lab).float().clone()
        torch.nn.functional.scaled_dot_product_attention = sdpa
        print(f"[{name} C={c}] sdpa inputs (bf16 then bf16_pad, layer 0):", seen[0], seen[2], sep="\n  ")
        errs = {lab: _rel(logits[lab], logits["bf16"]) for lab in labels}
        prof = {lab: kernels(lambda lab=lab: step(lab), f"{name} C={c} {lab} (eager)") for lab in labels}
        runs = {}
        for lab in labels:
            runs[lab], why = capture_graph(lambda lab=lab: step(lab))
            if why:
                print(f"  {lab}: eager ({why})")
        if dev == "cpu":
            print({l: errs[l] for l in labels}); return out
        med = time_rounds([runs[l] for l in labels], reps, 10, delay_us=500)
        t = dict(zip(labels, med))
        print(f"[{name} C={c}] graph step ms: " + ", ".join(f"{l} {t[l]:.3f}" for l in labels) +
              f" | fp8 {t['bf16']/t['fp8']:.3f}x, fp8_pad {t['bf16']/t['fp8_pad']:.3f}x, bf16_pad {t['bf16']/t['bf16_pad']:.3f}x"
              f" | rel err vs bf16: " + ", ".join(f"{l} {errs[l]:.2e}" for l in labels), flush=True)
        out.append(dict(model=name, C=c, step_ms=t, rel_err=errs, sdpa_inputs=seen[:4], profile=prof))
        setv("bf16")
        del runs, cache
        if dev == "cuda":
            torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    res = []
    if dev == "cpu":
        sys.path.insert(0, "python/tests")
        from conftest import tiny_deepseek_v3_config
        res += run("tiny", tiny_deepseek_v3_config(), [2], 2, context=16)
    else:
        for name in sys.argv[2].split(","):
            res += run(name, model_config(name), [16, 64], 60)
    json.dump(res, open(sys.argv[1], "w"), indent=1, default=str)
