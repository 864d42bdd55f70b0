"""Per-family captures of oracles/trace.py: what each model family puts into the trace beyond the
residual stream (K/V rows, recurrent states, MoE router and expert values), and in which order a
layer computes them (for the NaN/Inf report). A family's trace specifics live here; the tracer
(streamed weights, the teacher-forced loop, the file format) is in trace.py."""
import collections

import torch
from transformers import cache_utils


class Unsupported(Exception):
    pass


# A family entry: capture(ctx) runs after every step and puts that family's cache/state tensors;
# hooks(ctx) (optional) runs once after loading to register extra forward hooks that put into
# ctx.step. ctx has .model, .layers (decoder layers), .cache (after the step), .put(name, tensor).

def put_kv_rows(ctx):
    """The newest K/V row of every attention cache layer. Linear-attention layers (no KV cache)
    and KV-shared layers (DummyLayer: they read another layer's cache) put nothing."""
    for i, layer in enumerate(ctx.cache.layers):
        kind = type(layer)
        if kind in (cache_utils.DynamicLayer, cache_utils.DynamicSlidingWindowLayer):
            # [1, kv, T, d]; a sliding layer keeps only its window, but the last row is still new.
            ctx.put(f"k.{i}", layer.keys[0, :, -1, :])
            ctx.put(f"v.{i}", layer.values[0, :, -1, :])
        elif kind in (cache_utils.LinearAttentionLayer, cache_utils.DummyLayer):
            continue
        else:
            raise Unsupported(f"cache layer {i} is {kind.__name__}")


def capture_attention(ctx):  # qwen3, qwen3_vl: every layer is plain KV attention
    put_kv_rows(ctx)


def capture_qwen3_5(ctx):
    """Full-attention layers: their new K/V rows. Linear-attention (GatedDeltaNet) layers: the whole
    state after the step, in the layout the exported graphs take it (batch axis dropped, flattened
    row-major by put()): conv.{i} = LinearAttentionLayer.conv_states[0] [1, C, K] (the FIFO of the
    last K in_proj_qkv outputs, oldest first, the newest in column K-1) and rec.{i} =
    .recurrent_states[0] [1, Hv, dk, dv] (delta-rule state S, fp32)."""
    put_kv_rows(ctx)
    for i, layer in enumerate(ctx.cache.layers):
        if type(layer) is not cache_utils.LinearAttentionLayer:
            continue
        conv, rec = layer.conv_states[0], layer.recurrent_states[0]
        if conv is None or rec is None or conv.dim() != 3 or rec.dim() != 4:
            raise Unsupported(f"linear-attention layer {i}: state not initialised after the step")
        ctx.put(f"conv.{i}", conv[0].float())
        ctx.put(f"rec.{i}", rec[0].float())


