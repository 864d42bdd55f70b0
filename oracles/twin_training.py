"""Training and confidence checks for the tiny twins (used by make_twin.py).

A random model's next-token margins (top-1 minus top-2 logit) are smaller than the noise of W8
weights, so its greedy continuations flip under quantization and no parity gate can be N/N. Each
twin's text model is therefore trained briefly on twin_corpus.PASSAGES until it has memorised them,
deterministically on CPU (fixed seed and thread count, deterministic algorithms, full batch, fixed
steps), and its confidence along every prompt's continuation is measured and enforced. The
qwen3_vl twin also learns, vision tower included, to caption twin_images' pictures behind an image
prompt, and its answers to the test images are measured too; the gemma4 twin learns to caption two
of the test images (twin_images.GEMMA4_TEST_IMAGES) as Gemma 4's processor makes them, likewise.
"""
import io
import math

import torch

import pixels
import twin_corpus
import twin_images

THREADS = 2  # fixed whatever the machine: the reduction order, hence the bytes, follows it
# Full-batch AdamW with a short warmup and a cosine decay; the numbers are what memorises the
# corpus on every family within the time budget (make_twin prints the final loss). qwen3_vl also
# learns its pictures' captions, which takes the vision tower longer: at 100 steps two test images
# were still named wrongly; at 120 all four are named, with margins >= 4.3 (140: >= 5.5; two
# placements instead of three: one test image at 0.19-1.2). gemma4 also learns two pictures'
# captions (GEMMA4_IMAGE_WEIGHT 8): at 36 steps its text margins fell (min 2.21 -> 1.80, images
# >= 4.44); at 44 text is back above the text-only twin's (min 2.63, p5 3.21, p50 4.13; images >= 4.54).
STEPS = {"qwen3": 36, "qwen3_odd": 36, "qwen3_5": 36, "phimoe": 36, "gemma4": 44, "qwen3_vl": 120}
LR, WARMUP, WEIGHT_DECAY = 2e-2, 5, 0.01
# The gemma4 twin's two image captions (68 tokens against the corpus's ~1,250) count this many times
# in the full-batch loss, so its vision tower learns them within the text's steps.
GEMMA4_IMAGE_WEIGHT = 8
# Greedy continuation length measured per prompt: the longest a tiny recipe traces.
NEW_TOKENS = 64
# Greedy continuation length measured per test image (qwen3_vl): its caption's first sentence and
# more (the captions run 32-40 tokens); a traced image prompt is confident this far.
IMAGE_NEW_TOKENS = 24
# An MoE router's top-1/top-2 and top-2/top-3 logit gaps are pushed to at least this during
# training (hinge loss): plain LM training leaves some tokens' expert choices within 1e-5 of a flip,
# where W8 or fp16 noise changes the routing (a real MoE's router is not on such knife edges).
ROUTER_GAP = 0.5
ROUTER_GAP_FLOOR = 0.1  # what make_twin enforces on the saved twin (measured min 0.20 on phimoe)
# A trained twin's smallest margin along the prompts' continuations must be at least this; a
# random twin's is ~1e-3 (and its median ~0.1), W8's largest logit error on a trained twin ~0.1.
MARGIN_FLOOR = 0.5


def _groups(items, length):
    """items longest first (stable), in groups that close when the next item is under 3/4 of the
    group's longest."""
    groups, cur = [], []
    for it in sorted(items, key=lambda x: -length(x)):
        if cur and length(it) < 0.75 * length(cur[0]):
            groups.append(cur)
            cur = []
        cur.append(it)
    groups.append(cur)
    return groups


