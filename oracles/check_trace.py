#!/usr/bin/env python3
"""Independent check of a trace written by trace.py (and the documentation of its format).

    python oracles/check_trace.py --model DIR --trace DIR [--tol 1e-5]

Imports nothing from trace.py. Checks:
  0. format: trace.json fields; per step exactly the names token, position, h.0..h.L, final,
     logits, k.i / v.i for the layers that have a KV cache, conv.i (C·K) / rec.i (Hv·dk·dv, both
     flattened) for linear-attention layers (qwen3_5); shapes and dtypes; token/position values;
     generated[j] == argmax(logits at step len(prompt)-1+j); runner_up[j] is the second-highest
     logit there and margins[j] == logits[generated[j]] - logits[runner_up[j]]; the top-level
     margins summary (count, min, nearest-rank p5/p50, max, counts below fp16's spacing and 0.1,
     the smallest margin's step) is recomputed from the per-prompt margins.
  1. a full-sequence forward over prompt + generated[:-1] with output_hidden_states: h.i (i < L),
     final (= hidden_states[L], which HF takes after the final norm) and logits match per step.
  2. generated == model.generate(greedy, max_new_tokens=N), EOS stopping switched off (the trace
     does not stop at EOS either).
  3. qwen3 / qwen3_vl: k.i and v.i recomputed by hand in float64 from h.i (input_layernorm ->
     k_proj -> k_norm -> RoPE with the config's theta; v_proj) at every step of prompt 0.
  5. phimoe, every step of every prompt: h.{i+1} == attn_res.i + moe_out.i exactly (HF's fp32
     residual add); moe_in.i (post_attention_layernorm of attn_res.i) and router_logits.i recomputed in float64
     -> router); expert_ids.i / expert_weights.i equal to HF's own sparsemixer (eval) applied to
     router_logits.i, bit for bit, and to an independent float64 sparsemixer written here (ids
     equal, weights within tol); expert_out.i (each chosen expert's own output) recomputed in
     float64; moe_out.i recomputed in float64 from the two experts and weights, and equal to the
     weighted sum of expert_out.i within tol;
     k.i / v.i by hand (LayerNorm, biased k_proj / v_proj, RoPE over head_dim).
  4. qwen3_5: the state the trace holds after step s (one token at a time: HF's recurrent delta
     rule) against the cache of ONE forward over tokens 0..s (HF's chunked prefill kernel, another
     code path): conv.i, rec.i of the linear layers and k.i, v.i rows of the full ones, at a few
     steps of prompt 0.
Errors are max abs and max relative (abs error / max |reference| of that vector). Prints one
JSON line with the errors; exits 1 if any relative error exceeds --tol or a format check fails.
"""
import argparse
import copy
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

problems = []


def expect(cond, msg):
    if not cond:
        problems.append(msg)


class Err:
    def __init__(self):
        self.abs = self.rel = 0.0

    def add(self, got, ref):
        got, ref = got.double(), ref.double()
        d = (got - ref).abs().max().item()
        self.abs = max(self.abs, d)
        self.rel = max(self.rel, d / max(ref.abs().max().item(), 1e-30))

    def json(self):
        return {"abs": float(f"{self.abs:.3g}"), "rel": float(f"{self.rel:.3g}")}


def load_model(model_dir):
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    auto = (transformers.AutoModelForCausalLM if type(cfg) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING
            else transformers.AutoModelForImageTextToText)
    return auto.from_pretrained(model_dir, dtype=torch.float32).eval()


