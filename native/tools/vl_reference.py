#!/usr/bin/env python3
"""HF's greedy continuation of an image + text prompt for a Qwen3-VL checkpoint: the reference that
`qhx_generate --image` on a forge bundle of that checkpoint must equal token for token.

    python native/tools/vl_reference.py --model CKPT --image FILE --size 96x128 --text "Describe" \\
        [--chat | --before TEXT] [--max-new-tokens 16] [--ignore-eos]

Inputs as Qwen3-VL's processor would give them at the recipe's fixed size:
  - pixel_values and image_grid_thw from oracles/pixels.py's reference_pixels(model, image, H, W)
    (PIL bicubic stretch to H x W, then the checkpoint's own image processor);
  - input_ids: plain, [vision_start] + [image_pad] x T + [vision_end] + tok(text) (what forge's
    oracle traces, and qhx_generate --image without --chat; --before puts tok(TEXT) ahead of it,
    to be fed to qhx_generate as --prompt-ids with --image); --chat: the tokenizer's chat template
    over one user turn [image, text] with the generation prompt, its <|image_pad|> expanded to T
    copies, tokenized (what Qwen3VLProcessor does);
  - mm_token_type_ids = (input_ids == image_token_id), attention_mask all ones.
model.generate (fp32, greedy). Prints one JSON line: {prompt_ids, generated_ids, margins (top-1 minus
top-2 logit at each step: random-weight twins have small ones), positions (get_rope_index's t, h, w
rows of the prompt), rope_delta}.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "oracles"))
import pixels  # noqa: E402


def prompt_ids(model, tok, text, tokens, chat, before=""):
    cfg = model.config
    if not chat:
        return (tok(before)["input_ids"] if before else []) + [cfg.vision_start_token_id] + [cfg.image_token_id] * tokens + [cfg.vision_end_token_id] + tok(text)["input_ids"]
    rendered = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
                                       add_generation_prompt=True, tokenize=False)
    pad = tok.convert_ids_to_tokens(cfg.image_token_id)
    if rendered.count(pad) != 1:
        raise ValueError(f"the chat template rendered {rendered.count(pad)} {pad} tokens for one image")
    return tok(rendered.replace(pad, pad * tokens), add_special_tokens=False)["input_ids"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF checkpoint directory (Qwen3VLForConditionalGeneration)")
    ap.add_argument("--image", required=True)
    ap.add_argument("--size", required=True, help="HxW, the recipe's image size (hostOpParams image_height x image_width)")
    ap.add_argument("--text", required=True)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--before", default="", help="plain prompts: text whose ids go before the image block (an image past the first prefill chunk)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--ignore-eos", action="store_true", help="no EOS stop (as qhx_generate --ignore-eos)")
    args = ap.parse_args()

    h, w = pixels.parse_size(args.size)
    torch.manual_seed(0)
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    pv, grid = pixels.reference_pixels(args.model, args.image, h, w)
    merge = model.config.vision_config.spatial_merge_size
    tokens = int(grid[0].prod()) // (merge * merge)
    ids = torch.tensor([prompt_ids(model, tok, args.text, tokens, args.chat, args.before)])
    mm = (ids == model.config.image_token_id).long()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        pos, delta = model.model.get_rope_index(ids, mm_token_type_ids=mm, image_grid_thw=grid, attention_mask=mask)
        gen = dict(max_new_tokens=args.max_new_tokens, do_sample=False, output_scores=True, return_dict_in_generate=True)
        if args.ignore_eos:
            gen["eos_token_id"] = -1  # no id is -1: nothing stops it before max_new_tokens
        out = model.generate(input_ids=ids, attention_mask=mask, pixel_values=pv, image_grid_thw=grid, mm_token_type_ids=mm, **gen)
    generated = out.sequences[0, ids.shape[1]:].tolist()
    margins = []
    for s in out.scores:
        top = torch.topk(s[0].float(), 2).values
        margins.append(round(float(top[0] - top[1]), 5))
    print(json.dumps({"prompt_ids": ids[0].tolist(), "generated_ids": generated, "margins": margins,
                      "positions": pos[:, 0, :].tolist(), "rope_delta": int(delta.reshape(-1)[0])}))


if __name__ == "__main__":
    main()
