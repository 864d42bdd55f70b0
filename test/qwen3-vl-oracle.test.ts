// Qwen3-VL's oracle with images (oracles/trace.py image inputs, oracles/pixels.py) on the qwen3_vl
// twin, which make_twin.py trains to caption oracles/twin_images.py's pictures: two pictures traced
// behind the same text give different, confident answers; the traced tokens are HF generate's with
// the processor's inputs; M-RoPE rows follow the rule; DeepStack is in h.1..h.3 at the image's
// tokens; streamed and --whole-model traces are the same bytes; checked by check_trace.py, which
// imports nothing from the tracer.
import { describe, it, expect, beforeAll } from 'vitest';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { runPython } from '../src/toolchain/python.js';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { venvPython } from '../src/toolchain/venv.js';
import { openSafetensors } from '../src/io/safetensors.js';

const IMAGES = resolve('oracles/twin_images.py');
const TRACE = resolve('oracles/trace.py');
const CHECK = resolve('oracles/check_trace.py');
const dir = mkdtempSync(join(tmpdir(), 'forge-qwen3-vl-oracle-'));
// The twin as the fetch stage makes it (oracles/make_twin.py), shared with the tiny-qwen3-vl build tests.
let model = '';
const images = join(dir, 'images');
const streamed = join(dir, 'trace');
const whole = join(dir, 'trace-whole');
const PROMPT = 'This picture shows a'; // twin_images.IMAGE_PROMPT: what the twin was trained on
const NEW = 16;

const inputs = () => [
  { type: 'image', image: join(images, 'red-circle.png'), text: PROMPT }, // 200x150 PNG, stretched to 96x128
  { type: 'image', image: join(images, 'blue-square.jpg'), text: PROMPT }, // 96x96 JPEG
  'The capital of France is',
];

