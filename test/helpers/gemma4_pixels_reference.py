"""HF's Gemma 4 image pre-processing of test images: the reference test/gemma4-image-input.test.ts
holds qhx_pixels --soft-tokens to.

    gemma4_pixels_reference.py OUT_DIR PATCH POOLING JOBS

JOBS is a JSON list of [image file, max_soft_tokens]. Each job runs oracles/pixels.py's
gemma4_pixels (transformers' Gemma4ImageProcessorPil on the file converted to RGB as HF converts it)
with a config that holds only what it reads (vision_config.patch_size, pooling_kernel_size: no
checkpoint needed) and writes OUT_DIR/<file name>.<budget>.hf.bin (pixel_values, float32 [P, 3*p*p])
and .pos.bin (image_position_ids as int32 [P, 2]). Prints one JSON object {"<file name>.<budget>":
{"patches", "patch_dim", "soft_tokens", "size": [h, w] resized (from the real positions),
"source": [h, w] as opened}}.
"""
import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'oracles'))
import pixels  # noqa: E402
from PIL import Image  # noqa: E402


def main():
    out, patch, pooling, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
    config = SimpleNamespace(vision_config=SimpleNamespace(patch_size=patch, pooling_kernel_size=pooling))
    res = {}
    for path, budget in jobs:
        key = f'{os.path.basename(path)}.{budget}'
        pv, pos, n = pixels.gemma4_pixels(config, path, budget)
        pv, pos = pv[0].numpy(), pos[0].numpy()
        pv.astype('<f4').tofile(os.path.join(out, f'{key}.hf.bin'))
        pos.astype('<i4').tofile(os.path.join(out, f'{key}.pos.bin'))
        real = pos[pos[:, 0] >= 0]
        with Image.open(path) as im:
            w, h = im.size
        res[key] = {'patches': int(pv.shape[0]), 'patch_dim': int(pv.shape[1]), 'soft_tokens': n,
                    'size': [int(real[:, 1].max() + 1) * patch, int(real[:, 0].max() + 1) * patch], 'source': [h, w]}
    print(json.dumps(res))


if __name__ == '__main__':
    main()