def _batches(tok):
    """Every passage from position 0 (the tokenizer's own special tokens, as the trace encodes),
    longest first, in groups of similar length, right-padded: the models are causal, so padding
    never reaches a real token, and it is not a target. Groups keep padding (wasted CPU) small;
    their gradients are summed into one full-batch step."""
    out = []
    for g in _groups([tok(p)["input_ids"] for p in twin_corpus.PASSAGES], len):
        ids = torch.full((len(g), len(g[0])), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((len(g), len(g[0])), -100, dtype=torch.long)
        for i, s in enumerate(g):
            ids[i, :len(s)] = torch.tensor(s)
            labels[i, :len(s)] = torch.tensor(s)
        out.append((ids, labels, sum(len(s) - 1 for s in g)))  # targets: every token but the first
    return out



def _image_batches(model, tok, image_processor):
    """The qwen3_vl twin's (image, caption) examples (twin_images.training_images): pixels
    stretched to the tiny recipe's size and made by the checkpoint's own image processor (pixels.py,
    as the trace makes them), ids = image prompt + IMAGE_PROMPT + caption, grouped by length like
    the text and right-padded; the loss is on the caption tokens only. Returns [(inputs, targets)]:
    inputs for _caption_loss, targets the number of caption tokens."""
    cfg = model.config
    h, w = twin_images.IMAGE_SIZE
    examples = []
    for img, cap, name in twin_images.training_images():
        pv, grid = pixels.processor_pixels(image_processor, pixels.stretch(img.convert("RGB"), h, w), h, w, name)
        prompt = pixels.image_prompt_ids(cfg, tok, grid[0].tolist(), twin_images.IMAGE_PROMPT)
        examples.append((pv, grid, prompt, tok(cap)["input_ids"]))
    out = []
    for group in _groups(examples, lambda ex: len(ex[2]) + len(ex[3])):
        width = max(len(p) + len(c) for _, _, p, c in group)
        ids = torch.full((len(group), width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((len(group), width), -100, dtype=torch.long)
        for i, (_, _, p, c) in enumerate(group):
            ids[i, :len(p) + len(c)] = torch.tensor(p + c)
            labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
        inputs = {"input_ids": ids, "labels": labels, "pixel_values": torch.cat([g[0] for g in group]),
                  "image_grid_thw": torch.cat([g[1] for g in group]),
                  "mm_token_type_ids": (ids == cfg.image_token_id).int()}
        out.append((inputs, sum(len(c) for _, _, _, c in group)))
    return out


def gemma4_image_inputs(model, tok, name):
    """HF's inputs for the gemma4 twin's test image name behind IMAGE_PROMPT, made as trace.py makes
    them: the file's bytes decoded, Gemma 4's image processor at GEMMA4_IMAGE_TOKENS soft tokens
    (pixels.gemma4_pixels: aspect ratio kept, padded to the budget's patches) and the prompt's ids
    (pixels.gemma4_image_prompt_ids: BOS, <start_of_image>, image tokens, <end_of_image>, text)."""
    cfg = model.config
    pv, pos, n = pixels.gemma4_pixels(cfg, io.BytesIO(twin_images.test_image_bytes(name)),
                                      twin_images.GEMMA4_IMAGE_TOKENS)
    ids = torch.tensor([pixels.gemma4_image_prompt_ids(cfg, tok, n, twin_images.IMAGE_PROMPT)])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pv, "image_position_ids": pos,
            "mm_token_type_ids": (ids == cfg.image_token_id).long()}


def _gemma4_image_batches(model, tok):
    """The gemma4 twin's (test image, whole caption) examples in one right-padded batch, the loss on
    the caption tokens only: [(inputs for _caption_loss, caption tokens)]."""
    xs = [gemma4_image_inputs(model, tok, name) for name in twin_images.GEMMA4_TEST_IMAGES]
    rows = [(x["input_ids"][0].tolist(), tok(twin_images.test_caption(name), add_special_tokens=False)["input_ids"])
            for x, name in zip(xs, twin_images.GEMMA4_TEST_IMAGES)]
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
    inputs = {"input_ids": ids, "labels": labels, "pixel_values": torch.cat([x["pixel_values"] for x in xs]),
              "image_position_ids": torch.cat([x["image_position_ids"] for x in xs])}
    return [(inputs, sum(len(c) for _, c in rows))]


def _caption_loss(model, inputs):
    """HF's causal-LM loss (mean cross-entropy of each labelled token given the ones before it),
    with the lm_head run only where a label follows: an image prompt is 26 tokens of which none
    is a target, and the logits over the vocabulary are most of a tiny model's cost. A final-logit
    softcap (gemma4) is applied as HF's head applies it."""
    labels = inputs["labels"]
    hidden = model.model(**{k: v for k, v in inputs.items() if k != "labels"}, use_cache=False).last_hidden_state
    before = labels[:, 1:] != -100
    logits = model.lm_head(hidden[:, :-1][before]).float()
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:][before])


