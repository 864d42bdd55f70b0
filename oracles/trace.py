#!/usr/bin/env python3
"""Oracle trace: HF transformers fp32 reference, one-token cached decode, per-step tensors.

    python oracles/trace.py --model DIR --out DIR --prompts PROMPTS.json --new-tokens N --max-context C
                            [--image-size HxW | --image-tokens N] [--audio-seconds S] [--whole-model]

Weights are streamed (oracles/streamed_weights.py): the checkpoint stays memory-mapped in its own
dtype and each decoder layer, embedding, norm and lm_head gets its fp32 weights just for its own
forward, so private memory holds about one layer or one lm_head in fp32, not the model.
--whole-model is HF's plain fp32 from_pretrained (~4 bytes per parameter): the reference the
streamed trace is tested against, byte for byte, on every tiny twin.

Each prompt is fed one token at a time through the model with its KV cache (never a full-sequence
forward: the exported graphs decode one token at a time, and some families' prefill kernels differ
from their decode path), teacher-forced over the prompt, then greedy for N tokens. Step t feeds
token t (prompt tokens, then generated[0..N-2]); generated[j] = argmax of the logits at step
len(prompt)-1+j, so a prompt has len(prompt)+N-1 steps. A NaN or Inf in any captured tensor is an
error naming the prompt, the step and the first tensor (in forward order) that holds one.

Writes, into a temp dir beside --out renamed at the end:
  trace.json         {family, layers, hidden, vocab, kv_heads, head_dim, max_context, new_tokens,
                      prompts: [{text, prompt_tokens, generated, runner_up, margins, steps}],
                      margins, tensors, torch, transformers}
                     runner_up[j] / margins[j]: the second-highest logit's token at the step that chose
                     generated[j], and HF's top-1 - top-2 margin there (logits[generated[j]] -
                     logits[runner_up[j]], float32 values subtracted in double). margins (top level):
                     their distribution over all prompts (margin_summary): count, min, p5, p50, max,
                     fp16_spacing (2^-8), below_fp16_spacing, below_0_1 (how many margins lie below
                     each), smallest {prompt, step, generated_index, margin, token, runner_up,
                     token_text, runner_up_text}: how confident the reference is, next to the logit
                     error each precision shows in the oracle gate.
  trace.safetensors  p{p}/s{t}/token int64[1], position int64[1] (= t), h.{i} [H] for i = 0..L
                     (h.0 = input of decoder layer 0, h.{i+1} = output of layer i), final [H] (input of
                     lm_head), logits [V] (after any softcap), k.{i} / v.{i} [kv_heads, head_dim]
                     (the row this step appended to layer i's cache, keys after RoPE). float32.
                     kv_heads / head_dim are a per-layer list where they vary (Gemma 4).
                     Per-family captures, per layer i (trace_families.py): qwen3_5 conv.{i} /
                     rec.{i}; phimoe attn_res.{i} [H] (input of post_attention_layernorm),
                     moe_in.{i} [H] (its output), router_logits.{i} [E], expert_ids.{i} int64[2] and expert_weights.{i} [2] (HF's
                     sparsemixer at inference, slot order), expert_out.{i} [2·H] (each selected expert's
                     output, unweighted, slot-major), moe_out.{i} [H] (h.{i+1} = attn_res + moe_out).
                     gemma4 ple_in.{i} [P] (layer i's scaled PLE token row), ple.{i} [P] (its mixed
                     per-layer input); KV-shared layers have no k/v rows (they read their donor's).
                     qwen3_vl, every step (text prompts too): mrope int64[3], the (t, h, w) M-RoPE
                     position ids the step was fed (text: t = h = w; k.{i} rows are after M-RoPE);
                     h.{i} for 0 < i < L is the hidden state ENTERING layer i, i.e. after DeepStack
                     added feature i-1 at an image token (HF's forward hook on layer i-1 sees it before
                     the addition); h.L is the last layer's output (DeepStack never reaches it).
                     qwen3_vl image prompt p, once (no step): p{p}/pixels [patches, C*T*P*P] (pixels.py),
                     p{p}/vision.embed [patches, Hv] (patch embed + interpolated position embedding:
                     the input of vision block 0), p{p}/vision.block.{j} [patches, Hv] (block j's
                     output), p{p}/vision.merged [T, out_hidden] (the merger's output: the rows fed at
                     the T image tokens) and p{p}/vision.deepstack.{k} [T, out_hidden] (DeepStack
                     merger k's output, added after decoder layer k at the image tokens).
--prompts holds typed inputs: a JSON list of {"type": "text", "text": ...} or plain strings (text),
{"type": "ids", "ids": [...]}: token ids traced exactly as given (a runtime's prompt_ids, e.g.
qhx_generate --json's), no tokenizer; its record's text is the ids decoded. Ids outside the
config's vocabulary are refused. Or, for a family with a vision tower (qwen3_vl), {"type": "image",
"image": FILE, "text": ...} with --image-size HxW (the recipe's size): its pixels, prompt ids and
record as pixels.image_prompt makes them; the vision tower runs once, then one token per step as for
text, with HF's embedding or merged image row, M-RoPE positions and DeepStack rows (trace_families).
Its record adds "image": {file, sha256, size, grid, tokens, start}; its text is the text. For gemma4,
with --image-tokens N (the recipe's budget): HF's Gemma 4 processor keeps the image's aspect ratio
within N soft tokens (pixels.gemma4_image_prompt); the prompt is the text's ids with the image block
(<start_of_image>, its soft tokens, <end_of_image>) after the BOS; the tower and embed_vision run once
and each step feeds HF's embedding or the image's soft token (trace_families.steps_gemma4). It adds
p{p}/vision.pixels [P, 3*p*p], vision.positions int64 [P, 2] ((x, y); padding -1), vision.embed and
vision.block.{j} [P, Hv] (padding rows included), vision.tokens [T, H] (the soft tokens spliced in).
Gemma 4 also takes {"type": "audio", "audio": FILE (WAV), "text": ...} with --audio-seconds S (the
recipe's budget): audio_prompt.gemma4_audio_prompt's features (padded to S), ids (the clip's block
<start_of_audio>, its audio tokens, <end_of_audio> after the BOS) and record "audio": {file, sha256,
frames, valid_frames, tokens, start}; the audio tower runs once (trace_families.steps_gemma4) and adds
p{p}/audio.features [F, mel], audio.mask bool [F], audio.embed and audio.layer.{i} [F/4, Ha],
audio.encoder [F/4, out] (padding rows included), audio.tokens [T, H] (the clip's soft tokens).
Prints one JSON line: {"bytes", "out", "prompts", "steps", "weights" (streamed | whole-model),
"weights_fp32_peak_bytes" (streamed: most fp32 weight bytes held at once), "load_s", "trace_s"
(wall) and "load_cpu_s", "trace_cpu_s" (CPU time of all threads)}.
Format checked by check_trace.py.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # keep stderr for our own error line
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers.integrations.heterogeneity.configuration_utils import (  # noqa: E402
    AmbiguousGlobalPerLayerAttributeError as AmbiguousPerLayer)

# What each family captures beyond the residual stream (after the environment above is set).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # forge runs this file via runpy
from trace_families import FAMILIES, LAYER_CAPTURES, Unsupported  # noqa: E402  (beside this file)
import pixels  # noqa: E402  (beside this file: HF's pixels for an image file at the recipe's size)
import audio_prompt  # noqa: E402  (beside this file: HF's features and ids for a Gemma 4 audio clip)
from streamed_weights import load_streamed  # noqa: E402  (beside this file: the default weight loading)


class NonFiniteReference(Exception):
    """The HF reference itself produced NaN/Inf: nothing can be gated against it."""


def what_is(name):
    """A trace tensor's name in words, for messages."""
    kind, _, i = name.partition(".")
    if kind == "h":
        return f"the residual entering decoder layer {i}" if i == "0" else f"the output of decoder layer {int(i) - 1}"
    if kind in LAYER_CAPTURES and i.isdigit():
        return f"layer {i}'s {LAYER_CAPTURES[kind][1]}"
    return {"final": "the final norm output", "logits": "the logits"}.get(kind, name)


