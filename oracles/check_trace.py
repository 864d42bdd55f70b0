#!/usr/bin/env python3
"""Independent check of a trace written by trace.py (and the documentation of its format).

    python oracles/check_trace.py --model DIR --trace DIR [--tol 1e-5] [--images DIR]

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
  6. qwen3_vl: mrope at every step against the M-RoPE rule written here from its description (not
     HF's get_rope_index), from the image record's grid and start; an image prompt's record
     (grid from size and patch, tokens, <|vision_start|> T x <|image_pad|> <|vision_end|> at start)
     and tensors (pixels, vision.embed, vision.block.j, vision.merged, vision.deepstack.k); the
     full-sequence forward and generate get the processor's inputs (pixel_values, image_grid_thw,
     mm_token_type_ids; Qwen3VLProcessor itself needs torchvision for its video half), and h.i is
     compared with what ENTERS layer i there; at every image token h.0 == vision.merged's row and
     h.{i+1} - layer i's raw output == vision.deepstack.i's row (reported: deepstack_min_abs, the
     smallest such addition, > 0); HF's vision tower rerun on the trace's pixels; vision.embed by
     hand (Conv3d as a matmul + the position table resized by F.interpolate, merge-block order);
     k.i by hand with interleaved M-RoPE at the step's mrope, every prompt. With --images DIR: each
     image file's sha256 and its pixels by hand (PIL RGB, bicubic stretch, rescale, normalise,
     patchify in merge-block order, float64).
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


def check_format(meta, t, n_layers, kv_layers, linear_layers=(), linear_shapes=None, layer_extra=None, vl=None):
    for key in ("family", "layers", "hidden", "vocab", "kv_heads", "head_dim", "max_context", "new_tokens",
                "prompts", "margins", "tensors", "torch", "transformers"):
        expect(key in meta, f"trace.json lacks {key}")
    n, H, V = meta["new_tokens"], meta["hidden"], meta["vocab"]
    per_layer = lambda x, i: x[i] if isinstance(x, list) else x  # noqa: E731
    names = set()
    for p, pr in enumerate(meta["prompts"]):
        ids, gen = pr["prompt_tokens"], pr["generated"]
        mrope = None
        if vl is not None:  # qwen3_vl: the image's tensors, and every step's M-RoPE row by the rule
            names.update(check_image_format(pr, p, t, vl))
            mrope = mrope_rule(pr, vl)
        else:
            expect("image" not in pr, f"p{p}: an image prompt in a {meta['family']} trace")
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
            if mrope is not None:
                want["mrope"] = ([3], torch.int64)
            for w, (shape, dt) in want.items():
                x = t.get(pre + w)
                expect(x is not None and list(x.shape) == shape and x.dtype == dt, f"{pre}{w}: bad or missing")
            names.update(pre + w for w in want)
            expect(t[pre + "token"].item() == seq[s] and t[pre + "position"].item() == s, f"{pre}: token/position")
            if mrope is not None and pre + "mrope" in t:
                expect(t[pre + "mrope"].tolist() == mrope[s], f"{pre}: mrope {t[pre + 'mrope'].tolist()} != {mrope[s]} (the M-RoPE rule)")
            if s >= len(ids) - 1:
                j = s - len(ids) + 1
                expect(int(t[pre + "logits"].argmax()) == gen[j], f"{pre}: argmax != generated")
                check_margin(t[pre + "logits"], pr, j, pre)
    extra = set(t) - names
    expect(not extra, f"unexpected tensors, e.g. {sorted(extra)[:3]}")
    check_margin_summary(meta)


def check_image_format(pr, p, t, vl):
    """An image prompt's record and per-prompt tensors (a text prompt has neither). Returns the
    tensor names it expects."""
    im = pr.get("image")
    if im is None:
        extra = [k for k in t if k.startswith(f"p{p}/") and "/s" not in k[len(f"p{p}"):]]
        expect(not extra, f"p{p}: a text prompt with image tensors {extra[:3]}")
        return set()
    ids = pr["prompt_tokens"]
    H, W = im["size"]
    P, m = vl["patch"], vl["merge"]
    gh, gw = H // P, W // P
    count = gh * gw // (m * m)
    expect(im["grid"] == [1, gh, gw] and H % (P * m) == 0 and W % (P * m) == 0,
           f"p{p}: image grid {im['grid']} for size {im['size']} (patch {P}, merge {m})")
    expect(im["tokens"] == count, f"p{p}: image tokens {im['tokens']}, the grid gives {count}")
    s = im["start"]
    expect(ids[:s + count + 1][s - 1:] == [vl["start_id"]] + [vl["image_id"]] * count + [vl["end_id"]]
           and ids.count(vl["image_id"]) == count,
           f"p{p}: prompt_tokens do not hold <|vision_start|>, {count} <|image_pad|> from {s}, <|vision_end|>")
    expect(isinstance(im.get("sha256"), str) and len(im["sha256"]) == 64 and im.get("file"), f"p{p}: image file/sha256")
    want = {"pixels": [gh * gw, vl["patch_dim"]], "vision.embed": [gh * gw, vl["hv"]],
            "vision.merged": [count, vl["out"]]}
    want.update({f"vision.block.{j}": [gh * gw, vl["hv"]] for j in range(vl["depth"])})
    want.update({f"vision.deepstack.{k}": [count, vl["out"]] for k in range(vl["deepstack"])})
    for w, shape in want.items():
        x = t.get(f"p{p}/{w}")
        expect(x is not None and list(x.shape) == shape and x.dtype == torch.float32, f"p{p}/{w}: bad or missing")
    return {f"p{p}/{w}" for w in want}


def mrope_rule(pr, vl):
    """Qwen3-VL's M-RoPE (t, h, w) per step, from the description (not HF's get_rope_index): a text
    token's three are its position p (then p + 1 follows); an image's tokens at s = the position of
    its first token are (s, s + row, s + col) over the merged grid, and the text after it resumes at
    s + max(rows, cols) (= the image's largest + 1); a generated token at step t has t + delta, delta
    = (the prompt's largest position + 1) - the prompt's length."""
    ids, im = pr["prompt_tokens"], pr.get("image")
    rows = cols = 0
    if im is not None:
        rows, cols = im["grid"][1] // vl["merge"], im["grid"][2] // vl["merge"]
    out, pos, i = [], 0, 0
    while i < len(ids):
        if im is not None and i == im["start"]:
            out += [[pos, pos + k // cols, pos + k % cols] for k in range(rows * cols)]
            pos += max(rows, cols)
            i += rows * cols
        else:
            out.append([pos] * 3)
            pos += 1
            i += 1
    delta = max(max(r) for r in out) + 1 - len(ids)
    out += [[s + delta] * 3 for s in range(len(ids), pr["steps"])]
    return out


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


def mrope_by_hand(x, thw, theta, section):
    """Interleaved M-RoPE (Qwen3-VL), float64: frequency j of head_dim/2 turns by t, except j = 1, 4, ...
    (j < 3*section[1]) by h and j = 2, 5, ... (j < 3*section[2]) by w; HF rotate_half convention."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    pos = torch.full((d // 2,), float(thw[0]), dtype=torch.float64)
    for axis in (1, 2):
        pos[axis:3 * section[axis]:3] = float(thw[axis])
    ang = torch.cat([pos * inv, pos * inv])
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1)
    return x * ang.cos() + rot * ang.sin()


def pixels_by_hand(path, height, width, proc):
    """Qwen2-VL's pixels from the description, in float64: PIL RGB, bicubic stretch to the recipe's
    size, x / 255, (x - mean) / std, patches in merge-block order (block row, block col, row in
    block, col in block), each flattened as [C, T, P, P] with the still image repeated over T."""
    import numpy as np
    from PIL import Image
    img = Image.open(path).convert("RGB")
    if img.size != (width, height):
        img = img.resize((width, height), Image.BICUBIC)
    x = np.asarray(img, dtype=np.float64).transpose(2, 0, 1) / 255.0
    x = (x - np.array(proc.image_mean)[:, None, None]) / np.array(proc.image_std)[:, None, None]
    P, m, T = proc.patch_size, proc.merge_size, proc.temporal_patch_size
    C, gh, gw = 3, height // P, width // P
    x = x.reshape(C, gh // m, m, P, gw // m, m, P).transpose(1, 4, 2, 5, 0, 3, 6)  # bh bw mh mw C P P
    x = np.repeat(x[:, :, :, :, :, None], T, axis=5)
    return torch.from_numpy(x.reshape(gh * gw, C * T * P * P).copy())


def vision_embed_by_hand(visual, pv, grid):
    """Block 0's input by hand in float64: the Conv3d patch embed as the matmul it is (kernel =
    stride = one patch) plus the learned position table bilinearly resized (F.interpolate,
    align_corners) to the patch grid, in merge-block order."""
    w = visual.patch_embed.proj.weight.double()
    x = pv.double() @ w.reshape(w.shape[0], -1).T + visual.patch_embed.proj.bias.double()
    side, m = visual.num_grid_per_side, visual.spatial_merge_size
    _, gh, gw = grid
    table = visual.pos_embed.weight.double().T.reshape(1, -1, side, side)
    pos = torch.nn.functional.interpolate(table, size=(gh, gw), mode="bilinear", align_corners=True)[0]
    pos = pos.permute(1, 2, 0).reshape(gh // m, m, gw // m, m, -1).permute(0, 2, 1, 3, 4).reshape(gh * gw, -1)
    return x + pos


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


def check_vision(model, model_dir, t, p, pr, images_dir, e):
    """An image prompt's vision tensors: the pixels (with images_dir: the file's sha256, and its
    pixels by hand), HF's vision tower rerun on the trace's pixels (block 0's input, every block's
    output, the merger's and DeepStack mergers' outputs), and block 0's input by hand."""
    visual, im = model.model.visual, pr["image"]
    pv, grid = t[f"p{p}/pixels"], torch.tensor([im["grid"]])
    if images_dir:
        import hashlib
        path = os.path.join(images_dir, im["file"])
        with open(path, "rb") as f:
            expect(hashlib.sha256(f.read()).hexdigest() == im["sha256"], f"p{p}: {path}: sha256 differs from the trace's")
        proc = transformers.AutoImageProcessor.from_pretrained(model_dir)
        e["pixels_by_hand"].add(pv, pixels_by_hand(path, *im["size"], proc))
    got = {}
    hooks = [visual.blocks[0].register_forward_pre_hook(lambda _m, a: got.__setitem__("vision.embed", a[0]))]
    hooks += [b.register_forward_hook(lambda _m, _a, o, j=j: got.__setitem__(f"vision.block.{j}", o)) for j, b in enumerate(visual.blocks)]
    out = visual(pv, grid_thw=grid, return_dict=True)
    for h in hooks:
        h.remove()
    got["vision.merged"] = out.pooler_output
    got.update({f"vision.deepstack.{k}": f for k, f in enumerate(out.deepstack_features)})
    for name, ref in got.items():
        e["vision_vs_hf"].add(t[f"p{p}/{name}"], ref)
    e["vision_embed_by_hand"].add(t[f"p{p}/vision.embed"], vision_embed_by_hand(visual, pv, im["grid"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--tol", type=float, default=1e-5, help="max relative error allowed")
    ap.add_argument("--images", help="directory holding the traced image files (by their trace.json names): "
                    "their sha256 is checked and their pixels recomputed by hand")
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
    vl = None
    if meta["family"] == "qwen3_vl":
        vc, cfg = model.config.vision_config, model.config
        vl = {"patch": vc.patch_size, "merge": vc.spatial_merge_size, "hv": vc.hidden_size, "out": vc.out_hidden_size,
              "depth": vc.depth, "deepstack": len(vc.deepstack_visual_indexes),
              "patch_dim": vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2,
              "image_id": cfg.image_token_id, "start_id": cfg.vision_start_token_id, "end_id": cfg.vision_end_token_id}
    check_format(meta, t, L, kv_layers, linear_layers, linear_shapes, layer_extra, vl)

    e_h, e_final, e_logits, e_k, e_v = Err(), Err(), Err(), Err(), Err()
    e_conv, e_rec, e_kv = Err(), Err(), Err()
    e_vis = {n: Err() for n in ("pixels_by_hand", "vision_vs_hf", "vision_embed_by_hand", "image_rows_spliced", "deepstack_added")}
    deepstack_seen = []
    gen_ok = []
    # Each layer's input and raw output in the full-sequence forward: for Qwen3-VL, h.{i} is what
    # enters layer i, which at image positions is layer i-1's output plus DeepStack feature i-1.
    layer_in, layer_out = {}, {}
    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(
            lambda _m, a, kw, i=i: layer_in.__setitem__(i, (a[0] if a else kw["hidden_states"]).detach().clone()), with_kwargs=True)
        layer.register_forward_hook(lambda _m, _a, o, i=i: layer_out.__setitem__(i, (o[0] if isinstance(o, tuple) else o).detach().clone()))
    with torch.no_grad():
        for p, pr in enumerate(meta["prompts"]):
            seq = pr["prompt_tokens"] + pr["generated"][:-1]  # the tokens the steps fed
            extra = {}  # an image prompt's inputs, as Qwen3VLProcessor would give them
            if pr.get("image") is not None and f"p{p}/pixels" in t:
                extra = {"pixel_values": t[f"p{p}/pixels"], "image_grid_thw": torch.tensor([pr["image"]["grid"]])}
                check_vision(model, args.model, t, p, pr, args.images, e_vis)
            def with_image(ids):  # noqa: E306
                return {**extra, "mm_token_type_ids": (ids == vl["image_id"]).int()} if extra else {}
            x = torch.tensor([seq])
            layer_in.clear()
            layer_out.clear()
            out = model(input_ids=x, output_hidden_states=True, use_cache=False, **with_image(x))
            hs = out.hidden_states
            for s in range(pr["steps"]):
                pre = f"p{p}/s{s}/"
                for i in range(L):
                    e_h.add(t[f"{pre}h.{i}"], layer_in[i][0, s] if vl else hs[i][0, s])
                e_final.add(t[pre + "final"], hs[L][0, s])
                e_logits.add(t[pre + "logits"], out.logits[0, s])
            if extra:  # DeepStack: h.{i+1} - layer i's raw output = feature i's row, at the image's tokens
                im = pr["image"]
                for k in range(im["tokens"]):
                    s = im["start"] + k
                    e_vis["image_rows_spliced"].add(t[f"p{p}/s{s}/h.0"], t[f"p{p}/vision.merged"][k])
                    for i in range(vl["deepstack"]):
                        added = t[f"p{p}/s{s}/h.{i + 1}"].double() - layer_out[i][0, s].double()
                        e_vis["deepstack_added"].add(added, t[f"p{p}/vision.deepstack.{i}"][k])
                        deepstack_seen.append(added.abs().max().item())
            # EOS off: greedy through N tokens exactly like the trace.
            gc = copy.deepcopy(model.generation_config)
            gc.eos_token_id, gc.do_sample = [], False
            ids = torch.tensor([pr["prompt_tokens"]])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc,
                               max_new_tokens=n, do_sample=False, **with_image(ids))
            hf_gen = g[0, ids.shape[1]:].tolist()
            gen_ok.append(hf_gen == pr["generated"])
            expect(gen_ok[-1], f"p{p}: generate {hf_gen} != trace {pr['generated']}")
        if vl and any(pr.get("image") for pr in meta["prompts"]):
            expect(deepstack_seen and min(deepstack_seen) > 0, "DeepStack: h.{i+1} equals layer i's raw output at an image token")

        if meta["family"] in ("qwen3", "qwen3_vl"):
            theta, eps = tc.rope_parameters["rope_theta"], tc.rms_norm_eps
            kvh, d = meta["kv_heads"], meta["head_dim"]
            section = tc.rope_parameters.get("mrope_section")
            # qwen3: prompt 0; qwen3_vl: every prompt (image prompts' rows turn by M-RoPE's three positions)
            for p in range(len(meta["prompts"]) if vl else 1):
                for s in range(meta["prompts"][p]["steps"]):
                    pre = f"p{p}/s{s}/"
                    for i in range(L):
                        a = layers[i].self_attn
                        x = rms_by_hand(t[f"{pre}h.{i}"].double(), layers[i].input_layernorm.weight, eps)
                        k = rms_by_hand((a.k_proj.weight.double() @ x).view(kvh, d), a.k_norm.weight, eps)
                        k = mrope_by_hand(k, t[pre + "mrope"].tolist(), theta, section) if vl else rope_by_hand(k, s, theta)
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
    if vl and any(pr.get("image") for pr in meta["prompts"]):
        errs.update({k: e for k, e in e_vis.items() if k != "pixels_by_hand" or args.images})
    if meta["family"] == "qwen3_5":
        errs.update(conv_vs_prefill=e_conv, rec_vs_prefill=e_rec, kv_vs_prefill=e_kv)
    for name, e in errs.items():
        expect(e.rel <= args.tol, f"{name}: relative error {e.rel:.3g} > {args.tol}")
    if deepstack_seen:  # the smallest DeepStack addition seen at an image token (0: DeepStack missing)
        report_extra = {"deepstack_min_abs": float(f"{min(deepstack_seen):.3g}")}
    else:
        report_extra = {}
    report = {"family": meta["family"], "errors": {k: e.json() for k, e in errs.items()}, **report_extra,
              "generate_matches": gen_ok, "problems": problems, "ok": not problems}
    print(json.dumps(report, sort_keys=True))
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