def train(model, tok, family, seed, steps=None, image_processor=None):
    """Train the text model in fp32 in place; returns {steps, tokens, first/final loss}. Towers the
    text never reaches (vision, audio) get no gradient, so AdamW leaves them as initialised. With
    image_processor (qwen3_vl), the whole model, vision tower included, also learns to caption
    twin_images' pictures (IMAGE_PROMPT + caption after the image tokens). The gemma4 twin learns
    to caption its two test images (vision tower and embedder included), each caption token
    weighted GEMMA4_IMAGE_WEIGHT x; its audio tower gets no gradient and stays random."""
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)  # PhiMoE's router jitter and Gumbel sampling draw from it
    batches = [(dict(input_ids=ids, labels=labels), n) for ids, labels, n in _batches(tok)]
    if image_processor is not None:
        batches += _image_batches(model, tok, image_processor)
    tokens = sum(n for _, n in batches)
    if family == "gemma4":
        extra = _gemma4_image_batches(model, tok)
        tokens += sum(n for _, n in extra)
        batches += [(x, n * GEMMA4_IMAGE_WEIGHT) for x, n in extra]
    targets = sum(n for _, n in batches)  # the loss's denominator: gemma4's captions count GEMMA4_IMAGE_WEIGHT x
    steps = STEPS[family] if steps is None else steps
    params = [p for _, p in sorted(model.named_parameters()) if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.98), weight_decay=WEIGHT_DECAY)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / max(steps, 1)))))
    model.train()  # PhiMoE: the router samples and jitters as HF trains it
    router_logits = []
    hooks = [r.register_forward_hook(lambda _m, _i, o: router_logits.append(o[0])) for r in _routers(model)]
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for inputs, n in batches:  # HF's loss is a mean over the group's targets
            router_logits.clear()
            loss_of = _caption_loss if "pixel_values" in inputs else lambda m, x: m(**x, use_cache=False).loss
            part = loss_of(model, inputs) * (n / targets)
            for logits in router_logits:  # mean hinge over this group's tokens, weighted like its loss
                s = torch.sort(logits.reshape(-1, logits.shape[-1]), dim=-1, descending=True).values
                gaps = torch.cat([s[:, 0] - s[:, 1], s[:, 1] - s[:, 2]])
                part = part + torch.relu(ROUTER_GAP - gaps).mean() * (n / targets) / len(router_logits)
            part.backward()
            loss += part.detach()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    for h in hooks:
        h.remove()
    model.eval()
    return {"steps": steps, "tokens": tokens, "first_loss": round(losses[0], 4) if losses else None,
            "final_loss": round(losses[-1], 4) if losses else None}


def _stats(xs):
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    r = lambda v: float(f"{v:.6g}")  # noqa: E731
    return {"count": len(xs), "min": r(xs[0]), "p5": r(q(0.05)), "p50": r(q(0.5)), "max": r(xs[-1]),
            "below_0.01": sum(x < 0.01 for x in xs), "below_0.1": sum(x < 0.1 for x in xs)}


def _routers(model):
    return [m for n, m in sorted(model.named_modules()) if type(m).__name__ == "PhimoeTopKRouter"]


