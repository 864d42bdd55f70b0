"""Test images for the image-input tests (test/image-input.test.ts, test/gemma4-image-input.test.ts):
photo-like scenes drawn with PIL, and PNGs written chunk by chunk in the forms Pillow cannot save
(16-bit RGB(A), 1/2/4-bit grey, tRNS, interlaced, ...). Imported by the tests' generator scripts."""
import struct
import zlib

import numpy as np
from PIL import Image, ImageDraw


def scene(w, h, seed):
    """A w x h RGB image: smooth colour, noise, and sharp-edged rectangles and lines (where the
    bicubic kernel overshoots, so where resizers differ most). Needs w, h >= 9."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([127 + 100 * np.sin(x / 37.0) * np.cos(y / 23.0), 255 * (x / w) * (y / h), 127 + 120 * np.sin((x + y) / 11.0)], -1)
    im = Image.fromarray(np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8))
    d = ImageDraw.Draw(im)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
        d.rectangle([x0, y0, x0 + int(rng.integers(4, max(5, w // 6))), y0 + int(rng.integers(4, max(5, h // 6)))], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        d.line([int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(0, w)), int(rng.integers(0, h))], fill=(255, 255, 255), width=2)
    return im


def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data) & 0xffffffff)


def pack_rows(a, depth):
    if depth == 16: return [r.astype('>u2').tobytes() for r in a]
    if depth == 8: return [r.astype(np.uint8).tobytes() for r in a]
    return [np.packbits(np.unpackbits(r.astype(np.uint8)[:, None], axis=1)[:, 8 - depth:].ravel()).tobytes() for r in a]


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png(path, samples, ctype, depth, plte=None, trns=None, interlace=False):
    """A PNG of samples [h, w(, channels)] at colour type ctype and bit depth depth, as given."""
    h, w = samples.shape[:2]
    raw = b''
    for x0, y0, dx, dy in (ADAM7 if interlace else [(0, 0, 1, 1)]):
        sub = samples[y0::dy, x0::dx]
        if sub.size:
            raw += b''.join(b'\x00' + r for r in pack_rows(sub.reshape(sub.shape[0], -1), depth))
    png = b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, depth, ctype, 0, 0, 1 if interlace else 0))
    if plte is not None: png += chunk(b'PLTE', bytes(np.asarray(plte, np.uint8).ravel()))
    if trns is not None: png += chunk(b'tRNS', trns)
    open(path, 'wb').write(png + chunk(b'IDAT', zlib.compress(raw, 6)) + chunk(b'IEND', b''))