def forward_order(name):
    """Where a trace tensor is computed in the forward pass: inside layer i, its captures in their
    declared order (LAYER_CAPTURES), then its output h.{i+1}; final and logits come last."""
    kind, _, i = name.partition(".")
    if kind == "h":
        return (int(i) - 1, len(LAYER_CAPTURES))
    if i.isdigit():
        return (int(i), LAYER_CAPTURES[kind][0] if kind in LAYER_CAPTURES else 0)
    return (1 << 30, 0 if kind == "final" else 1)


def check_finite(step, p, text, t):
    """The first captured tensor in forward order (so where the non-finite value enters) holding
    NaN/Inf, named with the prompt and step."""
    for name in sorted(step, key=forward_order):
        v = step[name]
        if not v.is_floating_point():
            continue
        bad = ~torch.isfinite(v.reshape(-1))
        if bad.any():
            first, count = int(bad.nonzero()[0]), int(bad.sum())
            raise NonFiniteReference(
                f"prompt {p} ({text!r}) step {t}: {name} ({what_is(name)}) holds {count} non-finite "
                f"value{'' if count == 1 else 's'} of {v.numel()} (first at index {first}: {float(v.reshape(-1)[first])})")


# ---- generic driver -----------------------------------------------------------------------------

class Ctx:
    def __init__(self, model, layers):
        self.model, self.layers, self.cache, self.step, self.vision = model, layers, None, {}, None

    def put(self, name, t):
        if name in self.step:
            raise Unsupported(f"{name} captured twice in one step")
        # clone: cache rows and hook outputs are views into buffers HF keeps mutating
        self.step[name] = t.detach().reshape(t.shape[-2:] if name[:2] in ("k.", "v.") else -1).clone()