def hooks_phimoe(ctx):
    """Per layer and step, from HF's own modules at inference (nothing re-derived here): the attention
    block's residual output (the input of post_attention_layernorm), the router's logits (fp32: the
    model runs in fp32), the two experts and their weights as HF's sparsemixer picked them (the
    router module returns logits, weights, experts) and the MoE block's output."""
    def put_router(i):
        def hook(_mod, _args, out):
            if not (isinstance(out, tuple) and len(out) == 3 and out[2].dtype == torch.int64):
                raise Unsupported(f"layer {i}'s router returned {type(out).__name__}, not (logits, weights, experts)")
            ctx.put(f"router_logits.{i}", out[0])
            ctx.put(f"expert_ids.{i}", out[2])
            ctx.put(f"expert_weights.{i}", out[1])
        return hook

    def put_expert_out(i):
        # Each chosen expert's own output, unweighted, by slot: HF's experts module run again with
        # weight 1 on that slot and 0 on the other (1·y + 0·y' is y exactly). The batched prefill's
        # experts graph runs one expert over many tokens; its gate compares against these.
        def hook(mod, args, _out):
            hidden, index, weights = args[:3]
            if hidden.shape[0] != 1 or tuple(index.shape) != (1, 2):
                raise Unsupported(f"layer {i}'s experts got hidden {tuple(hidden.shape)} / index {tuple(index.shape)}, not one token's top-2")
            outs = []
            for slot in range(2):
                one = torch.zeros_like(weights)
                one[:, slot] = 1
                outs.append(mod.forward(hidden, index, one)[0])  # forward(): no hooks run again
            ctx.put(f"expert_out.{i}", torch.stack(outs))
        return hook

    for i, layer in enumerate(ctx.layers):
        moe = getattr(layer, "mlp", None)
        if getattr(moe, "router", None) is None or getattr(layer, "post_attention_layernorm", None) is None:
            raise Unsupported(f"decoder layer {i} has no mlp.router or post_attention_layernorm")
        layer.post_attention_layernorm.register_forward_pre_hook(
            lambda _mod, args, i=i: ctx.put(f"attn_res.{i}", args[0]))
        # Its output too: the router's and the experts' input, which the attention+router graph
        # hands to the experts graph (one graph serves every layer, so the norm stays with attention).
        layer.post_attention_layernorm.register_forward_hook(
            lambda _mod, _args, out, i=i: ctx.put(f"moe_in.{i}", out))
        moe.router.register_forward_hook(put_router(i))
        if getattr(moe, "experts", None) is None:
            raise Unsupported(f"decoder layer {i} has no mlp.experts")
        moe.experts.register_forward_hook(put_expert_out(i))
        moe.register_forward_hook(lambda _mod, _args, out, i=i: ctx.put(f"moe_out.{i}", out))


def capture_gemma4(ctx):
    put_kv_rows(ctx)  # sliding + full producer layers; KV-shared layers put nothing


def hooks_gemma4(ctx):
    """Per-layer embeddings (PLE), per layer i and step: ple_in.{i} [P], layer i's slice of the
    token's embed_tokens_per_layer row as HF scales it (x sqrt(P)): what the runtime feeds from its
    host table; ple.{i} [P], the per-layer input layer i is called with (the token rows mixed with
    the normed projection of the embedding: decoder layer argument 1)."""
    decoder = ctx.model.get_decoder()
    table = getattr(decoder, "embed_tokens_per_layer", None)
    if table is None:
        raise Unsupported("the gemma4 text model has no embed_tokens_per_layer (hidden_size_per_layer_input unset)")
    n = len(ctx.layers)

    def put_rows(_mod, _args, out):
        rows = out.reshape(n, -1)
        for i in range(n):
            ctx.put(f"ple_in.{i}", rows[i])

    table.register_forward_hook(put_rows)

    def put_input(i):
        def hook(_mod, args, kwargs):
            x = args[1] if len(args) > 1 else kwargs.get("per_layer_input")
            if x is None:
                raise Unsupported(f"decoder layer {i} was called without a per-layer input")
            ctx.put(f"ple.{i}", x)
        return hook

    for i, layer in enumerate(ctx.layers):
        layer.register_forward_pre_hook(put_input(i), with_kwargs=True)


def tower_capture(ctx, rows=False):
    """put(name, t) for a tower's forward hooks: keeps t in ctx.vision while a prompt's tower runs
    (ctx.vision is a dict then, None otherwise), each name once. rows: a module's first output when
    it returns a tuple, as [n, width]."""
    ctx.vision = None

    def put(name, t):
        if ctx.vision is None:
            return
        if name in ctx.vision:
            raise Unsupported(f"{name} captured twice for one prompt")
        if rows:
            t = t[0] if isinstance(t, tuple) else t
            t = t.reshape(-1, t.shape[-1])
        ctx.vision[name] = t.detach().clone()
    return put


