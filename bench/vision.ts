// The image path, in one run: host pre-processing per image (the runtime's C++ front-end, qhx_pixels,
// against Hugging Face's processor on the same file: PIL decode + stretch + Qwen2-VL processor, the
// peer), the vision encoder per image on the host CPU (onnxruntime, the shipped W8 graph) and on the
// x86 HTP simulator (the graph compiled for the arch), both on the tiny twin's encoder; and, from the
// planner's own accounting, weight bytes per decode token and per image for the real qwen3-vl-2b.
//
//   node --import tsx bench/vision.ts [--arch v81] [--runs 7] [--json]
//
// The twin's encoder is toy-sized (3 blocks of 32 wide, 48 patches): its times say what the host and
// the simulator cost per call, not what a 2B encoder costs on a phone (no device here). The simulator
// is a functional model of the HTP, not a timing one.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import * as ort from 'onnxruntime-node';
import { build } from '../src/build.js';
import { silentProgress } from '../src/engine/progress.js';
import { cacheRoot } from '../src/paths.js';
import { readCheckpointRef } from '../src/hub/checkpoint-ref.js';
import { ensureVenv } from '../src/toolchain/venv.js';
import { ensureNative } from '../src/toolchain/native.js';
import { Trace } from '../src/gates/trace.js';
import { planRecipe } from '../src/plan/for-recipe.js';
import { benchArgs, median, positiveInt } from './util.js';

const { values: arg, num } = benchArgs({ arch: { type: 'string', default: 'v81' }, runs: { type: 'string', default: '7' }, json: { type: 'boolean' } });
const runs = num('runs', positiveInt);
const work = mkdtempSync(join(tmpdir(), 'forge-bench-vision-'));
const python = await ensureVenv();