def text_dim(tc, attr):
    """A text-config dimension; a list per layer where it varies (Gemma 4 full vs sliding)."""
    try:
        return getattr(tc, attr)
    except AmbiguousPerLayer:
        vals = [getattr(c, attr) for c in tc.per_layer_config]
        return vals[0] if len(set(vals)) == 1 else vals
    except AttributeError:
        if attr == "head_dim":
            return tc.hidden_size // tc.num_attention_heads
        raise


def load(model_dir, whole_model):
    """The model and, when streamed, its StreamedWeights (None for --whole-model)."""
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    if cfg.model_type not in FAMILIES:
        raise Unsupported(f"family {cfg.model_type!r}")
    if type(cfg) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        auto = transformers.AutoModelForCausalLM
    elif type(cfg) in transformers.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        auto = transformers.AutoModelForImageTextToText  # e.g. qwen3_vl: no CausalLM mapping; text only
    else:
        raise Unsupported(f"no causal-LM or image-text-to-text class for {cfg.model_type}")
    if whole_model:
        return cfg.model_type, auto.from_pretrained(model_dir, dtype=torch.float32).eval(), None
    model, streamed = load_streamed(auto, model_dir, lambda m: m.get_decoder().layers)
    return cfg.model_type, model, streamed


def install_hooks(ctx, n_layers, layer_inputs=False):
    """h.0 (input of layer 0), h.{i+1} (output of layer i), final (input of lm_head). layer_inputs:
    h.{i} for 0 < i < L is what enters layer i (a forward pre-hook), for a model that changes the
    residual between layers (Qwen3-VL's DeepStack adds image features after the first layers)."""
    layers = ctx.layers

    def layer_in(i):
        def hook(_mod, args, kwargs):
            ctx.put(f"h.{i}", args[0] if args else kwargs["hidden_states"])
        return hook

    def layer_out(i):
        def hook(_mod, _args, out):
            ctx.put(f"h.{i + 1}", out[0] if isinstance(out, tuple) else out)
        return hook

    for i in range(n_layers if layer_inputs else 1):
        layers[i].register_forward_pre_hook(layer_in(i), with_kwargs=True)
    for i in range(n_layers - 1 if layer_inputs else 0, n_layers):
        layers[i].register_forward_hook(layer_out(i))
    ctx.model.get_output_embeddings().register_forward_pre_hook(
        lambda _mod, args: ctx.put("final", args[0]))


