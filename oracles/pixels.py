#!/usr/bin/env python3
"""HF's pixels for one image file at a recipe's fixed size: the reference for forge's C++
pre-processing (decode, resize, rescale, normalise, patchify).

    python oracles/pixels.py --model DIR --image FILE --size HxW --out FILE.bin

reference_pixels(model_dir, image_path, height, width) -> (pixel_values, image_grid_thw):
  1. PIL opens the file and converts it to RGB as HF's processor does (transparency onto white);
  2. an image whose size is not width x height is stretched to it with PIL's
     Image.resize((width, height), Image.BICUBIC) (forge's runtime stretches every image to the
     recipe's size, aspect ratio not kept; the model card says so);
  3. the checkpoint's own image processor (transformers.AutoImageProcessor.from_pretrained(model_dir);
     without torchvision that is the PIL backend, e.g. Qwen2VLImageProcessorPil) with
     min_pixels = max_pixels = height x width, so its smart_resize keeps height x width: rescale
     1/255, normalise with its mean/std, patchify into [patches, C*T*P*P] rows (a still image
     repeated over the temporal patch, 2x2 merge blocks contiguous).
pixel_values is float32 [grid_h*grid_w, C*T*P*P], image_grid_thw int64 [1, 3] = [[1, H/P, W/P]]; a
size the processor would change (not a multiple of patch x merge) is a ValueError naming the file.
The CLI writes pixel_values as raw little-endian float32 (row-major) and prints one JSON line
{"patches", "patch_dim", "grid": [t, h, w]}.
"""
import argparse
import hashlib
import json
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from transformers.image_transforms import convert_to_rgb  # noqa: E402


def open_rgb(image_path):
    """The file as an RGB PIL image as HF's processor converts it (transparency composited onto
    white, not dropped: transformers.image_transforms.convert_to_rgb); one ValueError naming the
    file when PIL cannot read it."""
    try:
        with Image.open(image_path) as img:
            img.load()
            return Image.fromarray(convert_to_rgb(img, return_numpy=True))
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"cannot read image {image_path}: {type(e).__name__}: {e}") from None


def stretch(img, height, width):
    """The recipe's size: PIL bicubic to (width, height) when the image is not that size already."""
    if img.size != (width, height):
        img = img.resize((width, height), Image.BICUBIC)
    return img


