// Stage `trace`: the HF fp32 oracle (oracles/trace.py) over the recipe's prompts, one-token cached
// decode, greedy; the tensors every gate compares against, and HF's top-1 − top-2 logit margins along
// the greedy continuations (trace.json `margins`, also in the stage summary).
import { fileURLToPath } from 'node:url';
import { existsSync, writeFileSync, renameSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Json, StageModule } from '../engine/stage.js';
import { runPython } from '../toolchain/python.js';
import { readCheckpointRef } from '../hub/checkpoint-ref.js';
import { readTraceMeta } from './trace.js';
import type { AudioLayout, ImageLayout } from '../families/types.js';

// The tracer and the Python module it imports: named here as code (`new URL`) so the stage's cache
// key covers both (code-hash.ts does not follow Python imports); editing either re-traces.
const [TRACER, , , IMAGES, CLIPS] = [new URL('../../oracles/trace.py', import.meta.url), new URL('../../oracles/trace_families.py', import.meta.url),
  new URL('../../oracles/pixels.py', import.meta.url), new URL('../../oracles/twin_images.py', import.meta.url), new URL('../../oracles/twin_audio.py', import.meta.url),
  new URL('../../oracles/audio_prompt.py', import.meta.url), new URL('../../oracles/audio_features.py', import.meta.url),
  new URL('../../oracles/streamed_weights.py', import.meta.url)];

/**
 * One traced input: text (tokenized by the checkpoint's tokenizer), or token ids traced exactly as
 * given (forge bisect --from a qhx_generate run: the ids the runtime was fed).
 */
export type TraceInput = string | { type: 'ids'; ids: number[] } | ImageInput | AudioInput;

/** A prompt with an image drawn by oracles/twin_images.py (the name of one of its test images). */
export interface ImageInput { type: 'image'; text: string; made: string }

/** A prompt with an audio clip synthesised by oracles/twin_audio.py (the name of one of its test clips). */
export interface AudioInput { type: 'audio'; text: string; made: string }

export interface TraceParams {
  prompts: TraceInput[];
  newTokens: number;
  maxContext: number;
  /** How images reach the encoder (the recipe's `image`: a size, or a soft-token budget): required with image inputs. */
  image?: ImageLayout;
  /** How long a clip may be (the recipe's `audio`): required with audio inputs. */
  audio?: AudioLayout;
}

/** Where the trace stage keeps the images it traced (the parity gate feeds the runtime the same files). */
export const TRACE_IMAGES = 'images';
/** Where it keeps the audio clips it traced. */
export const TRACE_AUDIO = 'audio';

/** Draws the test files a `made` input names (by `script`) into `dir`; refuses a name it does not draw. */
async function drawMade(script: URL, dir: string, inputs: Array<ImageInput | AudioInput>, what: string): Promise<void> {
  if (!inputs.length) return;
  await runPython(fileURLToPath(script), ['--out', dir]);
  for (const p of inputs) if (!existsSync(join(dir, p.made))) throw new Error(`${what} prompt ${JSON.stringify(p.text)}: oracles/${fileURLToPath(script).split('/').pop()} draws no ${what} named ${p.made} (it drew ${readdirSync(dir).join(', ')})`);
}

export const stage: StageModule<TraceParams> = {
  name: 'trace',
  version: '1',
  async run(ctx) {
    const ref = readCheckpointRef(ctx.inputs.checkpoint);
    const promptsFile = join(ctx.out, 'prompts.json');
    const images = ctx.params.prompts.filter((p): p is ImageInput => typeof p === 'object' && p.type === 'image');
    if (images.length && !ctx.params.image) throw new Error(`${images.length} image prompt(s) but no image setting: set the recipe's arch setting "image" ({"height", "width"}, or {"maxSoftTokens"} for Gemma 4)`);
    const clips = ctx.params.prompts.filter((p): p is AudioInput => typeof p === 'object' && p.type === 'audio');
    if (clips.length && !ctx.params.audio) throw new Error(`${clips.length} audio prompt(s) (gates.audioPrompts) but no audio setting: set the recipe's arch setting "audio" ({"maxSeconds": S}, the longest clip)`);
    // The test files are drawn by code into the stage's output, where the parity gate finds them too.
    const imageDir = join(ctx.out, TRACE_IMAGES);
    const audioDir = join(ctx.out, TRACE_AUDIO);
    await drawMade(IMAGES, imageDir, images, 'image');
    await drawMade(CLIPS, audioDir, clips, 'clip');
    const traced = ctx.params.prompts.map((p) => (typeof p === 'object' && p.type === 'image' ? { type: 'image', text: p.text, image: join(imageDir, p.made) }
      : typeof p === 'object' && p.type === 'audio' ? { type: 'audio', text: p.text, audio: join(audioDir, p.made) } : p));
    writeFileSync(promptsFile, JSON.stringify(traced));
    const tmp = join(ctx.out, 'trace-out');
    const r = await runPython(fileURLToPath(TRACER), [
      '--model', ref.absDir, '--out', tmp, '--prompts', promptsFile,
      '--new-tokens', String(ctx.params.newTokens), '--max-context', String(ctx.params.maxContext),
      ...(ctx.params.image?.height !== undefined ? ['--image-size', `${ctx.params.image.height}x${ctx.params.image.width}`] : []),
      ...(ctx.params.image?.maxSoftTokens !== undefined ? ['--image-tokens', String(ctx.params.image.maxSoftTokens)] : []),
      ...(ctx.params.audio ? ['--audio-seconds', String(ctx.params.audio.maxSeconds)] : []),
    ]);
    ctx.notePeakRss(r.peakRssBytes);
    for (const f of readdirSync(tmp)) renameSync(join(tmp, f), join(ctx.out, f));
    const info = JSON.parse(r.stdout.trim().split('\n').pop()!) as { steps: number; bytes: number };
    // HF's top-1 − top-2 margins along the continuations: how close to a tie the gates' tokens are.
    const margins = readTraceMeta(ctx.out).margins;
    return { summary: { prompts: ctx.params.prompts.length, steps: info.steps, bytes: info.bytes, margins: margins as unknown as Json } };
  },
};
