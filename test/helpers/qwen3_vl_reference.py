"""A random-weight Qwen3-VL checkpoint and HF's fp32 outputs on it, for the qwen3_vl family's graph
tests (test/qwen3-vl-graphs.test.ts): no twin, no training, seconds to make.

    python test/helpers/qwen3_vl_reference.py OUT_DIR

Writes OUT_DIR/ckpt (config.json + model.safetensors, bf16 as real checkpoints ship) and
OUT_DIR/reference.safetensors: pixels [48, 1536] (a 96x128 image's patches), HF's vision outputs
(merged [12, 64], deepstack.k [12, 64], block.j [48, 32]), a prompt of 17 tokens (vision_start,
12 image tokens, vision_end, 3 text tokens) with HF's M-RoPE positions mrope [3, 17], the
embedding rows with the image rows spliced in (embeds [17, 64]), each DeepStack feature scattered to
the prompt's positions (ds.k [17, 64]), and the last hidden state after the final norm
(final [17, 64]); then one greedy decode step after the prompt: its token, position (mrope_next [3])
and final hidden (final_next [64]).
"""
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

IMAGE, START, END = 290, 292, 293


def main(out):
    torch.manual_seed(7)
    text = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=4096,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [6, 5, 5], "mrope_interleaved": True})
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, temporal_patch_size=2,
                  spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=64, deepstack_visual_indexes=[0, 1, 2])
    cfg = transformers.Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, image_token_id=IMAGE,
                                     video_token_id=291, vision_start_token_id=START, vision_end_token_id=END)
    model = transformers.Qwen3VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape) * 0.1)  # norms and biases away from 1 and 0
    model.to(torch.bfloat16)
    model.save_pretrained(os.path.join(out, "ckpt"))
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(os.path.join(out, "ckpt"), dtype=torch.float32).eval()

    pixels = torch.randn(48, 1536)
    grid = torch.tensor([[1, 6, 8]])
    ids = torch.tensor([[START] + [IMAGE] * 12 + [END, 5, 6, 7]])
    types = (ids == IMAGE).long()
    ones = torch.ones_like(ids)
    ref = {"pixels": pixels}
    with torch.no_grad():
        blocks = []
        hooks = [b.register_forward_hook(lambda _m, _i, o: blocks.append(o)) for b in model.model.visual.blocks]
        vis = model.model.visual(pixels, grid_thw=grid)
        for h in hooks:
            h.remove()
        ref["merged"] = vis.pooler_output
        for j, b in enumerate(blocks):
            ref[f"block.{j}"] = b
        embeds = model.model.language_model.embed_tokens(ids)[0]
        embeds[ids[0] == IMAGE] = vis.pooler_output
        ref["embeds"] = embeds
        for k, d in enumerate(vis.deepstack_features):
            ref[f"deepstack.{k}"] = d
            full = torch.zeros(17, 64)
            full[ids[0] == IMAGE] = d
            ref[f"ds.{k}"] = full
        pos, delta = model.model.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=grid, attention_mask=ones)
        ref["mrope"] = pos[:, 0, :].to(torch.int32)
        out1 = model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, attention_mask=ones, mm_token_type_ids=types,
                     output_hidden_states=True, use_cache=True)
        ref["final"] = out1.hidden_states[-1][0]
        nxt = int(out1.logits[0, -1].argmax())
        # The next step as HF's generate takes it: the cached prompt, the new token at position 17 + rope_delta.
        step = torch.tensor([[nxt]])
        p = torch.full((3, 1, 1), 17 + int(delta[0, 0]))
        out2 = model(input_ids=step, past_key_values=out1.past_key_values, position_ids=p, attention_mask=torch.ones(1, 18, dtype=torch.long),
                     output_hidden_states=True, use_cache=True)
        ref["token_next"] = torch.tensor([nxt], dtype=torch.int32)
        ref["mrope_next"] = p[:, 0, 0].to(torch.int32)
        ref["final_next"] = out2.hidden_states[-1][0, 0]
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1])