async function trace(items: unknown, out: string, extra: string[] = []) {
  const prompts = join(dir, `inputs-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(prompts, JSON.stringify(items));
  return $({ quiet: true, nothrow: true })`${venvPython()} ${TRACE} --model ${model} --out ${out} --prompts ${prompts} --new-tokens ${NEW} --max-context 64 ${extra}`;
}

async function check(at: string) {
  const r = await $({ quiet: true, nothrow: true })`${venvPython()} ${CHECK} --model ${model} --trace ${at} --images ${images} --tol 1e-5`;
  return { code: r.exitCode, report: JSON.parse(r.stdout.trim().split('\n').pop()!) };
}

interface Prompt { prompt_tokens: number[]; generated: number[]; margins: number[]; steps: number; image?: { file: string; size: number[]; grid: number[]; tokens: number; start: number; sha256: string } }
const meta = () => JSON.parse(readFileSync(join(streamed, 'trace.json'), 'utf8')) as { prompts: Prompt[] };

beforeAll(async () => {
  const r = await build({ recipe: 'tiny-qwen3-vl', arch: 'v81', out: join(dir, 'out'), until: 'fetch', progress: silentProgress });
  if (!r.ok) throw new Error(r.error);
  model = readCheckpointRef(join(cacheRoot(), 'fetch', r.stages.find((s) => s.name === 'fetch')!.key!)).absDir;
  await runPython(IMAGES, ['--out', images]);
  for (const [out, extra] of [[streamed, []], [whole, ['--whole-model']]] as const) {
    const r = await trace(inputs(), out, ['--image-size', '96x128', ...extra]);
    if (r.exitCode !== 0) throw new Error(r.stderr);
  }
}, 600_000);

describe('the Qwen3-VL oracle with images', () => {
  it('two pictures behind the same text get different answers from the first token, each naming its picture, confidently', async () => {
    const twin = JSON.parse(readFileSync(join(model, 'twin.json'), 'utf8'));
    const said = Object.fromEntries(twin.image_prompts.map((r: { image: string; continuation: string; tokens: number[] }) => [r.image, r]));
    expect(said['red-circle.png'].continuation).toMatch(/^ red circle on a white background\./);
    expect(said['blue-square.jpg'].continuation).toMatch(/^ blue square on a white background\./);
    const [red, blue] = meta().prompts;
    expect(red.generated[0]).not.toBe(blue.generated[0]);
    // The trace's answers are the ones make_twin measured (HF generate on the saved twin).
    expect(red.generated).toEqual(said['red-circle.png'].tokens.slice(0, NEW));
    expect(blue.generated).toEqual(said['blue-square.jpg'].tokens.slice(0, NEW));
    for (const p of [red, blue]) expect(Math.min(...p.margins)).toBeGreaterThanOrEqual(twin.margin_floor);
  });

  it('records the image, its pixels and the vision tower per prompt, and mrope per step', async () => {
    const m = meta();
    expect(m.prompts[0].image).toMatchObject({ file: 'red-circle.png', size: [96, 128], grid: [1, 6, 8], tokens: 12, start: 1 });
    expect(m.prompts[1].image).toMatchObject({ file: 'blue-square.jpg', size: [96, 128], grid: [1, 6, 8], tokens: 12, start: 1 });
    expect(m.prompts[2].image).toBeUndefined();
    const st = await openSafetensors(join(streamed, 'trace.safetensors'));
    const shape = (n: string) => st.tensors.get(n)?.shape;
    expect(shape('p0/pixels')).toEqual([48, 1536]);
    expect(shape('p0/vision.embed')).toEqual([48, 32]);
    for (const j of [0, 1, 2]) expect(shape(`p0/vision.block.${j}`)).toEqual([48, 32]);
    expect(shape('p0/vision.merged')).toEqual([12, 64]);
    for (const k of [0, 1, 2]) expect(shape(`p0/vision.deepstack.${k}`)).toEqual([12, 64]);
    expect(shape('p2/pixels')).toBeUndefined();
    for (const p of [0, 2]) expect(st.tensors.get(`p${p}/s3/mrope`)).toMatchObject({ dtype: 'I64', shape: [3] });
    await st.close();
  });

  it('feeds M-RoPE rows by the rule: image tokens (s, s+row, s+col), the text after resumes at max + 1, generated tokens at t + delta', async () => {
    const st = await openSafetensors(join(streamed, 'trace.safetensors'));
    for (const [p, pr] of meta().prompts.entries()) {
      const want: number[][] = [];
      let pos = 0;
      for (let i = 0; i < pr.prompt_tokens.length;) {
        if (pr.image && i === pr.image.start) {
          const cols = pr.image.grid[2] / 2;
          for (let k = 0; k < pr.image.tokens; k++) want.push([pos, pos + Math.floor(k / cols), pos + (k % cols)]);
          pos += Math.max(pr.image.grid[1], pr.image.grid[2]) / 2;
          i += pr.image.tokens;
        } else {
          want.push([pos, pos, pos]);
          pos++;
          i++;
        }
      }
      const delta = pos - pr.prompt_tokens.length; // the largest position + 1 - the prompt's length
      for (let t = pr.prompt_tokens.length; t < pr.steps; t++) want.push([t + delta, t + delta, t + delta]);
      const got: number[][] = [];
      for (let t = 0; t < pr.steps; t++) got.push([...new BigInt64Array((await st.read(`p${p}/s${t}/mrope`)).buffer.slice(0, 24))].map(Number));
      expect(got, `prompt ${p}`).toEqual(want);
      if (pr.image) expect(delta).toBeLessThan(0); // 12 image tokens take 4 positions
    }
    await st.close();
  });

  it('generates HF generate\'s tokens with the processor\'s inputs, and check_trace.py recomputes the rest (pixels, vision, DeepStack, K rows)', async () => {
    const { code, report } = await check(streamed);
    expect(report.problems).toEqual([]);
    expect(code).toBe(0);
    expect(report.generate_matches).toEqual([true, true, true]);
    // DeepStack present: at every image token, h.{i+1} is layer i's raw output plus feature i's row
    // (HF's forward hook on the layer sees the output before the addition), never the raw output.
    expect(report.deepstack_min_abs).toBeGreaterThan(0);
    for (const k of ['deepstack_added', 'image_rows_spliced', 'pixels_by_hand', 'vision_vs_hf', 'vision_embed_by_hand', 'k_by_hand', 'v_by_hand', 'h', 'logits']) {
      expect(report.errors[k]?.rel, k).toBeLessThan(1e-5);
    }
  }, 120_000);

  it('fails, naming the step, on a trace whose M-RoPE row is off', async () => {
    const bad = mkdtempSync(join(tmpdir(), 'forge-bad-mrope-'));
    cpSync(streamed, bad, { recursive: true });
    const edit = `
import json, sys
from safetensors.torch import load_file, save_file
d = sys.argv[1]; meta = json.load(open(d + "/trace.json")); t = load_file(d + "/" + meta["tensors"])
t["p0/s3/mrope"] = t["p0/s3/mrope"] + 1
save_file(t, d + "/" + meta["tensors"])`;
    await $({ quiet: true })`${venvPython()} -c ${edit} ${bad}`;
    const { code, report } = await check(bad);
    expect(code).toBe(1);
    expect(report.problems).toEqual(expect.arrayContaining([expect.stringMatching(/^p0\/s3\/: mrope \[\d+, \d+, \d+\] != \[\d+, \d+, \d+\] \(the M-RoPE rule\)$/)]));
  }, 120_000);

  it('writes the same trace bytes streamed and with --whole-model', () => {
    for (const f of ['trace.safetensors', 'trace.json']) {
      expect(readFileSync(join(streamed, f)).equals(readFileSync(join(whole, f))), f).toBe(true);
    }
  });

  it('refuses image inputs without --image-size, and an unreadable image naming the file', async () => {
    let r = await trace(inputs(), join(dir, 'refused-1'));
    expect(r.exitCode).toBe(1);
    expect(r.stderr.trim()).toMatch(/^trace: error: .*inputs-\w+\.json: image inputs need --image-size HxW/);
    const notImage = join(dir, 'not-an-image.png');
    writeFileSync(notImage, 'hello');
    r = await trace([{ type: 'image', image: notImage, text: PROMPT }], join(dir, 'refused-2'), ['--image-size', '96x128']);
    expect(r.exitCode).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain(`input 0: cannot read image ${notImage}: UnidentifiedImageError`);
  }, 60_000);
});
