"""The tiny-gemma4 twin with an audio tower Hugging Face can run, for test/gemma4-media-oracle.test.ts.

    python test/helpers/gemma4_audio_twin.py TWIN_DIR OUT_DIR

The twin's own audio_config has subsampling_conv_channels [8, 4]: HF's subsampling Linear is then
built for (8 // 4) * 4 = 8 inputs but gets (128 mel bins / 4) * 4 = 128, so HF's audio forward fails
on the twin (forge refuses it, naming audio_config.subsampling_conv_channels). This copy keeps every
other weight and the tokenizer of the twin and gives it a random audio tower of channels [128, 4]
and a random embed_audio (seeded; every parameter moved off HF's init so norms are not all 1 and
biases not 0; clip bounds finite, ±1e4, cutting nothing), saved in bf16 like the twin. Untrained, like
the twin's vision tower: only fp32 figures mean anything on it.
"""
import os
import shutil
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import torch  # noqa: E402
import transformers  # noqa: E402

AUDIO = ("model.audio_tower.", "model.embed_audio.")


def main(src, out):
    torch.manual_seed(29)
    cfg = transformers.AutoConfig.from_pretrained(src)
    cfg.audio_config.subsampling_conv_channels = [128, 4]
    twin = transformers.AutoModelForImageTextToText.from_pretrained(src, dtype=torch.float32)
    model = transformers.AutoModelForImageTextToText.from_config(cfg).eval()
    kept = {k: v for k, v in twin.state_dict().items() if not k.startswith(AUDIO)}
    missing, unexpected = model.load_state_dict(kept, strict=False)
    if unexpected or any(not k.startswith(AUDIO) for k in missing):
        raise SystemExit(f"gemma4_audio_twin: the twin's weights do not fit: unexpected {unexpected[:3]}, "
                         f"missing {[k for k in missing if not k.startswith(AUDIO)][:3]}")
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.startswith(AUDIO):
                p.add_(torch.randn(p.shape) * 0.1)
        for name, b in model.named_buffers():
            if name.startswith(AUDIO) and name.rsplit(".", 1)[-1] in ("input_min", "output_min"):
                b.fill_(-1e4)
            elif name.startswith(AUDIO) and name.rsplit(".", 1)[-1] in ("input_max", "output_max"):
                b.fill_(1e4)
    model.to(torch.bfloat16).save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copyfile(os.path.join(src, f), os.path.join(out, f))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
