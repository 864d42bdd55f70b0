"""A random-weight Gemma 4 checkpoint with a vision tower and HF's fp32 vision outputs on two images,
for the gemma4 vision graph test (test/gemma4-vision-graphs.test.ts): no twin, no training.

    python test/helpers/gemma4_vision_reference.py OUT_DIR

The tower is made to exercise everything the graph builds: 2 layers, standardize on, clipped linears
with ranges that clip (each linear's input and output ranges set to 80% of what it sees on the
first image), 2-D RoPE over
grids of different shapes. The images (a wide 150x330 and a tall 260x100 picture of noise and
shapes) go through HF's own Gemma 4 image processor (PIL backend) at a budget of 70 soft tokens, so
neither fills the 630 patches (padding rows in every tensor).

Writes OUT_DIR/ckpt (config.json + model.safetensors, bf16 as real checkpoints ship) and a trace
directory OUT_DIR/trace in the oracle trace's layout for image prompts (trace.json with two prompts
carrying an "image" record, trace.safetensors with p{i}/vision.pixels, vision.positions,
vision.embed, vision.block.{j}, vision.tokens), captured by the trace's own hooks
(oracles/trace_families.py steps_gemma4). Prints one JSON line: per image its real patches and soft
tokens. OUT_DIR/sim-feeds.safetensors holds the two images as cases for oracles/qnn_simulate.py.
"""
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image, ImageDraw  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "oracles"))
import trace_families  # noqa: E402

PAD, BOI, EOI, IMAGE = 0, 290, 291, 292


def picture(h, w, seed):
    rng = np.random.default_rng(seed)
    im = Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
        d.ellipse([x0, y0, x0 + 30, y0 + 25], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return im


class Ctx:
    def __init__(self, model):
        self.model, self.layers, self.vision, self.step = model, model.get_decoder().layers, None, {}

    def put(self, name, t):
        self.step[name] = t


def main(out):
    torch.manual_seed(11)
    S, F = "sliding_attention", "full_attention"
    text = dict(vocab_size=300, vocab_size_per_layer_input=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                layer_types=[S, F], num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
                sliding_window=16, num_kv_shared_layers=0, hidden_size_per_layer_input=8, final_logit_softcapping=30.0,
                rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=PAD,
                rope_parameters={S: {"rope_type": "default", "rope_theta": 1e4},
                                 F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}})
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                  head_dim=24, patch_size=16, position_embedding_size=64, pooling_kernel_size=3, standardize=True,
                  use_clipped_linears=True)
    cfg = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None, tie_word_embeddings=True,
                                    boi_token_id=BOI, eoi_token_id=EOI, image_token_id=IMAGE)
    model = transformers.Gemma4ForConditionalGeneration(cfg).eval()
    tower = model.model.vision_tower
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape) * 0.1)  # norms away from 1, tables away from their init
        tower.std_bias.copy_(torch.randn(48) * 0.5)
        tower.std_scale.copy_(1 + torch.rand(48))
    images = [picture(150, 330, 1), picture(260, 100, 2)]
    processor = Gemma4ImageProcessorPil(max_soft_tokens=70)
    feeds = [processor(im, return_tensors="pt") for im in images]

    # Clip ranges that bite: each linear's observed input/output range on the first image, narrowed to 80%.
    seen = {}
    hooks = []
    for name, mod in tower.named_modules():
        if isinstance(mod, transformers.models.gemma4.modeling_gemma4.Gemma4ClippableLinear):
            def keep(_m, args, out, name=name):  # returns None: the output stays HF's
                seen.setdefault(name, (args[0].detach(), out.detach()))
            hooks.append(mod.register_forward_hook(keep))
    with torch.no_grad():
        model.model.get_image_features(feeds[0]["pixel_values"], feeds[0]["image_position_ids"])
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for name, mod in tower.named_modules():
            if name in seen:
                x, y = seen[name]
                mod.input_min.fill_(float(x.min()) * 0.8)
                mod.input_max.fill_(float(x.max()) * 0.8)
                mod.output_min.fill_(float(y.min()) * 0.8)
                mod.output_max.fill_(float(y.max()) * 0.8)
    model.to(torch.bfloat16)
    ckpt = os.path.join(out, "ckpt")
    model.save_pretrained(ckpt)
    model = transformers.Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()

    ctx = Ctx(model)
    trace_families.hooks_gemma4_media(ctx)
    tensors, prompts, about = {}, [], []
    for i, f in enumerate(feeds):
        n = int(f["num_soft_tokens_per_image"][0])
        ids = [BOI] + [IMAGE] * n + [EOI, 5, 6]
        with torch.no_grad():
            captured, _ = trace_families.steps_gemma4(ctx, ids, {"image": {"pixel_values": f["pixel_values"], "image_position_ids": f["image_position_ids"]}})
        for name, v in captured.items():
            tensors[f"p{i}/{name}"] = v.float().contiguous() if v.is_floating_point() else v.to(torch.int64).contiguous()
        real = int((f["image_position_ids"][0, :, 0] >= 0).sum())
        prompts.append({"text": "", "prompt_tokens": ids, "generated": [], "runner_up": [], "margins": [], "steps": 0,
                        "image": {"file": f"image{i}.png", "sha256": "", "size": list(images[i].size[::-1]), "grid": [1, 0, 0],
                                  "tokens": n, "start": 1}})
        about.append({"patches": real, "tokens": n})
    trace = os.path.join(out, "trace")
    os.makedirs(trace)
    save_file(tensors, os.path.join(trace, "trace.safetensors"), metadata={"format": "pt"})
    meta = {"family": "gemma4", "layers": 2, "hidden": 64, "vocab": 300, "kv_heads": 1, "head_dim": 32, "max_context": 64,
            "new_tokens": 0, "prompts": prompts, "tensors": "trace.safetensors"}
    with open(os.path.join(trace, "trace.json"), "w") as fh:
        json.dump(meta, fh)
    # The same two images as cases for oracles/qnn_simulate.py (case/<input>, int32 positions).
    sim = {}
    for i in range(len(feeds)):
        sim[f"{i}/pixel_values"] = tensors[f"p{i}/vision.pixels"]
        sim[f"{i}/pixel_position_ids"] = tensors[f"p{i}/vision.positions"].to(torch.int32).contiguous()
    save_file(sim, os.path.join(out, "sim-feeds.safetensors"), metadata={"cases": str(len(feeds))})
    # The same two images as cases for oracles/qnn_simulate.py (case/<input>, int32 positions).
    sim = {}
    for i in range(len(feeds)):
        sim[f"{i}/pixel_values"] = tensors[f"p{i}/vision.pixels"]
        sim[f"{i}/pixel_position_ids"] = tensors[f"p{i}/vision.positions"].to(torch.int32).contiguous()
    save_file(sim, os.path.join(out, "sim-feeds.safetensors"), metadata={"cases": str(len(feeds))})
    print(json.dumps({"images": about}))


if __name__ == "__main__":
    main(sys.argv[1])