try {
  const record = await build({ recipe: 'tiny-qwen3-vl', arch: arg.arch, out: join(work, 'out'), until: 'oracle', progress: silentProgress });
  if (!record.ok) throw new Error(record.error);
  const entry = (id: string) => join(cacheRoot(), id, record.stages.find((s) => s.name === id)!.key!);
  const model = readCheckpointRef(entry('fetch')).absDir;
  const trace = await Trace.open(entry('trace'));
  const imagePrompt = trace.meta.prompts.findIndex((p) => p.image);
  const pixels = await trace.getPrompt(imagePrompt, 'pixels');
  const { size: [height, width] } = trace.meta.prompts[imagePrompt].image!;
  await trace.close();

  // 1. Pre-processing: the traced pictures and a photo-sized JPEG, each through both front-ends.
  const photo = join(work, 'photo-1000x750.jpg');
  await $({ quiet: true })`${python} -c ${`import numpy as np; from PIL import Image; r=np.random.default_rng(1); a=np.clip(np.add.outer(np.arange(750),np.arange(1000))[...,None]*[0.1,0.2,0.3]+r.normal(0,20,(750,1000,3)),0,255).astype('uint8'); Image.fromarray(a).save('${photo}', quality=90)`}`;
  // The twin's size for every picture; the photo also at Qwen3-VL-2B's 512×512.
  const jobs: Array<[string, number, number]> = [[photo, height, width], [join(entry('trace'), 'images', 'red-circle.png'), height, width],
    [join(entry('trace'), 'images', 'blue-square.jpg'), height, width], [photo, 512, 512]];
  const native = await ensureNative();
  const pre: Array<{ file: string; size: string; cppMs: number; hfMs: number; ratio: number }> = [];
  for (const [file, h, w] of jobs) {
    const cpp: number[] = [];
    for (let i = 0; i < runs; i++) {
      const r = await $({ quiet: true })`${join(native.buildDir, 'qhx_pixels')} ${file} --size ${`${h}x${w}`} --out ${join(work, 'p.bin')} --json`;
      const t = (JSON.parse(r.stdout.trim()) as { timings: { decode_ms: number; resize_ms: number; patchify_ms: number } }).timings;
      cpp.push(t.decode_ms + t.resize_ms + t.patchify_ms);
    }
    // The peer in one Python process, timed per call after a warm-up (imports and the processor's load excluded).
    const script = `import sys, time, json; sys.path.insert(0, 'oracles'); import pixels
pixels.reference_pixels(${JSON.stringify(model)}, ${JSON.stringify(file)}, ${h}, ${w})
ts = []
for _ in range(${runs}):
    t = time.perf_counter(); pixels.reference_pixels(${JSON.stringify(model)}, ${JSON.stringify(file)}, ${h}, ${w}); ts.append((time.perf_counter() - t) * 1000)
print(json.dumps(ts))`;
    const hf = JSON.parse((await $({ quiet: true })`${python} -c ${script}`).stdout.trim().split('\n').pop()!) as number[];
    pre.push({ file: file.split('/').pop()!, size: `${w}×${h}`, cppMs: median(cpp), hfMs: median(hf), ratio: median(hf) / median(cpp) });
  }

  // 2. The encoder on the host CPU: the shipped (W8) graph as the parity gate runs it.
  const session = await ort.InferenceSession.create(join(entry('quantize'), 'vision.onnx'), { intraOpNumThreads: 1 });
  const feeds = { pixel_values: new ort.Tensor('float32', pixels, [pixels.length / 1536, 1536]) };
  await session.run(feeds);
  const cpu: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t = performance.now();
    await session.run(feeds);
    cpu.push(performance.now() - t);
  }
  await session.release();

  // 3. The encoder on the x86 HTP simulator: compiled alone for the arch, then `runs` calls.
  const socModel = (JSON.parse(readFileSync(join(entry('plan'), 'plan.json'), 'utf8')) as { socModel: number }).socModel;
  await $({ quiet: true })`${python} oracles/qnn_compile.py --out ${join(work, 'qnn')} --name vision --soc-model ${socModel} --fp16 --separate ${join(entry('quantize'), 'vision.onnx')}`;
  const cases = join(work, 'feeds.safetensors');
  writeFileSync(join(work, 'feeds.py'), `import numpy as np, sys; from safetensors.numpy import save_file
pv = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 1536)
save_file({f'{i}/pixel_values': pv for i in range(${runs})}, sys.argv[2], metadata={'cases': '${runs}'})`);
  writeFileSync(join(work, 'pv.bin'), Buffer.from(pixels.buffer, pixels.byteOffset, pixels.byteLength));
  await $({ quiet: true })`${python} ${join(work, 'feeds.py')} ${join(work, 'pv.bin')} ${cases}`;
  const sim = JSON.parse((await $({ quiet: true })`${python} oracles/qnn_simulate.py run --wrapper ${join(work, 'qnn', 'vision_ctx.onnx')} --soc-model ${socModel} --feeds ${cases} --out ${join(work, 'sim.safetensors')}`).stdout.trim().split('\n').pop()!) as { runSeconds: number[] };

  // 4. The real recipe's bytes, from its plan: what a decode token and an image read.
  const bytes = [];
  for (const arch of ['v79', 'v81']) {
    const p = await planRecipe('qwen3-vl-2b', arch);
    const hidden = 2048;
    const decode = p.shards.reduce((a, s) => a + s.weightBytes, 0) + (p.lmHead.placement === 'separate' ? p.lmHead.bytes : 0) + hidden * 2;
    bytes.push({ recipe: 'qwen3-vl-2b', arch, decodeBytesPerToken: decode, lmHead: `${p.lmHead.placement} ${p.lmHead.quant}`, encoderBytesPerImage: p.encoders?.[0]?.weightBytes ?? 0 });
  }

  const result = {
    twin: { image: [height, width], patches: pixels.length / 1536 },
    preprocessing: pre,
    encoder: { cpuMsPerImage: median(cpu), simulatorMsPerImage: median(sim.runSeconds.map((s) => s * 1000)), simulatorOverCpu: median(sim.runSeconds.map((s) => s * 1000)) / median(cpu) },
    bytes,
  };
  if (arg.json) console.log(JSON.stringify(result));
  else {
    console.log(`pre-processing (median of ${runs}): C++ front-end vs HF's processor (PIL + Qwen2-VL, the peer), decode + stretch + normalise + patchify`);
    for (const r of pre) console.log(`  ${r.file.padEnd(22)} → ${r.size.padEnd(8)} C++ ${r.cppMs.toFixed(2)} ms   HF ${r.hfMs.toFixed(2)} ms   HF/C++ ${r.ratio.toFixed(1)}×`);
    console.log(`vision encoder (twin, W8): host CPU ${result.encoder.cpuMsPerImage.toFixed(2)} ms/image, x86 HTP simulator ${result.encoder.simulatorMsPerImage.toFixed(1)} ms/image (a functional model, not device time)`);
    for (const b of bytes) console.log(`qwen3-vl-2b ${b.arch}: ${(b.decodeBytesPerToken / 1e9).toFixed(3)} GB of weights per decode token (layers W8, lm-head ${b.lmHead}, one f16 embedding row); the encoder reads ${(b.encoderBytesPerImage / 1e6).toFixed(0)} MB per image`);
  }
} finally {
  rmSync(work, { recursive: true, force: true });
}
