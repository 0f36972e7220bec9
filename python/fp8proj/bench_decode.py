"""The decode step from PyTorch, under CUDA graphs (python -m fp8proj.bench --parts decode).

Per model (GLM-5 and DeepSeek-V3 attention dimensions, `--layers` dense layers, random init, bf16)
and per C in --decode: one token for each of C sequences at context 1024, through transformers'
StaticCache, as bench_fp8ckpt.decode_step runs it (the cache filled by one prefill, rewound before
every step, the step captured by hand as a CUDA graph and replayed). Two variants share the one
model object and the one cache, swapped module by module (as bench.model_bench does):

  bf16      the model as built;
  fp8proj   patch(model, policy="all", targets=ALL_TARGETS): every dense projection of the MLA
            attention, q_a_layernorm fused into q_b_proj, kv_b_proj writing the key layout
            (expand_kv replaced, kv_expand.py); under policy "all" the tuned table's gate runs FP8
            at a decode M only where it measured FP8 faster (explain() says which path each module
            takes at the M it sees).
  fp8proj_unfused  the same with transformers' own expand_kv (timed as a step only): the gain of
            FP8 alone.

The cache is filled once, by the bf16 model; each step writes slot 1024 before it reads it, so both
variants read the same 1024 cached positions and their own newest one.

The M each projection sees: transformers' DeepseekV3 caches the compressed latent and runs kv_b_proj
over the whole static cache in every decode step, so kv_b_proj sees M = C x cache length (C x 1032
here), a prefill-sized GEMM, while the other projections see M = C. The patched modules' workspace
holds max_tokens rows (patch()'s default unless --max-tokens says otherwise); a call with more rows
runs in chunks of that many. Each row records the M of every projection (a forward pre-hook on the
step), how many chunks that makes, and explain() at that M.

The attention's time, under graphs: each variant is captured twice, as it is and with every
decoder layer's self_attn replaced by NoAttention (zeros shaped like its input and no weights, the
(attn_output, attn_weights) pair the decoder layer unpacks; no cache write). The four graphs (and
fp8proj_unfused where patch() replaced expand_kv) are replayed interleaved round by round;
attention = whole step - stubbed step, the median over rounds of the paired differences. The two stubbed graphs run the same work (the patched modules all sit
inside self_attn): the ratio of their medians is the method's noise and is reported. What the
attention's time includes: everything self_attn does (its projections, RoPE, the cache update,
SDPA over the static cache); what it leaves out: the norms, MLP, embedding, mask and lm_head.

Also recorded: whether each graph captured (else eager, and why), the relative Frobenius error of
fp8proj's step logits against bf16's, and explain() of layer 0's patched modules at M = C.
"""
from __future__ import annotations

import statistics

import torch
from torch import nn

from .bench_fp8ckpt import _rel, _rewind, cache_kwargs, capture_graph, time_rounds

BF16 = torch.bfloat16
CONTEXT = 1024
ATTN_BAR = 1.2  # the attention module's decode-step speedup asked for, at C = 16 and 64
VARIANTS = ("bf16", "fp8proj", "bf16_rest", "fp8proj_rest")
# The fp8proj step with transformers' own expand_kv (kv_b_proj's output copied into the key):
# how much of the step's gain is the key layout written by kv_b_proj (kv_expand.py).
UNFUSED = "fp8proj_unfused"


class NoAttention(nn.Module):
    """Stands for a decoder layer's self_attn when timing everything else: returns what the
    attention returns, (attn_output, attn_weights) = (zeros shaped like hidden_states, None), and
    does nothing else (no weights read, no cache written). The zeros are made once per shape and
    reused (the decoder layer only adds them to its residual), so no memset is timed in their place."""

    def __init__(self):
        super().__init__()
        self._zeros = None

    def forward(self, hidden_states=None, *args, **kwargs):
        z = self._zeros
        x = hidden_states
        if z is None or (z.shape, z.dtype, z.device) != (x.shape, x.dtype, x.device):
            z = self._zeros = torch.zeros_like(x)
        return z, None