def hooks_qwen3_vl(ctx):
    """The vision tower's tensors, for a prompt with an image, from HF's own modules while it runs
    (ctx.vision is a dict then, None otherwise): vision.embed (the input of block 0: patch embed +
    interpolated position embedding), vision.block.{j} (block j's output), vision.merged (the merger's
    output: the image embeddings spliced into the prompt) and vision.deepstack.{k} (DeepStack merger
    k's output, added after decoder layer k at the image positions). Refuses a config whose DeepStack
    would reach the last decoder layer: the trace's h.{i+1} (the input of layer i+1, after the
    addition) would then have no layer to enter."""
    visual = ctx.model.model.visual
    n_ds, n_layers = len(visual.deepstack_merger_list), len(ctx.layers)
    if n_ds >= n_layers:
        raise Unsupported(f"{n_ds} DeepStack features for {n_layers} decoder layers: the last layer's output would get one")
    put = tower_capture(ctx)
    visual.blocks[0].register_forward_pre_hook(
        lambda _m, args, kwargs: put("vision.embed", args[0] if args else kwargs["hidden_states"]), with_kwargs=True)
    for j, block in enumerate(visual.blocks):
        block.register_forward_hook(lambda _m, _a, out, j=j: put(f"vision.block.{j}", out))
    visual.merger.register_forward_hook(lambda _m, _a, out: put("vision.merged", out))
    for k, merger in enumerate(visual.deepstack_merger_list):
        merger.register_forward_hook(lambda _m, _a, out, k=k: put(f"vision.deepstack.{k}", out))


def steps_qwen3_vl(ctx, ids, image):
    """One prompt of Qwen3-VL, one token per step as HF's generate feeds it, through HF's own
    modules: returns (vision, step) where vision holds the image's pixels and the vision tower's
    tensors (hooks_qwen3_vl; empty for a text prompt) and step(t, token, cache) -> (logits, cache) runs step t.

    image: None (a text prompt) or (pixel_values [patches, C*T*P*P], image_grid_thw [1, 3]); the
    prompt's <|image_pad|> tokens are then the image's (trace.py lays them out). The vision tower runs
    once (model.model.visual). Each step calls the language model with inputs_embeds: the token's
    embedding row, or at the k-th image token the k-th merged image row (what HF's masked_scatter puts
    there); M-RoPE position_ids [3, 1, 1] from HF's get_rope_index over the whole prompt (image
    tokens (s, s+row, s+col), text t = h = w, text after an image resumes at max + 1), and for a
    generated token t + rope_delta (as HF's generate: the cache position plus get_rope_index's delta);
    DeepStack: at an image token, visual_pos_masks [[True]] and that token's row of every DeepStack
    feature (HF adds feature i to the output of layer i at image positions), at a text token none.
    Puts mrope int64[3] (t, h, w) into every step."""
    model = ctx.model
    inner, cfg = model.model, model.config
    prompt = torch.tensor([ids])
    image_at = {}
    vision = {}
    if image is None:
        mm = torch.zeros_like(prompt, dtype=torch.int32)
        pos, delta = inner.get_rope_index(prompt, mm)
        merged = deepstack = None
    else:
        pixel_values, grid = image
        ctx.vision = {}
        try:
            out = inner.visual(pixel_values, grid_thw=grid, return_dict=True)
            vision = {"pixels": pixel_values.detach().clone(), **ctx.vision}
        finally:
            ctx.vision = None
        merged, deepstack = out.pooler_output, list(out.deepstack_features)
        positions = [i for i, x in enumerate(ids) if x == cfg.image_token_id]
        if len(positions) != merged.shape[0]:
            raise Unsupported(f"the prompt has {len(positions)} image tokens, the vision tower gave {merged.shape[0]} rows")
        image_at = {i: k for k, i in enumerate(positions)}
        mm = (prompt == cfg.image_token_id).int()
        pos, delta = inner.get_rope_index(prompt, mm, image_grid_thw=grid)
    embed = model.get_input_embeddings()
    language = inner.language_model

    def step(t, token, cache):
        if t < len(ids):
            p3 = pos[:, :, t:t + 1]
        else:
            p3 = (torch.tensor(t) + delta.reshape(())).reshape(1, 1, 1).expand(3, 1, 1)
        k = image_at.get(t)
        if k is None:
            x, masks, features = embed(torch.tensor([[token]])), None, None
        else:
            x = merged[k].reshape(1, 1, -1)
            masks, features = torch.ones(1, 1, dtype=torch.bool), [f[k:k + 1] for f in deepstack]
        out = language(inputs_embeds=x, position_ids=p3, past_key_values=cache, use_cache=True,
                       visual_pos_masks=masks, deepstack_visual_embeds=features)
        logits = model.get_output_embeddings()(out.last_hidden_state)[0, -1]
        ctx.put("mrope", p3.reshape(3).to(torch.int64))
        return logits, out.past_key_values

    return vision, step