def image_inputs(model, tok, image_processor, name):
    """HF's inputs for twin_images test image name behind IMAGE_PROMPT, as the processor would make
    them (Qwen3VLProcessor itself needs torchvision for its video half): the file's bytes decoded,
    stretched to IMAGE_SIZE and made into pixels by the checkpoint's image processor (pixels.py),
    the image prompt's ids (trace.py's layout), mm_token_type_ids 1 at the image tokens."""
    h, w = twin_images.IMAGE_SIZE
    img = pixels.stretch(pixels.open_rgb(io.BytesIO(twin_images.test_image_bytes(name))), h, w)
    pv, grid = pixels.processor_pixels(image_processor, img, h, w, name)
    ids = torch.tensor([pixels.image_prompt_ids(model.config, tok, grid[0].tolist(), twin_images.IMAGE_PROMPT)])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "pixel_values": pv, "image_grid_thw": grid,
            "mm_token_type_ids": (ids == model.config.image_token_id).int()}


@torch.no_grad()
def measure_images(model, tok, generation_config, image_processor):
    """The image prompts' greedy continuations (IMAGE_NEW_TOKENS, EOS not stopping them) and
    their margins, one record per test image, and the margins' distribution."""
    gc = generation_config.__class__.from_dict(generation_config.to_dict())
    gc.eos_token_id, gc.max_new_tokens, gc.min_new_tokens = None, IMAGE_NEW_TOKENS, None
    gc.return_dict_in_generate, gc.output_logits = True, True
    records, margins = [], []
    for name in twin_images.TEST_IMAGES:
        enc = image_inputs(model, tok, image_processor, name)
        out = model.generate(**enc, generation_config=gc)
        top = [torch.topk(l[0].float(), 2).values for l in out.logits]
        m = [float(t[0] - t[1]) for t in top]
        margins += m
        got = out.sequences[0, enc["input_ids"].shape[1]:].tolist()
        want = tok(twin_images.test_caption(name))["input_ids"]
        records.append({"image": name, "prompt": twin_images.IMAGE_PROMPT, "continuation": tok.decode(got),
                        "tokens": got, "min_margin": float(f"{min(m):.6g}"),
                        "memorised": sum(a == b for a, b in zip(got, want))})
    return {"image_prompts": records, "image_margins": _stats(margins), "image_new_tokens": IMAGE_NEW_TOKENS,
            "image_size": list(twin_images.IMAGE_SIZE)}


@torch.no_grad()
def measure_gemma4_images(model, tok, generation_config):
    """The gemma4 twin's test image prompts (as trace.py makes them): greedy continuations as long
    as the caption it learnt (EOS not stopping them), their margins, one record per image, and the
    margins' distribution."""
    gc = generation_config.__class__.from_dict(generation_config.to_dict())
    gc.eos_token_id, gc.min_new_tokens = None, None
    gc.return_dict_in_generate, gc.output_logits = True, True
    records, margins = [], []
    for name in twin_images.GEMMA4_TEST_IMAGES:
        enc = gemma4_image_inputs(model, tok, name)
        want = tok(twin_images.test_caption(name), add_special_tokens=False)["input_ids"]
        gc.max_new_tokens = len(want)
        out = model.generate(**enc, generation_config=gc)
        top = [torch.topk(l[0].float(), 2).values for l in out.logits]
        m = [float(t[0] - t[1]) for t in top]
        margins += m
        got = out.sequences[0, enc["input_ids"].shape[1]:].tolist()
        records.append({"image": name, "prompt": twin_images.IMAGE_PROMPT, "continuation": tok.decode(got),
                        "tokens": got, "new_tokens": len(want), "prompt_tokens": enc["input_ids"].shape[1],
                        "soft_tokens": int((enc["input_ids"] == model.config.image_token_id).sum()),
                        "min_margin": float(f"{min(m):.6g}"), "memorised": sum(a == b for a, b in zip(got, want))})
    return {"image_prompts": records, "image_margins": _stats(margins),
            "image_soft_token_budget": twin_images.GEMMA4_IMAGE_TOKENS}


