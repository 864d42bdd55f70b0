#!/usr/bin/env python3
"""Tiny-twin factory: a small random-weight HF checkpoint per model family.

    python oracles/make_twin.py --family qwen3 --out /tmp/twins/qwen3

A twin has the real family's config layout, weight names, dtype (bf16), tokenizer files and
special tokens, at toy size (hidden 64), so forge can be tested end to end against HF in seconds.
Each twin switches on every feature its family's real checkpoint uses (see the per-family dicts).
A vision twin (qwen3_vl) also ships its image processor (preprocessor_config.json) and is trained
to caption twin_images.py's pictures, so an image changes its answer; the gemma4 twin learns to
caption two of them as Gemma 4's processor makes them (its audio tower stays random).
Output is byte-identical across runs: fixed seeds, deterministic BPE training, sorted JSON.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # single-threaded BPE training: same merges every run
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # forge runs this file via runpy
import twin_corpus  # noqa: E402  (beside this file)
from twin_training import NEW_TOKENS, check_features, measure_confidence, train  # noqa: E402

# The recipes' and tests' prompts: each starts one corpus passage (twin_corpus.py) and must split
# into several tokens; LONG_PROMPT into at least LONG_PROMPT_TOKENS (checked at build time).
PROMPTS = twin_corpus.PROMPTS
LONG_PROMPT_TOKENS = 100
BPE_VOCAB = 1024  # trained size incl. head specials; tail specials are appended after
# Weight init std ~ 1/sqrt(hidden 64): HF's default 0.02 is tuned for hidden ~2560 and would make
# every layer of a 64-wide twin near-identity, attention near-uniform and logits near-tied.
INIT_STD = 0.1

# Per-tokenizer-style special tokens. "head" tokens get the first ids (Gemma, Llama/Phi style);
# "tail" tokens are appended after the BPE vocab (Qwen, Phi chat tokens style).
QWEN_TAIL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
             "<|image_pad|>", "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' }}"
    "{%- if m['content'] is string %}{{- m['content'] }}{%- else %}{%- for c in m['content'] %}"
    "{%- if c['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif c['type'] == 'text' %}{{- c['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}")
GEMMA_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{- '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}")
PHI_TEMPLATE = (
    "{%- for m in messages %}{{- '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}")
TOKENIZER_STYLES = {
    "qwen": dict(head=[], tail=QWEN_TAIL, plain=["<think>", "</think>"], bos=None,
                 eos="<|im_end|>", pad="<|endoftext|>", unk=None, add_bos=False, template=QWEN_TEMPLATE),
    "gemma": dict(head=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                        "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<start_of_audio>",
                        "<end_of_audio>", "<audio_soft_token>", "<|video|>"],
                  tail=[], plain=[], bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>", add_bos=True,
                  template=GEMMA_TEMPLATE),
    "phi": dict(head=["<unk>", "<s>", "</s>"],
                tail=["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"], plain=[],
                bos="<s>", eos="<|endoftext|>", pad="<|endoftext|>", unk="<unk>", add_bos=False,
                template=PHI_TEMPLATE),
}


def train_tokenizer(style):
    """Byte-level BPE trained on CORPUS, wrapped as a transformers fast tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=1, show_progress=False,
                                  special_tokens=style["head"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(twin_corpus.PASSAGES, trainer=trainer)
    tok.add_special_tokens(style["tail"])  # appended in listed order, after the BPE vocab
    tok.add_tokens(style["plain"])  # e.g. Qwen <think>: added but not special
    if style["add_bos"]:  # Gemma prepends <bos> to every encoded text
        bos_id = tok.token_to_id(style["bos"])
        tok.post_processor = processors.TemplateProcessing(
            single=f"{style['bos']} $A", pair=f"{style['bos']} $A $B", special_tokens=[(style["bos"], bos_id)])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    named = {k: style[k] for k in ("bos", "eos", "pad", "unk") if style[k]}
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, **{f"{k}_token": v for k, v in named.items()},
        additional_special_tokens=[t for t in style["head"] + style["tail"] if t not in named.values()],
        model_max_length=4096, clean_up_tokenization_spaces=False)
    hf.chat_template = style["template"]
    for p in PROMPTS:
        n = len(hf(p, add_special_tokens=False)["input_ids"])
        if n < 3:
            raise RuntimeError(f"prompt {p!r} tokenizes into only {n} tokens")
    twin_corpus.check(lambda t: len(hf(t, add_special_tokens=False)["input_ids"]), NEW_TOKENS + 2)
    n = len(hf(twin_corpus.LONG_PROMPT, add_special_tokens=False)["input_ids"])
    if n < LONG_PROMPT_TOKENS:
        raise RuntimeError(f"the long prompt tokenizes into {n} tokens, under {LONG_PROMPT_TOKENS}")
    return hf