def structure(out):
    """What a caller can unpack from a module's output: per element of a tuple, (shape, dtype) of a
    tensor, None for None, the type's name otherwise."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return tuple(x.shape), x.dtype
        return None if x is None else type(x).__name__
    return tuple(one(x) for x in out) if isinstance(out, tuple) else one(out)


def check_stub(attn: nn.Module, stub: nn.Module, args, kwargs) -> None:
    """Raises unless stub's output on the attention's recorded input has the attention's structure
    (the decoder layer unpacks it: a different arity or shape would time another program)."""
    real, fake = structure(attn(*args, **kwargs)), structure(stub(*args, **kwargs))
    if real != fake:
        raise RuntimeError(f"fp8proj.bench decode: {type(attn).__name__} returns {real}, NoAttention {fake}; "
                           "the stubbed step would not be this model's step without attention")


class Variants:
    """One model in four states: bf16 / fp8proj, each with its attention or without (NoAttention).
    set(label) installs a state in full, whatever the previous one was."""

    def __init__(self, model, before, after):
        self.layers = list(model.model.layers)
        self.attns = [layer.self_attn for layer in self.layers]
        self.stubs = [NoAttention() for _ in self.layers]
        self.before, self.after = before, after
        # patch()'s expand_kv replacements (instance attributes), installed only in the fp8proj states.
        self.expands = [a.__dict__.get("expand_kv") for a in self.attns]

    def set(self, label: str) -> None:
        if label not in VARIANTS + (UNFUSED,):
            raise ValueError(f"unknown variant {label!r}")
        for a, attr, m in (self.after if label.startswith("fp8proj") else self.before):
            setattr(a, attr, m)
        for a, e in zip(self.attns, self.expands):
            if e is not None and label in ("fp8proj", "fp8proj_rest"):
                a.expand_kv = e
            else:
                a.__dict__.pop("expand_kv", None)
        rest = label.endswith("_rest")
        for layer, attn, stub in zip(self.layers, self.attns, self.stubs):
            layer.self_attn = stub if rest else attn


def summarize_rounds(samples: dict) -> dict:
    """The row's timings (ms) from {variant: [ms per round]} of the four graphs (and UNFUSED's
    step where it ran), rounds aligned:
    step medians, attention = median over rounds of (step - stubbed step) per variant."""
    n = {len(v) for v in samples.values()}
    if not set(VARIANTS) <= set(samples) <= set(VARIANTS) | {UNFUSED} or len(n) != 1 or not n.pop():
        raise ValueError(f"need equally many rounds of each of {VARIANTS} (and optionally {UNFUSED}), got "
                         f"{ {k: len(v) for k, v in samples.items()} }")
    med = {k: statistics.median(v) for k, v in samples.items()}
    attn = {v: statistics.median([f - r for f, r in zip(samples[v], samples[v + "_rest"])])
            for v in ("bf16", "fp8proj")}
    return dict(bf16_ms=round(med["bf16"], 4), fp8proj_ms=round(med["fp8proj"], 4),
                model_speedup=round(med["bf16"] / med["fp8proj"], 4),
                attn_bf16_ms=round(attn["bf16"], 4), attn_fp8proj_ms=round(attn["fp8proj"], 4),
                attn_speedup=round(attn["bf16"] / attn["fp8proj"], 4) if attn["fp8proj"] > 0 else float("nan"),
                attn_share_bf16=round(attn["bf16"] / med["bf16"], 4),
                rest_bf16_ms=round(med["bf16_rest"], 4), rest_fp8proj_ms=round(med["fp8proj_rest"], 4),
                rest_ratio=round(med["bf16_rest"] / med["fp8proj_rest"], 4),
                **({} if UNFUSED not in med else dict(unfused_ms=round(med[UNFUSED], 4),
                                                      unfused_speedup=round(med["bf16"] / med[UNFUSED], 4))))


def rows_of(x: torch.Tensor) -> int:
    """The M of a projection's input: every dimension but the last."""
    return x.numel() // x.shape[-1] if x.dim() else 0