def top_two(logits):
    """The argmax (torch's: the first of equal maxima, as the greedy token), the runner-up (the
    argmax of the rest) and their margin, the difference of the two float32 logits taken in
    Python's double, where it is exact."""
    top = int(torch.argmax(logits))
    rest = logits.clone()
    rest[top] = float("-inf")
    second = int(torch.argmax(rest))
    return top, second, float(logits[top]) - float(logits[second])


def plain_step(ctx):
    """A text model's step: the token through the model's own forward, with its cache."""
    def step(_t, token, cache):
        out = ctx.model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        return out.logits[0, -1], out.past_key_values
    return step


def check_finite_vision(vision, p, text):
    for name, v in vision.items():  # in the order the vision tower computed them
        bad = ~torch.isfinite(v.reshape(-1))
        if bad.any():
            raise NonFiniteReference(f"prompt {p} ({text!r}): the vision tower's {name} holds {int(bad.sum())} "
                                     f"non-finite values of {v.numel()}")


def trace_prompt(ctx, capture, ids, n_new, tensors, p, text, vocab, steps=None, image=None):
    """Traces one prompt; returns the greedy tokens and, per generated token, the runner-up token and
    HF's top-1 - top-2 margin at that step. steps: the family's own step maker (trace_families), which
    also takes the prompt's image (pixel_values, image_grid_thw) and runs its vision tower once."""
    cache, generated, runner_up, margins = None, [], [], []
    seq = list(ids)
    if steps is None:
        step = plain_step(ctx)
    else:
        vision, step = steps(ctx, ids, image)
        check_finite_vision(vision, p, text)
        for name, v in vision.items():
            tensors[f"p{p}/{name}"] = v
    for t in range(len(ids) + n_new - 1):
        ctx.step = {}
        logits, cache = step(t, seq[t], cache)
        ctx.cache = cache
        if logits.shape[0] != vocab:
            raise Unsupported(f"logits have {logits.shape[0]} entries, config vocab is {vocab}")
        ctx.put("logits", logits)
        missing = [n for n in [f"h.{i}" for i in range(len(ctx.layers) + 1)] + ["final"] if n not in ctx.step]
        if missing:  # a family whose forward bypasses these modules
            raise Unsupported(f"hooks did not capture {', '.join(missing)}")
        capture(ctx)
        check_finite(ctx.step, p, text, t)
        if t >= len(ids) - 1:
            top, second, margin = top_two(logits)
            generated.append(top)
            runner_up.append(second)
            margins.append(margin)
            seq.append(top)
        ctx.step["token"] = torch.tensor([seq[t]], dtype=torch.int64)
        ctx.step["position"] = torch.tensor([t], dtype=torch.int64)
        for name, v in ctx.step.items():
            tensors[f"p{p}/s{t}/{name}"] = v
    return generated, runner_up, margins


# Trace inputs are typed: "text", "ids" (token ids as a runtime was fed them), "image" (an image
# file and the text after it, for a family with a vision tower) or "audio" (a WAV file and the text
# after it, for a family with an audio tower).
INPUT_TYPES = {"text": str, "ids": list, "image": str, "audio": str}
MEDIA = ("image", "audio")