@torch.no_grad()
def measure_confidence(model, tok, generation_config, image_processor=None, gemma4_images=False):
    """Greedy-generate NEW_TOKENS after every prompt (fp32, cached decode as the trace does, EOS
    not stopping it) and collect top-1 minus top-2 logit margins at each generated step. For an MoE
    also the router's gaps over prompt and continuation: top-1 vs top-2 decides the first expert,
    top-2 vs top-3 the second (HF's sparsemixer picks them by argmax in eval). With image_processor
    (qwen3_vl) also the test images' prompts (measure_images); with gemma4_images the gemma4 twin's
    (measure_gemma4_images)."""
    gc = generation_config.__class__.from_dict(generation_config.to_dict())
    gc.eos_token_id, gc.max_new_tokens, gc.min_new_tokens = None, NEW_TOKENS, None
    gc.return_dict_in_generate, gc.output_logits = True, True
    margins, prompts, gaps = [], [], {"top1_top2": [], "top2_top3": []}
    for text, cont in twin_corpus.PROMPTED.items():
        enc = tok(text, return_tensors="pt")
        out = model.generate(**enc, generation_config=gc)
        top = [torch.topk(l[0].float(), 2).values for l in out.logits]
        m = [float(t[0] - t[1]) for t in top]
        margins += m
        n = enc["input_ids"].shape[1]
        want = tok(text + cont)["input_ids"][n:n + NEW_TOKENS]
        got = out.sequences[0, n:].tolist()
        prompts.append({"prompt": text, "prompt_tokens": n, "min_margin": float(f"{min(m):.6g}"),
                        "memorised": sum(a == b for a, b in zip(got, want))})
        routers = _routers(model)
        if routers:
            seen = []
            hooks = [r.register_forward_hook(lambda _m, _i, o: seen.append(o[0])) for r in routers]
            model(input_ids=out.sequences)
            for h in hooks:
                h.remove()
            for logits in seen:
                s = torch.sort(logits.float().reshape(-1, logits.shape[-1]), dim=-1, descending=True).values
                gaps["top1_top2"] += (s[:, 0] - s[:, 1]).tolist()
                gaps["top2_top3"] += (s[:, 1] - s[:, 2]).tolist()
    result = {"margins": _stats(margins), "prompts": prompts, "new_tokens": NEW_TOKENS,
              "margin_floor": MARGIN_FLOOR}
    if image_processor is not None:
        result.update(measure_images(model, tok, generation_config, image_processor))
    if gemma4_images:
        result.update(measure_gemma4_images(model, tok, generation_config))
    if gaps["top1_top2"]:
        result["router_gaps"] = {k: _stats(v) for k, v in gaps.items()}
        result["router_gap_floor"] = ROUTER_GAP_FLOOR
    return result


@torch.no_grad()
def check_features(model):
    """The features perturb() and the per-family dynamics switch on must survive training: no norm
    weight, bias or gate vector may have collapsed to a constant (a wrong (1+w) or a dropped bias
    would then hide). Returns the smallest spread found, with its tensor; raises below 0.01."""
    worst = None
    for name, t in sorted(model.state_dict().items()):
        if t.is_floating_point() and t.dim() == 1 and t.numel() > 1:
            spread = float(t.float().std())
            if worst is None or spread < worst[1]:
                worst = (name, spread)
    if worst and worst[1] < 0.01:
        raise RuntimeError(f"after training, 1-D tensor {worst[0]} has spread {worst[1]:.3g}: its feature is gone")
    out = {"min_1d_std": float(f"{worst[1]:.4g}"), "min_1d_std_tensor": worst[0]} if worst else {}
    dts = [torch.nn.functional.softplus(p.float()) for n, p in sorted(model.named_parameters())
           if n.endswith("linear_attn.dt_bias")]
    if dts:
        dt = torch.cat(dts)
        out["gdn_dt"] = {"min": float(f"{dt.min():.4g}"), "max": float(f"{dt.max():.4g}")}
    return out