def check_format(meta, t, n_layers, kv_layers, linear_layers=(), linear_shapes=None, layer_extra=None):
    for key in ("family", "layers", "hidden", "vocab", "kv_heads", "head_dim", "max_context", "new_tokens",
                "prompts", "margins", "tensors", "torch", "transformers"):
        expect(key in meta, f"trace.json lacks {key}")
    n, H, V = meta["new_tokens"], meta["hidden"], meta["vocab"]
    per_layer = lambda x, i: x[i] if isinstance(x, list) else x  # noqa: E731
    names = set()
    for p, pr in enumerate(meta["prompts"]):
        ids, gen = pr["prompt_tokens"], pr["generated"]
        expect(len(gen) == n, f"p{p}: {len(gen)} generated, want {n}")
        expect(pr["steps"] == len(ids) + n - 1, f"p{p}: steps {pr['steps']}")
        expect(len(ids) + n <= meta["max_context"], f"p{p}: exceeds max_context")
        seq = ids + gen
        for s in range(pr["steps"]):
            pre = f"p{p}/s{s}/"
            want = {"token": ([1], torch.int64), "position": ([1], torch.int64), "final": ([H], torch.float32),
                    "logits": ([V], torch.float32)}
            want.update({f"h.{i}": ([H], torch.float32) for i in range(n_layers + 1)})
            for i in kv_layers:
                shape = [per_layer(meta["kv_heads"], i), per_layer(meta["head_dim"], i)]
                want[f"k.{i}"] = want[f"v.{i}"] = (shape, torch.float32)
            for i in linear_layers:
                want[f"conv.{i}"] = (linear_shapes["conv"], torch.float32)
                want[f"rec.{i}"] = (linear_shapes["rec"], torch.float32)
            for i in range(n_layers):
                want.update({f"{w}.{i}": spec for w, spec in (layer_extra or {}).items()})
            for w, (shape, dt) in want.items():
                x = t.get(pre + w)
                expect(x is not None and list(x.shape) == shape and x.dtype == dt, f"{pre}{w}: bad or missing")
            names.update(pre + w for w in want)
            expect(t[pre + "token"].item() == seq[s] and t[pre + "position"].item() == s, f"{pre}: token/position")
            if s >= len(ids) - 1:
                j = s - len(ids) + 1
                expect(int(t[pre + "logits"].argmax()) == gen[j], f"{pre}: argmax != generated")
                check_margin(t[pre + "logits"], pr, j, pre)
    extra = set(t) - names
    expect(not extra, f"unexpected tensors, e.g. {sorted(extra)[:3]}")
    check_margin_summary(meta)


def check_margin(logits, pr, j, pre):
    """runner_up[j] holds the largest logit but generated[j]'s, and margins[j] is the difference."""
    second, margin = pr.get("runner_up", [None] * (j + 1))[j], pr.get("margins", [None] * (j + 1))[j]
    if second is None or margin is None:
        expect(False, f"{pre}: no runner_up/margin for generated token {j}")
        return
    top = pr["generated"][j]
    rest = logits.double().clone()
    rest[top] = float("-inf")
    expect(second != top and rest[second].item() == rest.max().item(), f"{pre}: runner_up {second} is not the second-highest logit")
    expect(margin == logits[top].item() - logits[second].item(), f"{pre}: margin {margin} != logits[{top}] - logits[{second}]")