def typed_inputs(items, kinds=INPUT_TYPES):
    """A trace's inputs as (kind, value) pairs: a JSON list whose entries are {"type": "text", "text":
    "..."}, a plain string (a text input), {"type": "ids", "ids": [non-negative ints]} or
    {"type": "image"|"audio", "image"|"audio": "<file>", "text": "..."} (value: (file, text)). A type
    not in kinds (the model's: image / audio only for a family with that tower) is refused, naming the entry."""
    if not isinstance(items, list) or not items:
        raise ValueError("must hold a non-empty JSON list of inputs (strings or {\"type\": \"text\", \"text\": ...})")
    inputs = []
    for n, item in enumerate(items):
        if isinstance(item, dict):
            kind = item.get("type")
            if kind not in kinds:
                raise ValueError(f"[{n}].type is {kind!r}; supported: {', '.join(kinds)}")
            if kind in MEDIA:
                if set(item) != {"type", kind, "text"} or not isinstance(item[kind], str) \
                        or not isinstance(item["text"], str) or not item[kind]:
                    raise ValueError(f"[{n}]: an input of type {kind} is {{\"type\": \"{kind}\", \"{kind}\": <file>, "
                                     f"\"text\": <string>}}, got keys {sorted(item)}")
                inputs.append((kind, (item[kind], item["text"])))
                continue
            if set(item) != {"type", kind} or not isinstance(item[kind], INPUT_TYPES[kind]):
                what = "<string>" if kind == "text" else "[token ids]"
                raise ValueError(f"[{n}]: an input of type {kind} is {{\"type\": \"{kind}\", \"{kind}\": {what}}}, got keys {sorted(item)}")
            if kind == "ids":
                ids = item["ids"]
                if not ids or not all(type(i) is int and i >= 0 for i in ids):
                    raise ValueError(f"[{n}].ids must be a non-empty list of non-negative integers")
                inputs.append(("ids", list(ids)))
                continue
            item = item[kind]
        if not isinstance(item, str):
            raise ValueError(f"[{n}] is {type(item).__name__}, not a string or a typed input")
        inputs.append(("text", item))
    return inputs


# fp16's spacing for magnitudes in [4, 8) (0.0039): two logits of that size closer than this may
# round to the same fp16 value (issue 13's 151,936-token twin diverged on the simulator at 7e-4).
FP16_SPACING = 2.0 ** -8