def processor_pixels(processor, img, height, width, what):
    """processor's pixels for an RGB image already height x width, with smart_resize pinned to
    height x width; refuses a grid that is not [1, height/P, width/P]."""
    pixels = height * width
    out = processor(images=[img], size={"shortest_edge": pixels, "longest_edge": pixels}, return_tensors="pt")
    pv, grid = out["pixel_values"], out["image_grid_thw"]
    p = processor.patch_size
    want = [1, height // p, width // p]
    if grid.tolist() != [want] or height % p or width % p:
        raise ValueError(f"{what}: at {height}x{width} the image processor gives grid {grid.tolist()}, not "
                         f"[{want}] (the size must be a multiple of patch {p} x merge {processor.merge_size})")
    return pv.to(torch.float32).contiguous(), grid.to(torch.int64)


def image_processor(model_dir):
    return transformers.AutoImageProcessor.from_pretrained(model_dir)


def reference_pixels(model_dir, image_path, height, width):
    """(pixel_values float32 [patches, C*T*P*P], image_grid_thw int64 [1, 3]) of image_path at
    height x width, as the module docstring says."""
    img = stretch(open_rgb(image_path), height, width)
    return processor_pixels(image_processor(model_dir), img, height, width, image_path)


def image_prompt_ids(config, tok, grid, text):
    """The token ids of an image prompt as forge traces and its runtime feeds them: <|vision_start|>,
    one <|image_pad|> per merged patch (grid t*h*w / merge^2), <|vision_end|>, then the text's ids."""
    merge = config.vision_config.spatial_merge_size
    n = int(grid[0] * grid[1] * grid[2]) // (merge * merge)
    return ([config.vision_start_token_id] + [config.image_token_id] * n + [config.vision_end_token_id]
            + tok(text)["input_ids"])


def image_prompt(model_dir, config, tok, image_path, text, height, width):
    """An image input of trace.py: (pixel_values, image_grid_thw), its prompt ids, and the record
    trace.json keeps of it {file, sha256, size, grid, tokens, start}. OSError/ValueError name the file."""
    pv, grid = reference_pixels(model_dir, image_path, height, width)
    with open(image_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    ids = image_prompt_ids(config, tok, grid[0].tolist(), text)
    start = ids.index(config.image_token_id)
    return (pv, grid), ids, {"file": os.path.basename(image_path), "sha256": digest, "size": [height, width],
                             "grid": grid[0].tolist(), "tokens": ids.count(config.image_token_id), "start": start}


def gemma4_pixels(config, image_path, max_soft_tokens):
    """HF's Gemma 4 image processor (PIL backend) on image_path at a budget of max_soft_tokens, with
    the checkpoint's patch and pooling sizes: (pixel_values [1, P, 3*p*p] float32, image_position_ids
    [1, P, 2] int64, soft tokens). The image keeps its aspect ratio; P = max_soft_tokens * k^2."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
    vc = config.vision_config
    processor = Gemma4ImageProcessorPil(max_soft_tokens=max_soft_tokens, patch_size=vc.patch_size,
                                        pooling_kernel_size=vc.pooling_kernel_size)
    out = processor(open_rgb(image_path), return_tensors="pt")
    return (out["pixel_values"].to(torch.float32).contiguous(), out["image_position_ids"].to(torch.int64).contiguous(),
            int(out["num_soft_tokens_per_image"][0]))


def gemma4_image_prompt_ids(config, tok, n, text):
    """A Gemma 4 image prompt's ids: the text's with the image's block after its BOS:
    <start_of_image>, n image tokens, <end_of_image>."""
    text_ids = tok(text)["input_ids"]
    head = text_ids[:1] if text_ids and text_ids[0] == tok.bos_token_id else []
    return head + [config.boi_token_id] + [config.image_token_id] * n + [config.eoi_token_id] + text_ids[len(head):]


def gemma4_image_prompt(config, tok, image_path, text, max_soft_tokens):
    """A Gemma 4 image input of trace.py: {"image": {pixel_values, image_position_ids}} (what
    trace_families.steps_gemma4 takes), the prompt ids and trace.json's record of it. The ids are the
    text's with the image's block after its BOS: <start_of_image>, one image token per soft token,
    <end_of_image> (the processor's expansion of the image placeholder). The record's size is the
    resized image (height, width) and grid [1, rows, cols] of patches. OSError/ValueError name the file."""
    pv, pos, n = gemma4_pixels(config, image_path, max_soft_tokens)
    with open(image_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    ids = gemma4_image_prompt_ids(config, tok, n, text)
    real = pos[0][pos[0][:, 0] >= 0]
    cols, rows = int(real[:, 0].max()) + 1, int(real[:, 1].max()) + 1
    p = config.vision_config.patch_size
    record = {"file": os.path.basename(image_path), "sha256": digest, "size": [rows * p, cols * p],
              "grid": [1, rows, cols], "tokens": n, "start": ids.index(config.image_token_id)}
    return {"image": {"pixel_values": pv, "image_position_ids": pos}}, ids, record


def parse_size(text):
    """'HxW' -> (H, W), positive integers."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"size {text!r} is not HxW (e.g. 96x128)") from None
    if h <= 0 or w <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return h, w


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="HF checkpoint directory (its preprocessor_config.json)")
    ap.add_argument("--image", required=True, help="image file (anything PIL reads)")
    ap.add_argument("--size", required=True, help="HxW, the recipe's image size, e.g. 96x128")
    ap.add_argument("--out", required=True, help="raw little-endian float32 pixel_values")
    args = ap.parse_args()
    try:
        h, w = parse_size(args.size)
        pv, grid = reference_pixels(args.model, args.image, h, w)
        with open(args.out, "wb") as f:
            f.write(pv.numpy().astype("<f4", copy=False).tobytes())
    except Exception as e:  # one line: the file, and what is wrong with it
        print(f"pixels: error: {type(e).__name__}: {e}" if not isinstance(e, ValueError) else f"pixels: error: {e}",
              file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"patches": pv.shape[0], "patch_dim": pv.shape[1], "grid": grid[0].tolist()}))


if __name__ == "__main__":
    main()