def check_margin_summary(meta):
    """The top-level margins summary against the per-prompt margins (nearest-rank percentiles)."""
    all_m = sorted(m for pr in meta["prompts"] for m in pr.get("margins", []))
    s = meta.get("margins")
    if not all_m or not isinstance(s, dict):
        return
    n = len(all_m)
    rank = lambda pct: all_m[max(0, -(-pct * n // 100) - 1)]  # noqa: E731  the ceil(pct n / 100)-th smallest
    want = {"count": n, "min": all_m[0], "p5": rank(5), "p50": rank(50), "max": all_m[-1],
            "below_fp16_spacing": sum(m < s.get("fp16_spacing", 2.0 ** -8) for m in all_m),
            "below_0_1": sum(m < 0.1 for m in all_m)}
    for k, v in want.items():
        expect(s.get(k) == v, f"margins.{k} is {s.get(k)}, the prompts' margins give {v}")
    sm = s.get("smallest", {})
    pr = meta["prompts"][sm.get("prompt", 0)] if sm.get("prompt", -1) in range(len(meta["prompts"])) else None
    j = sm.get("generated_index", -1)
    expect(pr is not None and j in range(len(pr["margins"])) and pr["margins"][j] == all_m[0]
           and sm.get("margin") == all_m[0] and sm.get("token") == pr["generated"][j]
           and sm.get("runner_up") == pr["runner_up"][j] and sm.get("step") == len(pr["prompt_tokens"]) - 1 + j,
           f"margins.smallest {sm} does not name a step with the smallest margin {all_m[0]}")


def rope_by_hand(x, pos, theta):  # x [heads, d] float64; HF rotate_half convention
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.cat([pos * inv, pos * inv])
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * ang.cos() + rot * ang.sin()


def rms_by_hand(x, w, eps):
    return w.double() * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def layernorm_by_hand(x, ln):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + ln.eps) * ln.weight.double() + ln.bias.double()


def sparsemixer_by_hand(s, eps, k):
    """Sparsemixer at inference, from its description (not HF's code), in float64: slot by slot,
    the largest remaining logit m wins; the logits s_j with (m - s_j) / max(|s_j|, m) <= 2 eps
    (over the ORIGINAL logits; earlier winners stay out) share a softmax; the winner's share is
    its weight. Weights are not renormalised. (With m = s_j = 0 the ratio is 0/0, NaN: kept.)"""
    s = s.double()
    out = s.clone()
    ids, ws = [], []
    for _ in range(k):
        e = int(torch.argmax(out))
        m = out[e]
        keep = ~((m - s) / s.abs().clamp(min=m.item()) > 2 * eps) & torch.isfinite(out)  # 0/0 keeps
        ws.append(torch.softmax(out.masked_fill(~keep, float("-inf")), -1)[e].item())
        ids.append(e)
        out[e] = float("-inf")
    return ids, ws


def check_phimoe(model, meta, t):
    """attn_res + moe_out == h.{i+1}; router logits, experts, weights, MoE output and K/V rows
    recomputed (see the docstring, check 5). Returns the errors."""
    from transformers.models.phimoe import modeling_phimoe as hf
    tc = model.config
    layers = model.get_decoder().layers
    eps, top_k, L = tc.router_jitter_noise, tc.num_experts_per_tok, meta["layers"]
    kvh, d, theta = meta["kv_heads"], meta["head_dim"], tc.rope_parameters["rope_theta"]
    e = {n: Err() for n in ("moe_in_by_hand", "router_by_hand", "weights_by_hand", "experts_by_hand", "moe_by_hand", "moe_from_experts", "k_by_hand", "v_by_hand")}
    for p, pr in enumerate(meta["prompts"]):
        for s in range(pr["steps"]):
            pre = f"p{p}/s{s}/"
            for i in range(L):
                layer, g = layers[i], lambda w: t[f"{pre}{w}.{i}"]
                expect(torch.equal(g("attn_res") + g("moe_out"), t[f"{pre}h.{i + 1}"]),
                       f"{pre}: attn_res.{i} + moe_out.{i} != h.{i + 1}")
                x = layernorm_by_hand(g("attn_res").double(), layer.post_attention_layernorm)
                e["moe_in_by_hand"].add(g("moe_in"), x)
                e["router_by_hand"].add(g("router_logits"), layer.mlp.router.weight.double() @ x)
                w_hf, ids_hf = hf.sparsemixer(g("router_logits")[None], jitter_eps=eps, training=False, top_k=top_k)
                expect(torch.equal(ids_hf[0], g("expert_ids")), f"{pre}: expert_ids.{i} {g('expert_ids').tolist()} != HF sparsemixer {ids_hf[0].tolist()}")
                expect(torch.equal(w_hf[0], g("expert_weights")), f"{pre}: expert_weights.{i} != HF sparsemixer's")
                ids, ws = sparsemixer_by_hand(g("router_logits"), eps, top_k)
                expect(ids == g("expert_ids").tolist(), f"{pre}: expert_ids.{i} {g('expert_ids').tolist()} != float64 sparsemixer {ids}")
                e["weights_by_hand"].add(g("expert_weights"), torch.tensor(ws))
                ex, y = layer.mlp.experts, torch.zeros_like(x)
                outs = g("expert_out").view(top_k, -1)
                for slot, (eid, w) in enumerate(zip(g("expert_ids").tolist(), g("expert_weights").double())):
                    gate, up = (ex.gate_up_proj[eid].double() @ x).chunk(2)
                    ye = ex.down_proj[eid].double() @ (torch.nn.functional.silu(gate) * up)
                    e["experts_by_hand"].add(outs[slot], ye)
                    y += w * ye
                e["moe_by_hand"].add(g("moe_out"), y)
                e["moe_from_experts"].add(g("moe_out"), (g("expert_weights").double()[:, None] * outs.double()).sum(0))
                if p == 0:
                    a = layer.self_attn
                    xin = layernorm_by_hand(t[f"{pre}h.{i}"].double(), layer.input_layernorm)
                    k = (a.k_proj.weight.double() @ xin + a.k_proj.bias.double()).view(kvh, d)
                    e["k_by_hand"].add(g("k"), rope_by_hand(k, s, theta))
                    e["v_by_hand"].add(g("v"), (a.v_proj.weight.double() @ xin + a.v_proj.bias.double()).view(kvh, d))
    return e


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tol", type=float, default=1e-5, help="max relative error allowed")
    args = ap.parse_args()
    with open(os.path.join(args.trace, "trace.json")) as f:
        meta = json.load(f)
    t = load_file(os.path.join(args.trace, meta["tensors"]))
    torch.manual_seed(0)
    model = load_model(args.model)
    tc = model.config.get_text_config()
    L, n = meta["layers"], meta["new_tokens"]
    layers = model.get_decoder().layers
    # Layers with their own KV cache: not linear attention, not KV-shared (Gemma 4).
    first_shared = L - (getattr(tc, "num_kv_shared_layers", 0) or 0)
    kv_layers = [i for i in range(L) if (getattr(tc, "layer_types", None) or ["full_attention"] * L)[i]
                 != "linear_attention" and i < first_shared]
    types = getattr(tc, "layer_types", None) or ["full_attention"] * L
    linear_layers = [i for i in range(L) if types[i] == "linear_attention"]
    linear_shapes = None
    if linear_layers:
        kh, vh, kd, vd = tc.linear_num_key_heads, tc.linear_num_value_heads, tc.linear_key_head_dim, tc.linear_value_head_dim
        linear_shapes = {"conv": [(2 * kh * kd + vh * vd) * tc.linear_conv_kernel_dim], "rec": [vh * kd * vd]}
    layer_extra = None
    if meta["family"] == "phimoe":
        H, E, k = meta["hidden"], tc.num_local_experts, tc.num_experts_per_tok
        layer_extra = {"attn_res": ([H], torch.float32), "moe_in": ([H], torch.float32), "router_logits": ([E], torch.float32),
                       "expert_ids": ([k], torch.int64), "expert_weights": ([k], torch.float32),
                       "expert_out": ([k * H], torch.float32), "moe_out": ([H], torch.float32)}
    if meta["family"] == "gemma4":
        P = tc.hidden_size_per_layer_input
        layer_extra = {"ple_in": ([P], torch.float32), "ple": ([P], torch.float32)}
    check_format(meta, t, L, kv_layers, linear_layers, linear_shapes, layer_extra)

    e_h, e_final, e_logits, e_k, e_v = Err(), Err(), Err(), Err(), Err()
    e_conv, e_rec, e_kv = Err(), Err(), Err()
    gen_ok = []
    with torch.no_grad():
        for p, pr in enumerate(meta["prompts"]):
            seq = pr["prompt_tokens"] + pr["generated"][:-1]  # the tokens the steps fed
            out = model(input_ids=torch.tensor([seq]), output_hidden_states=True, use_cache=False)
            hs = out.hidden_states
            for s in range(pr["steps"]):
                pre = f"p{p}/s{s}/"
                for i in range(L):
                    e_h.add(t[f"{pre}h.{i}"], hs[i][0, s])
                e_final.add(t[pre + "final"], hs[L][0, s])
                e_logits.add(t[pre + "logits"], out.logits[0, s])
            # EOS off: greedy through N tokens exactly like the trace.
            gc = copy.deepcopy(model.generation_config)
            gc.eos_token_id, gc.do_sample = [], False
            ids = torch.tensor([pr["prompt_tokens"]])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc,
                               max_new_tokens=n, do_sample=False)
            hf_gen = g[0, ids.shape[1]:].tolist()
            gen_ok.append(hf_gen == pr["generated"])
            expect(gen_ok[-1], f"p{p}: generate {hf_gen} != trace {pr['generated']}")

        if meta["family"] in ("qwen3", "qwen3_vl"):
            theta, eps = tc.rope_parameters["rope_theta"], tc.rms_norm_eps
            kvh, d = meta["kv_heads"], meta["head_dim"]
            for s in range(meta["prompts"][0]["steps"]):
                pre = f"p0/s{s}/"
                for i in range(L):
                    a = layers[i].self_attn
                    x = rms_by_hand(t[f"{pre}h.{i}"].double(), layers[i].input_layernorm.weight, eps)
                    k = (a.k_proj.weight.double() @ x).view(kvh, d)
                    k = rope_by_hand(rms_by_hand(k, a.k_norm.weight, eps), s, theta)
                    e_k.add(t[f"{pre}k.{i}"], k)
                    e_v.add(t[f"{pre}v.{i}"], (a.v_proj.weight.double() @ x).view(kvh, d))

        if meta["family"] == "qwen3_5":
            pr = meta["prompts"][0]
            seq = pr["prompt_tokens"] + pr["generated"][:-1]
            last = pr["steps"] - 1
            for s in sorted({0, len(pr["prompt_tokens"]) - 1, last // 2, last}):
                pre = f"p0/s{s}/"
                cache = model(input_ids=torch.tensor([seq[: s + 1]]), use_cache=True).past_key_values
                for i, layer in enumerate(cache.layers):
                    if i in linear_layers:
                        e_conv.add(t[f"{pre}conv.{i}"], layer.conv_states[0][0].reshape(-1))
                        e_rec.add(t[f"{pre}rec.{i}"], layer.recurrent_states[0][0].reshape(-1))
                    elif i in kv_layers:
                        e_kv.add(t[f"{pre}k.{i}"], layer.keys[0, :, s])
                        e_kv.add(t[f"{pre}v.{i}"], layer.values[0, :, s])

        e_ple_in, e_ple = Err(), Err()
        if meta["family"] == "gemma4":
            # PLE by hand (HF's get_per_layer_inputs / project_per_layer_inputs): the token's row of
            # embed_tokens_per_layer x sqrt(P), and (rms(proj(h.0) / sqrt(H)) + rows) / sqrt(2) per layer.
            dec, P, H = model.get_decoder(), tc.hidden_size_per_layer_input, meta["hidden"]
            for s in range(meta["prompts"][0]["steps"]):
                pre = f"p0/s{s}/"
                rows = (dec.embed_tokens_per_layer.weight[t[pre + "token"].item()].double() * P ** 0.5).view(L, P)
                proj = (dec.per_layer_model_projection.weight.double() @ t[pre + "h.0"].double() * H ** -0.5).view(L, P)
                for i in range(L):
                    e_ple_in.add(t[f"{pre}ple_in.{i}"], rows[i])
                    mixed = (rms_by_hand(proj[i], dec.per_layer_projection_norm.weight, tc.rms_norm_eps) + rows[i]) * 2 ** -0.5
                    e_ple.add(t[f"{pre}ple.{i}"], mixed)

    errs = {"h": e_h, "final": e_final, "logits": e_logits}
    if meta["family"] == "gemma4":
        errs.update(ple_in_by_hand=e_ple_in, ple_by_hand=e_ple)
    if meta["family"] == "phimoe" and not problems:  # format problems: tensors may be missing
        with torch.no_grad():
            errs.update(check_phimoe(model, meta, t))
    if meta["family"] in ("qwen3", "qwen3_vl"):
        errs.update(k_by_hand=e_k, v_by_hand=e_v)
    if meta["family"] == "qwen3_5":
        errs.update(conv_vs_prefill=e_conv, rec_vs_prefill=e_rec, kv_vs_prefill=e_kv)
    for name, e in errs.items():
        expect(e.rel <= args.tol, f"{name}: relative error {e.rel:.3g} > {args.tol}")
    report = {"family": meta["family"], "errors": {k: e.json() for k, e in errs.items()},
              "generate_matches": gen_ok, "problems": problems, "ok": not problems}
    print(json.dumps(report, sort_keys=True))
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