def hooks_gemma4_media(ctx):
    """Gemma 4's PLE captures (hooks_gemma4), and for a prompt with an image or an audio clip the
    towers' tensors from HF's own modules while they run (ctx.vision is a dict then, None otherwise):
    vision.embed (the patch embedder's output: input projection + the two position tables; padding
    patches get none), vision.block.{j} (encoder layer j's output), over every patch of the budget
    (padding rows included: the gate compares the image's own); audio.embed (the subsampling's
    output), audio.layer.{i} (conformer layer i's output), audio.encoder (output_proj's: what enters
    embed_audio), over every subsampled frame."""
    hooks_gemma4(ctx)
    inner = ctx.model.model
    put = tower_capture(ctx, rows=True)

    tower = getattr(inner, "vision_tower", None)
    if tower is not None:
        tower.patch_embedder.register_forward_hook(lambda _m, _a, out: put("vision.embed", out))
        for j, layer in enumerate(tower.encoder.layers):
            layer.register_forward_hook(lambda _m, _a, out, j=j: put(f"vision.block.{j}", out))
    tower = getattr(inner, "audio_tower", None)
    if tower is not None:
        tower.subsample_conv_projection.register_forward_hook(lambda _m, _a, out: put("audio.embed", out))
        for i, layer in enumerate(tower.layers):
            layer.register_forward_hook(lambda _m, _a, out, i=i: put(f"audio.layer.{i}", out))
        tower.output_proj.register_forward_hook(lambda _m, _a, out: put("audio.encoder", out))