# ---- per-family configs: dimensions documented in one dict each -------------------------------

def cfg_qwen3(tok, ids):
    # 4 layers; GQA 4q/2kv; head_dim 32 != hidden/heads (16); tied like Qwen3-4B.
    d = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
             max_position_embeddings=4096, initializer_range=INIT_STD, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    return transformers.Qwen3Config(**d)


def cfg_qwen3_odd(tok, ids):
    # Qwen3 with in-features no MatMulNBits block divides: 3 heads x head_dim 40 = 120 into o_proj,
    # intermediate 150 into down_proj (quant/pad.ts: zero-padded to 128 and 160 for W4, 128 and 160
    # for W8). 3 layers; GQA 3q/1kv; tied.
    d = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=150, num_hidden_layers=3,
             num_attention_heads=3, num_key_value_heads=1, head_dim=40, rms_norm_eps=1e-6,
             max_position_embeddings=4096, initializer_range=INIT_STD, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 1e6},
             bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    return transformers.Qwen3Config(**d)


def cfg_qwen3_5(tok, ids):
    # 8 layers, full attention at i=3,7 ((i+1)%4==0), the rest GatedDeltaNet; linear heads
    # 2 k / 4 v (Hv != Hk) with dk 16 != dv 32; conv kernel 4; partial rotary 0.25 of head_dim 32
    # (8 dims -> mrope_section sums to 4); output-gated q_proj; tied. Vision tower: 1 block.
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                linear_conv_kernel_dim=4, linear_num_key_heads=2, linear_num_value_heads=4,
                linear_key_head_dim=16, linear_value_head_dim=32, max_position_embeddings=4096,
                initializer_range=INIT_STD, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True},
                bos_token_id=None, eos_token_id=ids["<|im_end|>"])
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=64)
    return transformers.Qwen3_5Config(
        text_config=text, vision_config=vision, tie_word_embeddings=True,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


def cfg_phimoe(tok, ids):
    # 4 layers; 4 experts top-2 (sparsemixer, jitter eps 0.01); head_dim 32 != hidden/heads (16);
    # attention + lm_head biases; LayerNorm with bias; theta 1e4; untied (like Phi-tiny-MoE).
    d = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=32, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
             num_experts_per_tok=2, router_jitter_noise=0.01, attention_bias=True, lm_head_bias=True,
             rms_norm_eps=1e-5, max_position_embeddings=4096, initializer_range=INIT_STD,
             tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1e4},
             bos_token_id=ids["<s>"], eos_token_id=ids["<|endoftext|>"], pad_token_id=ids["<|endoftext|>"])
    return transformers.PhimoeConfig(**d)


def cfg_gemma4(tok, ids):
    # 8 layers S S F S S F S F (S = sliding, window 16 so short tests cross it; F = full with
    # head_dim 64 vs 32 and proportional partial rotary 0.25); last 3 layers reuse KV (5 F <- 2,
    # 6 S <- 4, 7 F <- 2); PLE 16 dims per layer; tied. Tiny vision + audio towers. Logit softcap 10
    # (real: 30): low enough that tanh visibly bends the trained twin's top logits (raw 11.9 -> 8.3),
    # so a dropped cap shows; 3 capped logits to +-3 and the twin could not learn its corpus (min margin 0.002).
    S, F = "sliding_attention", "full_attention"
    text = dict(vocab_size=len(tok), vocab_size_per_layer_input=len(tok), hidden_size=64,
                intermediate_size=128, num_hidden_layers=8, layer_types=[S, S, F, S, S, F, S, F],
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
                sliding_window=16, num_kv_shared_layers=3, hidden_size_per_layer_input=16,
                final_logit_softcapping=10.0, rms_norm_eps=1e-6, max_position_embeddings=4096,
                initializer_range=INIT_STD, tie_word_embeddings=True,
                rope_parameters={S: {"rope_type": "default", "rope_theta": 1e4},
                                 F: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                     "rope_theta": 1e6}},
                pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"])
    # Vision (trained on two pictures, twin_training.py): patch 16, pooling 3 as the real one; a
    # position table of 210 per axis, the longest side in patches Gemma 4's processor gives within the
    # recipes' 70-soft-token budget (70 x 3 = 210: 630 patches in one row). Audio (random, never
    # trained): HF sizes the subsampler's Linear for (channels[0] / 4) x channels[1] inputs but feeds
    # it (128 mel bins / 4) x channels[1], so channels[0] must be 128 for HF (and forge) to run it.
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, head_dim=16, patch_size=16, pooling_kernel_size=3,
                  position_embedding_size=210)
    audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                 subsampling_conv_channels=[128, 4], output_proj_dims=32)
    return transformers.Gemma4Config(
        text_config=text, vision_config=vision, audio_config=audio, tie_word_embeddings=True,
        boi_token_id=ids["<start_of_image>"], eoi_token_id=ids["<end_of_image>"],
        image_token_id=ids["<image_soft_token>"], video_token_id=ids["<|video|>"],
        boa_token_id=ids["<start_of_audio>"], eoa_token_index=ids["<end_of_audio>"],
        audio_token_id=ids["<audio_soft_token>"], initializer_range=INIT_STD)


