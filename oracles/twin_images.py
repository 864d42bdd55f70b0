#!/usr/bin/env python3
"""Images made by code for the vision twins: a coloured shape on a plain background.

    python oracles/twin_images.py --out DIR        # writes the test images, prints their names

Everything is drawn with PIL's ImageDraw (no fonts, no files read), so the same call gives the
same pixels, and the same PNG / JPEG bytes with one Pillow build.

render(shape, colour, background, width, height, ...) draws one picture at any size; caption(...)
is the text the qwen3_vl twin is trained to say after IMAGE_PROMPT when it sees that picture
(oracles/twin_training.py), and TEST_IMAGES the fixed set of files the tests and recipes trace:
PNG and JPEG, square and not, at the tiny recipe's size (height 96 x width 128) and not (forge's
runtime and oracles/pixels.py stretch every image to the recipe's size).
"""
import argparse
import io
import json
import os

from PIL import Image, ImageDraw

COLOURS = {"red": (220, 32, 32), "green": (24, 168, 56), "blue": (32, 64, 224), "yellow": (240, 208, 24)}
BACKGROUNDS = {"white": (255, 255, 255), "black": (0, 0, 0)}
SHAPES = ("circle", "square", "triangle", "cross")

# The text prompt after the image tokens, and what the twin says after it: the colour and shape
# first (so two pictures part at the first generated token), then a fixed sentence long enough for
# a traced continuation of 16+ confident tokens.
IMAGE_PROMPT = "This picture shows a"
# The tiny recipe's image size (height, width): a 6 x 8 patch grid of 16 px, 3 x 4 = 12 image tokens.
IMAGE_SIZE = (96, 128)


def caption(shape, colour, background):
    return (f" {colour} {shape} on a {background} background. The {colour} {shape} is the only "
            f"thing in the picture.")


# name -> (shape, colour, background, width, height): the test images. red-circle is 200x150 (4:3,
# not the recipe's size), blue-square 96x96 (square: stretched to 4:3), green-triangle 128x96 (the
# tiny recipe's size exactly), yellow-cross 120x160 (portrait).
TEST_IMAGES = {
    "red-circle.png": ("circle", "red", "white", 200, 150),
    "blue-square.jpg": ("square", "blue", "white", 96, 96),
    "green-triangle.png": ("triangle", "green", "black", 128, 96),
    "yellow-cross.jpg": ("cross", "yellow", "black", 120, 160),
}
# The gemma4 twin's pictures (oracles/twin_training.py): it learns to caption these two only, at
# Gemma 4's aspect-preserving resize within GEMMA4_IMAGE_TOKENS soft tokens (the recipes' budget):
# 4:3 and square, two grids (21 x 27 and 24 x 24 patches), 63 and 64 soft tokens.
GEMMA4_TEST_IMAGES = ("red-circle.png", "blue-square.jpg")
GEMMA4_IMAGE_TOKENS = 70
JPEG_QUALITY = 90
# Where training_images() draws each shape: (centre x, centre y, half-size), fractions of the picture.
PLACEMENTS = [(0.5, 0.5, 0.34), (0.4, 0.45, 0.28), (0.6, 0.55, 0.3)]


def render(shape, colour, background, width, height, cx=0.5, cy=0.5, scale=0.34):
    """One shape, centred at (cx, cy) (fractions of the picture) with a half-size of scale x the
    shorter side, in colour on background; RGB."""
    img = Image.new("RGB", (width, height), BACKGROUNDS[background])
    d = ImageDraw.Draw(img)
    fill = COLOURS[colour]
    x, y, r = cx * width, cy * height, scale * min(width, height)
    if shape == "circle":
        d.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif shape == "square":
        d.rectangle([x - r, y - r, x + r, y + r], fill=fill)
    elif shape == "triangle":
        d.polygon([(x, y - r), (x + r, y + r), (x - r, y + r)], fill=fill)
    elif shape == "cross":
        t = r / 3
        d.rectangle([x - r, y - t, x + r, y + t], fill=fill)
        d.rectangle([x - t, y - r, x + t, y + r], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    return img


def encode(img, name):
    """The file bytes for name's extension: PNG (lossless) or JPEG (quality 90, 4:2:0)."""
    buf = io.BytesIO()
    if name.endswith(".png"):
        img.save(buf, format="PNG", optimize=False, compress_level=6)
    elif name.endswith((".jpg", ".jpeg")):
        img.save(buf, format="JPEG", quality=JPEG_QUALITY, subsampling=2, optimize=False)
    else:
        raise ValueError(f"{name}: only .png and .jpg")
    return buf.getvalue()


def test_image_bytes(name):
    shape, colour, background, w, h = TEST_IMAGES[name]
    return encode(render(shape, colour, background, w, h), name)


def test_caption(name):
    shape, colour, background, _, _ = TEST_IMAGES[name]
    return caption(shape, colour, background)


def write_test_images(out_dir):
    """Writes every TEST_IMAGES file into out_dir; returns {name: path}."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name in TEST_IMAGES:
        path = os.path.join(out_dir, name)
        with open(path, "wb") as f:
            f.write(test_image_bytes(name))
        paths[name] = path
    return paths


def training_images():
    """(PIL image, caption, name) for the qwen3_vl twin's image training, in a fixed order, no
    randomness: every shape x colour x background at each of PLACEMENTS, rendered at one of the
    test images' source sizes (the pixels are later stretched to the recipe's size, as the trace
    does), captioned with the first sentence only (what the picture decides; the second repeats
    it); then the test images through their own PNG / JPEG bytes with the whole caption."""
    out = []
    sizes = [(w, h) for _, _, _, w, h in TEST_IMAGES.values()]
    k = 0
    for cx, cy, s in PLACEMENTS:
        for shape in SHAPES:
            for colour in COLOURS:
                for background in BACKGROUNDS:
                    w, h = sizes[k % len(sizes)]
                    k += 1
                    first = caption(shape, colour, background).split(".")[0] + "."
                    out.append((render(shape, colour, background, w, h, cx, cy, s), first,
                                f"{colour}-{shape}-on-{background}"))
    for name in TEST_IMAGES:
        img = Image.open(io.BytesIO(test_image_bytes(name)))
        img.load()
        out.append((img, test_caption(name), name))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory to write the test images into")
    args = ap.parse_args()
    paths = write_test_images(args.out)
    print(json.dumps({"out": os.path.abspath(args.out), "images": sorted(paths), "prompt": IMAGE_PROMPT,
                      "captions": {n: test_caption(n) for n in sorted(paths)}}, sort_keys=True))


if __name__ == "__main__":
    main()