def steps_gemma4(ctx, ids, media):
    """One prompt of Gemma 4, one token per step, through HF's own modules: returns (tensors, step).

    media: None (a text prompt: every step is the model's own forward on the token, as plain_step)
    or {"image": {"pixel_values" [1, P, 3*p*p], "image_position_ids" [1, P, 2]}} or {"audio":
    {"input_features" [1, F, mel], "input_features_mask" [1, F]}} (one of each at most). The tower
    runs once (get_image_features / get_audio_features: tower, then embed_vision / embed_audio, padding
    stripped); its k-th soft token replaces the k-th placeholder token of the prompt (image_token_id
    or audio_token_id), as HF's masked_scatter does. At a placeholder, as Gemma4Model.forward: the
    residual entering layer 0 and the per-layer projection's input are the soft token (inputs_embeds
    after the scatter), the per-layer token rows are the pad token's (HF replaces placeholders by
    pad_token_id for the PLE lookup). Returns besides the towers' captures (hooks_gemma4_media) the
    inputs (vision.pixels, vision.positions / audio.features, audio.mask) and the soft tokens
    (vision.tokens / audio.tokens [T, H], the rows spliced in)."""
    model = ctx.model
    inner, cfg = model.model, model.config
    tensors, soft = {}, {}
    for kind, feeds in (media or {}).items():
        ctx.vision = {}
        try:
            if kind == "image":
                out = inner.get_image_features(feeds["pixel_values"], feeds["image_position_ids"], return_dict=True)
                rows, token = out.pooler_output[0], cfg.image_token_id
                inputs = {"vision.pixels": feeds["pixel_values"][0], "vision.positions": feeds["image_position_ids"][0]}
            elif kind == "audio":
                out = inner.get_audio_features(feeds["input_features"], feeds["input_features_mask"], return_dict=True)
                rows, token = out.pooler_output[out.attention_mask], cfg.audio_token_id
                inputs = {"audio.features": feeds["input_features"][0], "audio.mask": feeds["input_features_mask"][0]}
            else:
                raise Unsupported(f"gemma4 takes images and audio, not {kind}")
            captured = ctx.vision
        finally:
            ctx.vision = None
        prefix = "vision" if kind == "image" else "audio"
        at = [i for i, x in enumerate(ids) if x == token]
        if len(at) != rows.shape[0]:
            raise Unsupported(f"the prompt has {len(at)} {kind} tokens, the {kind} tower gave {rows.shape[0]} soft tokens")
        soft.update({i: rows[k] for k, i in enumerate(at)})
        tensors.update({name: v.detach().clone() for name, v in inputs.items()})
        tensors.update(captured)
        tensors[f"{prefix}.tokens"] = rows.detach().clone()
    language = inner.language_model
    pad = torch.tensor([[cfg.get_text_config().pad_token_id]])

    def step(t, token, cache):
        row = soft.get(t)
        if row is None:
            out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        else:
            out = model(inputs_embeds=row.reshape(1, 1, -1), per_layer_inputs=language.get_per_layer_inputs(pad, None),
                        past_key_values=cache, use_cache=True)
        return out.logits[0, -1], out.past_key_values

    return tensors, step


# Per-layer captures, by name prefix ({prefix}.{layer}): (rank in the layer's forward, words). The
# rank orders the finite check, so the first non-finite tensor named is where NaN/Inf entered.
LAYER_CAPTURES = {
    "k": (0, "new key row"), "v": (0, "new value row"),
    "conv": (0, "conv state"), "rec": (0, "recurrent state"),
    "attn_res": (1, "attention residual output (input of post_attention_layernorm)"),
    "moe_in": (2, "MoE block input (post_attention_layernorm output)"),
    "router_logits": (3, "router logits"), "expert_ids": (4, "selected experts"),
    "expert_weights": (4, "selected experts' weights"),
    "expert_out": (5, "each selected expert's output, unweighted, by slot"), "moe_out": (6, "MoE block output"),
    "ple_in": (0, "per-layer embedding row (PLE token rows, scaled)"), "ple": (0, "per-layer input (PLE, mixed)"),
}

# model_type -> Family: capture(ctx) runs after every step and puts that family's cache/state
# tensors; hooks(ctx) (optional) runs once after loading and registers forward hooks that put
# per-layer captures into ctx.step; pending: what is not captured yet (a warning); steps (optional):
# steps(ctx, ids, image) -> (vision tensors, step(t, token, cache) -> (logits, cache)), the family's
# own way to feed one token (and its image inputs; a family without it takes no image); layer_inputs:
# h.{i} for 0 < i < L is the input of layer i (a pre-hook), not the output of layer i-1, because the
# model changes the residual between layers (Qwen3-VL's DeepStack).
Family = collections.namedtuple("Family", "capture hooks pending steps layer_inputs", defaults=(None, False))
FAMILIES = {
    "qwen3": Family(capture_attention, None, None),
    "qwen3_vl": Family(capture_attention, hooks_qwen3_vl, None, steps_qwen3_vl, True),
    "qwen3_5": Family(capture_qwen3_5, None, None),
    "phimoe": Family(put_kv_rows, hooks_phimoe, None),
    "gemma4": Family(capture_gemma4, hooks_gemma4_media, None, steps_gemma4),
}