def cfg_qwen3_vl(tok, ids):
    # Text: Qwen3 decoder, 4 layers, GQA 4/2, head_dim 32, theta 5e6, interleaved M-RoPE
    # (section sums to head_dim/2), tied like Qwen3-VL-2B. Vision: 3 blocks, each feeding a
    # deepstack merger (text layers 0-2), patch 16, temporal 2, merge 2x2 -> text hidden.
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                max_position_embeddings=4096, initializer_range=INIT_STD, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5],
                                 "mrope_interleaved": True},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"])
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                  num_position_embeddings=64, deepstack_visual_indexes=[0, 1, 2])
    return transformers.Qwen3VLConfig(
        text_config=text, vision_config=vision, tie_word_embeddings=True,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])


# twin id (a family's id, or a variant of one: src/recipe/schema.ts TWIN_FAMILY):
# (tokenizer style, config fn, auto class, seed, generation eos tokens)
FAMILIES = {
    "qwen3": ("qwen", cfg_qwen3, "AutoModelForCausalLM", 3001, ["<|im_end|>", "<|endoftext|>"]),
    "qwen3_odd": ("qwen", cfg_qwen3_odd, "AutoModelForCausalLM", 3101, ["<|im_end|>", "<|endoftext|>"]),
    "qwen3_5": ("qwen", cfg_qwen3_5, "AutoModelForImageTextToText", 3501, ["<|im_end|>", "<|endoftext|>"]),
    "phimoe": ("phi", cfg_phimoe, "AutoModelForCausalLM", 4001, ["<|end|>", "<|endoftext|>"]),
    "gemma4": ("gemma", cfg_gemma4, "AutoModelForImageTextToText", 4401, ["<eos>", "<end_of_turn>"]),
    "qwen3_vl": ("qwen", cfg_qwen3_vl, "AutoModelForImageTextToText", 3301, ["<|im_end|>", "<|endoftext|>"]),
}


# The image processor a vision twin ships (preprocessor_config.json, what AutoImageProcessor
# loads): Qwen3-VL's (Qwen2VLImageProcessor: smart_resize to multiples of patch x merge, bicubic,
# rescale 1/255, mean = std = 0.5, patchify) at the twin's patch 16 / temporal 2 / merge 2, with
# pixel bounds scaled down from the real 65,536..16,777,216 to a tiny twin's pictures (64x64 ..
# 256x256; the tiny recipe's 96x128 lies inside).
PREPROCESSORS = {
    "qwen3_vl": {"image_processor_type": "Qwen2VLImageProcessor", "do_resize": True, "resample": 3,
                 "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
                 "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                 "size": {"shortest_edge": 64 * 64, "longest_edge": 256 * 256}},
}


def write_preprocessor(family, out_dir):
    """The family's preprocessor_config.json into out_dir and the image processor it loads as
    (None for a twin without one)."""
    if family not in PREPROCESSORS:
        return None
    with open(os.path.join(out_dir, "preprocessor_config.json"), "w") as f:
        f.write(json.dumps(PREPROCESSORS[family], indent=2, sort_keys=True) + "\n")
    return transformers.AutoImageProcessor.from_pretrained(out_dir)


# Fields the real hub config.json carries but transformers 5.23 folds into per_layer_config and
# no longer writes; added back so readers written against the real checkpoint find them.
CONFIG_FIXUPS = {"gemma4": {"text_config": {"global_head_dim": 64}}}


# ---- build, save, verify ------------------------------------------------------------------------

@torch.no_grad()
def perturb(model, seed):
    """Add seeded noise to every saved float tensor: HF init leaves norms at 0/1, biases at 0,
    dt_bias at 1, layer_scalar at 1; a twin must not hide a wrong (1+w) or a dropped bias."""
    g = torch.Generator().manual_seed(seed)
    saved = set(model.state_dict().keys())
    tensors = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers() if n in saved]
    for _, t in sorted(tensors, key=lambda nt: nt[0]):
        if t.is_floating_point() and torch.isfinite(t).all():
            std = 0.1 if t.dim() <= 1 else 0.02  # 1-D: norms, biases, gates, scalars
            t.add_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype) * std)