@torch.no_grad()
def bench_model(name, cfg, decode, reps: int, warmup: int, log=print, device="cuda", context: int = CONTEXT,
                max_tokens: int = 0) -> list:
    """The rows of one model (see the module doc): one per C in `decode`. max_tokens: the patched
    modules' workspace rows (0: patch()'s default, what a user gets)."""
    import transformers
    from transformers import StaticCache

    from .integrations.transformers import ALL_TARGETS, DEFAULT_MAX_TOKENS, patch

    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU: seconds instead of minutes
        model = transformers.DeepseekV3ForCausalLM(cfg).to(dtype=BF16).eval()
    attns = [layer.self_attn for layer in model.model.layers]
    before = [(a, attr, getattr(a, attr)) for a in attns for attr in ("q_a_layernorm",) + ALL_TARGETS
              if hasattr(a, attr)]  # ALL_TARGETS names q_proj too, absent with a q LoRA
    rows_ws = max_tokens or DEFAULT_MAX_TOKENS
    report = patch(model, enabled=True, policy="all", targets=ALL_TARGETS, max_tokens=rows_ws)
    log(str(report))
    after = [(a, attr, getattr(a, attr)) for a, attr, _ in before]
    extra = sum(getattr(m, "extra_memory_bytes", lambda: 0)() for _, _, m in after)
    v = Variants(model, before, after)
    rows = []
    for c in decode:
        v.set("bf16")
        cache = StaticCache(config=model.config, max_cache_len=context + 8)
        ids = torch.randint(0, cfg.vocab_size, (c, context), device=device)
        model(input_ids=ids, **cache_kwargs(model, cache, torch.arange(context, device=device)))
        tok = torch.randint(0, cfg.vocab_size, (c, 1), device=device)
        pos = torch.tensor([context], device=device)

        def step(label):
            v.set(label)
            _rewind(cache, context)
            return model(input_ids=tok, **cache_kwargs(model, cache, pos)).logits

        # The stub against the real attention on the step's own input (recorded by a pre-hook).
        # The M of each projection of layer 0, recorded on the same step.
        seen, m_of = {}, {}

        def record(mod, args, kwargs):
            seen.setdefault("in", (args, kwargs))

        hooks = [attns[0].register_forward_pre_hook(record, with_kwargs=True)]
        for a, attr, lin in before:
            if a is attns[0] and attr in ALL_TARGETS and lin is not None:
                def count_rows(mod, args, attr=attr):  # returns None: the input goes on unchanged
                    m_of.setdefault(attr, rows_of(args[0]))
                hooks.append(lin.register_forward_pre_hook(count_rows))
        step("bf16")
        for h in hooks:
            h.remove()
        _rewind(cache, context)
        check_stub(attns[0], v.stubs[0], *seen.pop("in"))

        runs, why = {}, {}
        labels = VARIANTS + ((UNFUSED,) if any(e is not None for e in v.expands) else ())
        for label in labels:
            runs[label], why[label] = capture_graph(lambda label=label: step(label))
        logits = {label: runs[label]().float().clone() for label in ("bf16", "fp8proj")}
        err = _rel(logits["fp8proj"], logits["bf16"])
        del logits
        per = time_rounds([runs[label] for label in labels], reps, warmup, delay_us=500, samples=True)
        t = summarize_rounds(dict(zip(labels, per)))
        graphs = not any(why.values())
        v.set("fp8proj")
        explain = {attr: getattr(attns[0], attr).explain(m_of.get(attr, c)) for attr in ALL_TARGETS
                   if hasattr(getattr(attns[0], attr, None), "explain")}
        if v.expands[0] is not None and "kv_b_proj" in m_of:
            explain["expand_kv"] = v.expands[0].explain(m_of["kv_b_proj"])
        chunks = {attr: -(-m // rows_ws) for attr, m in m_of.items()}
        v.set("bf16")
        row = dict(model=name, seqs=c, context=context + 1, layers=cfg.num_hidden_layers, reps=reps,
                   cuda_graph=graphs, capture_errors={k: e for k, e in why.items() if e}, **t,
                   logits_rel_err=float(f"{err:.3e}"), max_tokens=rows_ws, rows=m_of, chunks=chunks,
                   fp8_extra_bytes=extra,
                   attn_implementation=getattr(model.config, "_attn_implementation", None),
                   explain=explain)
        rows.append(row)
        log(f"[decode] {name} C={c} ({'CUDA graphs' if graphs else 'eager: ' + str(row['capture_errors'])}): "
            f"attention {t['attn_bf16_ms'] * 1e3:.1f} -> {t['attn_fp8proj_ms'] * 1e3:.1f} us "
            f"({t['attn_speedup']:.3f}x), "
            f"step {t['bf16_ms'] * 1e3:.1f} -> {t['fp8proj_ms'] * 1e3:.1f} us ({t['model_speedup']:.3f}x), "
            f"stubbed steps {t['rest_bf16_ms'] * 1e3:.1f} / {t['rest_fp8proj_ms'] * 1e3:.1f} us; " +
            (f"step with transformers' expand_kv {t['unfused_ms'] * 1e3:.1f} us ({t['unfused_speedup']:.3f}x); "
             if "unfused_ms" in t else "") +
            f"logits rel err {err:.2e}")
        for attr, text in explain.items():
            log(f"[decode]   {attr} ({chunks.get(attr, 1)} chunk(s) of <= {rows_ws} rows): {text}")
        del runs, cache
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    v.set("bf16")
    del model, v
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def summarize(rows) -> list:
    """Markdown lines of the decode part: the table, the method, and the bar per point."""
    md = ["## The decode step from PyTorch: StaticCache, CUDA graphs, bf16 vs patch(policy=\"all\", ALL_TARGETS)", "",
          "| model | C | attention bf16 us | fp8proj us | attention speedup | step bf16 us | fp8proj us | "
          "step speedup | step with transformers' expand_kv | attention share (bf16) | stubbed steps bf16 / fp8proj | "
          "logits rel err | CUDA graph |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unfused = f"{r['unfused_ms'] * 1e3:.1f} us ({r['unfused_speedup']:.3f}x)" if "unfused_ms" in r else "-"
        md.append(f"| {r['model']} | {r['seqs']} | {r['attn_bf16_ms'] * 1e3:.1f} | {r['attn_fp8proj_ms'] * 1e3:.1f} | "
                  f"{r['attn_speedup']:.3f}x | {r['bf16_ms'] * 1e3:.1f} | {r['fp8proj_ms'] * 1e3:.1f} | "
                  f"{r['model_speedup']:.3f}x | {unfused} | {r['attn_share_bf16'] * 100:.0f}% | "
                  f"{r['rest_ratio']:.3f} | {r['logits_rel_err']:.2e} | "
                  f"{'yes' if r['cuda_graph'] else 'no: ' + str(r['capture_errors'])} |")
    if not rows:
        return md
    md += ["", f"One token for each of C sequences at context {rows[0]['context'] - 1} (static cache), "
           f"{rows[0]['layers']} dense layers, {rows[0]['reps']} timed rounds, the four graphs (bf16, fp8proj, each "
           "also with every self_attn replaced by zeros) replayed interleaved. Attention = step - stubbed step, "
           "median of the per-round differences; the stubbed steps' ratio (same work in both) is the method's "
           "noise. Where patch() replaced expand_kv (kv_b_proj writes the key layout), a fifth graph, the fp8proj step "
           "with transformers' own expand_kv, is replayed with them: its column is how much of the gain is FP8 alone. "
           "Attention implementation: " + ", ".join(sorted({str(r['attn_implementation']) for r in rows})) + ".",
           "", f"Bar: the attention module >= {ATTN_BAR}x bf16 at every point, the whole step beside it:", ""]
    for r in rows:
        ok = r["attn_speedup"] >= ATTN_BAR
        md.append(f"- {r['model']} C={r['seqs']}: attention {r['attn_speedup']:.3f}x ({'met' if ok else 'MISSED'}), "
                  f"step {r['model_speedup']:.3f}x")
    md += ["", "Paths at the M each projection sees in the step (layer 0's patched modules, explain(); "
           "workspace rows (max_tokens): " + ", ".join(str(x) for x in sorted({r.get('max_tokens') for r in rows}))
           + "; a call with more rows runs in chunks):", ""]
    for r in rows:
        for attr, text in r["explain"].items():
            n = r.get("chunks", {}).get(attr, 1)
            md.append(f"- {r['model']} C={r['seqs']} {attr}: {text}" + (f" ({n} chunks)" if n > 1 else ""))
    return md