def margin_summary(records, tok):
    """The distribution of HF's top-1 - top-2 margins over every generated token of every prompt.
    Percentiles are nearest-rank (p-th: the ceil(p/100 * n)-th smallest), so each is a margin that
    occurred; the smallest margin's step is the first such in (prompt, step) order."""
    steps = [(m, p, j) for p, r in enumerate(records) for j, m in enumerate(r["margins"])]
    ms = sorted(s[0] for s in steps)
    n = len(ms)

    def rank(pct):  # integers: 0.05 * 60 is 3.0000000000000004 in floats
        return ms[max(0, -(-pct * n // 100) - 1)]

    m, p, j = min(steps, key=lambda s: s[0])
    r = records[p]
    token, second = r["generated"][j], r["runner_up"][j]
    return {"count": n, "min": ms[0], "p5": rank(5), "p50": rank(50), "max": ms[-1],
            "fp16_spacing": FP16_SPACING,
            "below_fp16_spacing": sum(1 for x in ms if x < FP16_SPACING),
            "below_0_1": sum(1 for x in ms if x < 0.1),
            "smallest": {"prompt": p, "step": len(r["prompt_tokens"]) - 1 + j, "generated_index": j,
                         "margin": m, "token": token, "runner_up": second,
                         "token_text": tok.decode([token]), "runner_up_text": tok.decode([second])}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF checkpoint directory")
    ap.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    ap.add_argument("--prompts", required=True, help="JSON list of prompt strings")
    ap.add_argument("--new-tokens", type=int, required=True)
    ap.add_argument("--max-context", type=int, required=True)
    ap.add_argument("--image-size", metavar="HxW",
                    help="the recipe's image size: every image input is stretched to it (pixels.py); required with image inputs")
    ap.add_argument("--image-tokens", type=int, metavar="N",
                    help="gemma4: the recipe's soft-token budget per image (HF's processor keeps each image's aspect "
                         "ratio within it); required with its image inputs")
    ap.add_argument("--audio-seconds", type=float, metavar="S",
                    help="gemma4: the recipe's audio budget (the longest clip; its features are padded to it); "
                         "required with audio inputs")
    ap.add_argument("--whole-model", action="store_true",
                    help="load every weight in fp32 up front (HF's plain from_pretrained): the reference the "
                         "streamed default is tested against byte for byte; needs ~4 bytes per parameter")
    args = ap.parse_args()
    n_new, ctx_max = args.new_tokens, args.max_context

    def fail(msg):
        print(f"trace: error: {msg}", file=sys.stderr)
        sys.exit(1)

    out = os.path.abspath(args.out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        fail(f"{out} exists and is not an empty directory")
    if n_new < 1:
        fail(f"--new-tokens must be >= 1 (got {n_new})")
    try:
        with open(args.prompts) as f:
            prompts = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"reading {args.prompts}: {e}")
    try:  # the model's input kinds: images only where its family traces them (trace_families steps)
        family_of = transformers.AutoConfig.from_pretrained(args.model).model_type
    except Exception:  # noqa: BLE001  (a bad --model is reported below, by the loader)
        family_of = None
    # Image inputs: a fixed size for Qwen3-VL (pixels.image_prompt), a soft-token budget for Gemma 4.
    takes = {"image"} if family_of == "qwen3_vl" else {"image", "audio"} if family_of == "gemma4" else set()
    try:
        inputs = typed_inputs(prompts, {k: v for k, v in INPUT_TYPES.items() if k not in MEDIA or k in takes})
    except ValueError as e:
        fail(f"{args.prompts}: {e}")

    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    # Text: the tokenizer's default special tokens, no template. Ids: as given, checked against the
    # config's vocabulary here, before the model loads (an embedding lookup would fail obscurely).
    config = transformers.AutoConfig.from_pretrained(args.model)
    vocab_size = config.get_text_config().vocab_size
    images = {}  # input index -> the media steps() takes (pixels / features), and its record
    if any(kind == "audio" for kind, _ in inputs) and not (args.audio_seconds and args.audio_seconds > 0):
        fail(f"{args.prompts}: audio inputs need --audio-seconds S (the recipe's audio budget)")
    if any(kind == "image" for kind, _ in inputs) and family_of == "gemma4":
        if not args.image_tokens or args.image_tokens < 1:
            fail(f"{args.prompts}: gemma4 image inputs need --image-tokens N (the recipe's soft-token budget)")
    elif any(kind == "image" for kind, _ in inputs):
        if not args.image_size:
            fail(f"{args.prompts}: image inputs need --image-size HxW (the recipe's image size)")
        try:
            image_hw = pixels.parse_size(args.image_size)
        except ValueError as e:
            fail(f"--image-size: {e}")
    encoded = []
    for n, (kind, v) in enumerate(inputs):
        if kind == "text":
            encoded.append(tok(v)["input_ids"])
        elif kind == "ids":
            encoded.append(v)
        else:  # an image or a clip: HF's pixels / features and its tokens before the text's
            try:
                if kind == "audio":
                    image, ids, record = audio_prompt.gemma4_audio_prompt(args.model, config, tok, *v, args.audio_seconds)
                elif family_of == "gemma4":
                    image, ids, record = pixels.gemma4_image_prompt(config, tok, *v, args.image_tokens)
                else:
                    image, ids, record = pixels.image_prompt(args.model, config, tok, *v, *image_hw)
            except (OSError, ValueError) as e:
                fail(f"{args.prompts}: input {n}: {e}")
            encoded.append(ids)
            images[n] = (image, {kind: record})
    for n, ((kind, _), ids) in enumerate(zip(inputs, encoded)):
        bad = [i for i in ids if i >= vocab_size] if kind == "ids" else []
        if bad:
            fail(f"{args.prompts}: input {n}: token id {bad[0]} is outside the vocabulary ({vocab_size} ids, 0..{vocab_size - 1})")
    prompts = [v if kind == "text" else v[1] if kind in MEDIA else tok.decode(v) for kind, v in inputs]
    for s, ids in zip(prompts, encoded):
        if not ids:
            fail(f"prompt {s!r} tokenizes to nothing")
        if len(ids) + n_new > ctx_max:
            fail(f"prompt {s!r}: {len(ids)} tokens + {n_new} new > max context {ctx_max}")

    torch.manual_seed(0)
    started, started_cpu = time.monotonic(), time.process_time()
    try:
        family, model, streamed = load(args.model, args.whole_model)
        loaded, loaded_cpu = time.monotonic(), time.process_time()
        capture, hooks, pending, steps, layer_inputs = FAMILIES[family]
        tc = model.config.get_text_config()
        n_layers, vocab = tc.num_hidden_layers, tc.vocab_size
        dims = {"layers": n_layers, "hidden": tc.hidden_size, "vocab": vocab,
                "kv_heads": text_dim(tc, "num_key_value_heads"), "head_dim": text_dim(tc, "head_dim")}
        ctx = Ctx(model, model.get_decoder().layers)
        if len(ctx.layers) != n_layers:
            raise Unsupported(f"{len(ctx.layers)} decoder layers, config says {n_layers}")
        install_hooks(ctx, n_layers, layer_inputs)
        if hooks:
            hooks(ctx)
        tensors, records = {}, []
        with torch.no_grad():
            for p, (text, ids) in enumerate(zip(prompts, encoded)):
                image, about = images.get(p, (None, None))
                gen, second, margins = trace_prompt(ctx, capture, ids, n_new, tensors, p, text, vocab, steps, image)
                records.append({"text": text, "prompt_tokens": list(ids), "generated": gen,
                                "runner_up": second, "margins": margins, "steps": len(ids) + n_new - 1,
                                **(about or {})})
        traced, traced_cpu = time.monotonic(), time.process_time()
    except Unsupported as e:
        fail(f"{args.model}: not yet supported by trace.py: {e}")
    except NonFiniteReference as e:
        fail(f"{args.model}: the Hugging Face reference is not finite, nothing can be gated against it: {e}")
    except Exception as e:  # one line, not a traceback: HF errors are the message worth reading
        fail(f"{args.model}: {type(e).__name__}: {e}")
    if pending:  # runs, but a later issue still has to add this family's own state
        print(f"trace: warning: {family}: {pending} not captured yet", file=sys.stderr)

    meta = {"family": family, **dims, "max_context": ctx_max, "new_tokens": n_new, "prompts": records,
            "margins": margin_summary(records, tok),
            "tensors": "trace.safetensors", "torch": torch.__version__,
            "transformers": transformers.__version__}
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    # Write beside --out and rename at the end: --out is either absent or complete.
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        st = os.path.join(tmp, "trace.safetensors")
        save_file(tensors, st, metadata={"format": "pt"})  # fixed metadata: byte-identical reruns
        with open(os.path.join(tmp, "trace.json"), "w") as f:
            f.write(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        for n in os.listdir(tmp):
            os.chmod(os.path.join(tmp, n), 0o644)
        os.chmod(tmp, 0o755)
        size = os.path.getsize(st)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.rename(tmp, out)
    except Exception as e:
        shutil.rmtree(tmp, ignore_errors=True)
        fail(f"writing {out}: {type(e).__name__}: {e}")
    total = sum(r["steps"] for r in records)
    # Timings and the weights' fp32 peak go to stdout only: trace.json stays byte-identical.
    print(json.dumps({"out": out, "prompts": len(records), "steps": total, "bytes": size,
                      "weights": "whole-model" if streamed is None else "streamed",
                      "weights_fp32_peak_bytes": None if streamed is None else streamed.peak_live,
                      "load_s": round(loaded - started, 3), "trace_s": round(traced - loaded, 3),
                      "load_cpu_s": round(loaded_cpu - started_cpu, 3), "trace_cpu_s": round(traced_cpu - loaded_cpu, 3)},
                     sort_keys=True))


if __name__ == "__main__":
    main()