@torch.no_grad()
def trained_like_decay(model, seed):
    """GatedDeltaNet decay g = -exp(A_log)*softplus(a + dt_bias). HF's init (A up to 16, dt_bias 1)
    makes every head forget its state at each step (exp(g) ~ e^-20), which no trained model does:
    the readout then rests on one q.k product near zero and int8/fp16 noise dominates it. Draw
    dt_bias the way Mamba-style models are initialised and stay (dt in [1e-3, 1e-1], log-uniform),
    so state carries across steps as in a real checkpoint."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        if name.endswith("linear_attn.dt_bias"):
            u = torch.rand(p.shape, generator=g)
            dt = torch.exp(u * (math.log(1e-1) - math.log(1e-3)) + math.log(1e-3))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)


@torch.no_grad()
def finite_audio_clips(model, seed):
    """Gemma 4's audio linears clamp their input and output to recorded ranges; HF's init leaves
    them +-inf (no clamp at all, and perturb() skips them). The twin's audio tower is one forge
    builds, so fetch's NaN/Inf check reads these bounds and would refuse +-inf: set them to +-1e4,
    finite so a build has the clamps to make, wide so they cut nothing on the random tower."""
    del seed
    for name, b in sorted(model.named_buffers()):
        if name.startswith("model.audio_tower.") and name.rsplit(".", 1)[-1] in ("input_min", "output_min"):
            b.fill_(-1e4)
        elif name.startswith("model.audio_tower.") and name.rsplit(".", 1)[-1] in ("input_max", "output_max"):
            b.fill_(1e4)


DYNAMICS = {"qwen3_5": trained_like_decay, "gemma4": finite_audio_clips}


def build(family, tmp, steps):
    style_name, cfg_fn, auto_name, seed, gen_eos = FAMILIES[family]
    style = TOKENIZER_STYLES[style_name]
    tok = train_tokenizer(style)
    ids = {t: tok.convert_tokens_to_ids(t) for t in style["head"] + style["tail"]}
    config = cfg_fn(tok, ids)
    transformers.set_seed(seed)
    model = getattr(transformers, auto_name).from_config(config, dtype=torch.float32)
    perturb(model, seed + 1)
    if family in DYNAMICS:
        DYNAMICS[family](model, seed + 2)
    processor = write_preprocessor(family, tmp)  # before training: the vision twin learns from its pixels
    training = train(model, tok, family, seed + 3, steps, image_processor=processor)
    features = check_features(model)
    print(f"[{family}] trained: {training}; features: {features}", file=sys.stderr)
    gc = model.generation_config
    gc.eos_token_id = [tok.convert_tokens_to_ids(t) for t in gen_eos]
    gc.pad_token_id = tok.pad_token_id
    gc.bos_token_id = tok.bos_token_id
    gc.do_sample = False
    model.to(torch.bfloat16)  # real checkpoints ship bf16
    for key in config.sub_configs:  # to() only stamps the top-level config's dtype
        if getattr(config, key, None) is not None:
            getattr(config, key).dtype = torch.bfloat16
    model.save_pretrained(tmp)
    if family in CONFIG_FIXUPS:
        path = os.path.join(tmp, "config.json")
        with open(path) as f:
            saved = json.load(f)
        for section, extra in CONFIG_FIXUPS[family].items():
            saved[section].update(extra)
        with open(path, "w") as f:  # same layout transformers writes
            f.write(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(tmp, save_jinja_files=False)  # chat template inside tokenizer_config.json
    return model.state_dict(), {"training": training, "features": features}


@torch.no_grad()
def verify(family, tmp, saved_state):
    """Reload in fp32 with the auto class, check the round trip is exact, greedy-generate."""
    auto_name = FAMILIES[family][2]
    model, info = getattr(transformers, auto_name).from_pretrained(
        tmp, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}  # missing / unexpected / mismatched keys
    if bad:
        raise RuntimeError(f"reload reported {bad}")
    for name, t in model.state_dict().items():
        if name in saved_state and not torch.equal(t, saved_state[name].float()):
            raise RuntimeError(f"reloaded tensor {name} differs from the saved one")
    model.eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp)
    processor = transformers.AutoImageProcessor.from_pretrained(tmp) if family in PREPROCESSORS else None
    confidence = measure_confidence(model, tok, model.generation_config, processor, gemma4_images=family == "gemma4")
    m = confidence["margins"]
    print(f"[{family}] margins over {m['count']} greedy steps: min {m['min']} p5 {m['p5']} p50 {m['p50']}; "
          f"memorised {sum(p['memorised'] for p in confidence['prompts'])}/{m['count']}", file=sys.stderr)
    if m["min"] < confidence["margin_floor"]:
        worst = min(confidence["prompts"], key=lambda p: p["min_margin"])
        raise RuntimeError(f"the trained twin is not confident: smallest top-1/top-2 margin {m['min']} "
                           f"(after {worst['prompt'][:40]!r}) is under the floor {confidence['margin_floor']}")
    if "image_prompts" in confidence:  # a vision twin: confident image prompts, and each image its own answer
        im = confidence["image_margins"]
        for r in confidence["image_prompts"]:
            print(f"[{family}] {r['image']}: {r['continuation']!r} (min margin {r['min_margin']}, "
                  f"memorised {r['memorised']}/{r.get('new_tokens', confidence.get('image_new_tokens'))})",
                  file=sys.stderr)
        if im["min"] < confidence["margin_floor"]:
            worst = min(confidence["image_prompts"], key=lambda r: r["min_margin"])
            raise RuntimeError(f"the trained twin is not confident on its test images: smallest top-1/top-2 margin "
                               f"{im['min']} (after {worst['image']}) is under the floor {confidence['margin_floor']}")
        # gemma4: its two images must part at the first generated token (each caption names its colour first)
        first = family == "gemma4"
        seen = {}
        for r in confidence["image_prompts"]:
            key = tuple(r["tokens"][:1] if first else r["tokens"])
            if key in seen:
                raise RuntimeError(f"the twin does not see its images: test images {seen[key]} and {r['image']} give "
                                   f"the same {'first token' if first else 'continuation'} ({r['continuation']!r})")
            seen[key] = r["image"]
    for which, g in confidence.get("router_gaps", {}).items():
        if g["min"] < confidence["router_gap_floor"]:
            raise RuntimeError(f"the MoE twin's routing is on a knife edge: smallest router {which} logit gap "
                               f"{g['min']} is under the floor {confidence['router_gap_floor']}")
    return sum(p.numel() for p in model.parameters()), confidence



def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    ap.add_argument("--steps", type=int, help="training steps instead of the family's (tests: 0 makes "
                    "an untrained twin, which the confidence check must refuse)")
    args = ap.parse_args()
    out = os.path.abspath(args.out)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        sys.exit(f"make_twin: error: {out} exists and is not an empty directory")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    # Build beside DIR and rename at the end, so DIR is either absent or complete and verified.
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    try:
        state, made = build(args.family, tmp, args.steps)
        params, confidence = verify(args.family, tmp, state)
        twin = {"family": args.family, **made, **confidence}
        with open(os.path.join(tmp, "twin.json"), "w") as f:
            f.write(json.dumps(twin, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        files = {n: sha256(os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))}
        for n in files:  # safetensors writes 0600; make the twin readable like any checkout
            os.chmod(os.path.join(tmp, n), 0o644)
        os.chmod(tmp, 0o755)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.rename(tmp, out)
    except Exception as e:  # one clear line on stderr, non-zero exit, no half-written DIR
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"make_twin: error: {args.family}: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"family": args.family, "out": out, "files": files, "params": params,
                      "margins": twin["margins"], **({"router_gaps": twin["router_gaps"]} if "router_gaps" in twin else {})},
                     sort_keys=True))


if __name__ == "__main__":
    main()
