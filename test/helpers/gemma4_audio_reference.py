"""A random-weight Gemma-4 checkpoint with a small audio tower, and HF's fp32 audio outputs on it, for
the audio encoder graph's tests (test/gemma4-audio-graphs.test.ts): no training, seconds to make.

    python test/helpers/gemma4_audio_reference.py OUT_DIR
    python test/helpers/gemma4_audio_reference.py OUT_DIR --e4b   # sizes only: see the end of this file

Writes OUT_DIR/ckpt (config.json + model.safetensors, bf16 as real checkpoints ship; the whole
Gemma4ForConditionalGeneration, so tensor names are the real `model.audio_tower.…` / `model.embed_audio.…`)
and OUT_DIR/reference.safetensors: features [FRAMES, 128] (random log-mel-like values), mask [FRAMES]
(1 for the first VALID frames, 0 for the padded tail), HF's subsampled embedding `embed` [T, H], each
layer's output `layer.i` [T, H], the output projection `encoder` [T, P] and the soft tokens after
embed_audio `tokens` [T, TEXT] (T = FRAMES / 4; rows past HF's output mask are padding), and
`valid` [T] (HF's output mask as 0/1).

The clipped linears' input/output bounds are set to 0.6-0.8 of the range each one sees in a first
pass, so every clamp cuts values and a graph that skipped them would not match.
"""
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

FRAMES, VALID = 64, 53  # 16 tokens (4 chunks of 4), of which ceil(53/4) = 14 are valid
AUDIO = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, subsampling_conv_channels=[128, 8],
             conv_kernel_size=5, attention_chunk_size=4, attention_context_left=5, attention_context_right=0,
             attention_logit_cap=50.0, output_proj_dims=48, rms_norm_eps=1e-6, hidden_act="silu")
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, global_head_dim=32, vocab_size_per_layer_input=300,
            hidden_size_per_layer_input=8, layer_types=["full_attention"])


def main(out):
    torch.manual_seed(11)
    cfg = transformers.Gemma4Config(text_config=TEXT, audio_config=AUDIO, vision_config=None)
    model = transformers.Gemma4ForConditionalGeneration(cfg).eval()
    tower = model.model.audio_tower
    with torch.no_grad():
        for _, p in sorted(tower.named_parameters()):
            p.add_(torch.randn(p.shape) * 0.1)  # norms, scales and biases away from 1 and 0
        for _, p in sorted(model.model.embed_audio.named_parameters()):
            p.add_(torch.randn(p.shape) * 0.1)
    features = torch.randn(1, FRAMES, 128) * 2.0 - 4.0
    mask = torch.zeros(1, FRAMES, dtype=torch.bool)
    mask[:, :VALID] = True

    # The ranges each clipped linear sees, then bounds inside them.
    clipped = [m for m in tower.modules() if isinstance(m, transformers.models.gemma4.modeling_gemma4.Gemma4ClippableLinear)]
    seen = {}
    hooks = [m.register_forward_hook(lambda m, i, o: seen.__setitem__(m, (i[0].detach(), o.detach()))) for m in clipped]
    with torch.no_grad():
        tower(features, mask)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        for m in clipped:
            x, y = seen[m]
            m.input_min.fill_(float(x.min()) * 0.7)
            m.input_max.fill_(float(x.max()) * 0.6)
            m.output_min.fill_(float(y.min()) * 0.8)
            m.output_max.fill_(float(y.max()) * 0.7)

    model.to(torch.bfloat16)
    model.save_pretrained(os.path.join(out, "ckpt"))
    model = transformers.Gemma4ForConditionalGeneration.from_pretrained(os.path.join(out, "ckpt"), dtype=torch.float32).eval()
    tower = model.model.audio_tower

    ref = {"features": features[0], "mask": mask[0].float()}
    with torch.no_grad():
        layers = []
        hooks = [layer.register_forward_hook(lambda _m, _i, o: layers.append(o)) for layer in tower.layers]
        embed = []
        hooks.append(tower.subsample_conv_projection.register_forward_hook(lambda _m, _i, o: embed.append(o[0])))
        got = model.model.get_audio_features(features, mask, return_dict=True)
        for h in hooks:
            h.remove()
        ref["embed"] = embed[0][0]
        for i, h in enumerate(layers):
            ref[f"layer.{i}"] = h[0]
        ref["encoder"] = got.last_hidden_state[0]
        ref["tokens"] = got.pooler_output[0]
        ref["valid"] = got.attention_mask[0].float()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))


def e4b(out):
    """A random checkpoint with Gemma-4-E4B's audio tower (Gemma4AudioConfig's defaults) and its text
    width 2560 (one tiny text layer), for measuring the encoder graph's size; no reference outputs."""
    text = dict(TEXT, hidden_size=2560)
    cfg = transformers.Gemma4Config(text_config=text, audio_config={}, vision_config=None)
    model = transformers.Gemma4ForConditionalGeneration(cfg).eval().to(torch.bfloat16)
    n = sum(p.numel() for k, p in model.named_parameters() if "audio" in k)
    print(f"audio parameters (tower + embed_audio): {n}")
    model.save_pretrained(os.path.join(out, "ckpt"))


if __name__ == "__main__":
    (e4b if sys.argv[2:] == ["--e4b"] else main)(sys.argv[1])
