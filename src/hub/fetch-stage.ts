// Stage `fetch`: the checkpoint, from one of three places. A tiny twin is made by the oracle
// environment (seeded, byte-identical every time), once per machine (twin-store.ts); a local directory is referenced with a
// content digest of its files in the params; a hub revision is downloaded into the standard HF cache.
import { readFileSync, statSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Json, StageModule } from '../engine/stage.js';
import type { FamilyId, PinnedSource } from '../recipe/schema.js';
import { validateCheckpoint } from '../families/validate.js';
import { isAbsolute } from 'node:path';
import { placeTwin } from './twin-store.js';
import { CHECKPOINT_REF, type CheckpointRef } from './checkpoint-ref.js';
import { fetchHubSnapshot } from './download.js';
import { localCheckpointDigest, type LocalDigest } from './local-digest.js';
import { stableStringify } from '../engine/hash.js';
import { checkTokenizerFiles } from './tokenizer-files.js';
import { checkFiniteStage } from './finite-check.js';
import { listFilesBelow } from '../io/files.js';
import { readSpecialTokens } from '../bundle/special-tokens.js';

export interface FetchParams {
  source: PinnedSource;
  /** The checkpoint is checked against this family's tensors before any other stage reads it. */
  family: FamilyId;
  /** For local sources: relative path → sha256 of every file, so an edited checkpoint is a new key. */
  digest?: LocalDigest;
}

/** The margins make_twin measured along a tiny twin's greedy continuations (its twin.json). */
function twinMargins(modelDir: string): Json {
  const t = JSON.parse(readFileSync(join(modelDir, 'twin.json'), 'utf8'));
  return { ...t.margins, floor: t.margin_floor, ...(t.router_gaps ? { routerGaps: t.router_gaps } : {}) };
}

const sizes = (dir: string) => Object.fromEntries(listFilesBelow(dir).map((f) => [f, statSync(join(dir, f)).size]));

export const stage: StageModule<FetchParams> = {
  name: 'fetch',
  version: '2', // 2: the NaN/Inf check covers the tensors forge reads, and the summary counts those it left out
  async run(ctx) {
    const { source } = ctx.params;
    let ref: CheckpointRef;
    if (source.kind === 'tiny') {
      const modelDir = join(ctx.out, 'model');
      const placed = await placeTwin(source.twin, modelDir, ctx.log);
      if (placed.peakRssBytes !== null) ctx.notePeakRss(placed.peakRssBytes);
      ref = { dir: 'model', source, files: sizes(modelDir) };
    } else if (source.kind === 'local') {
      // The stat cache makes this cheap; it catches an edit between planning the build and now.
      const now = await localCheckpointDigest(source.path, { log: (m) => ctx.log(m) });
      if (stableStringify(now) !== stableStringify(ctx.params.digest)) {
        throw new Error(`local checkpoint ${source.path} changed while the build was starting; run again`);
      }
      ref = { dir: source.path, source, files: sizes(source.path), digest: now };
    } else {
      const dir = await fetchHubSnapshot(source.repo, source.revision, (m) => ctx.log(m));
      ref = { dir, source, files: sizes(dir) };
    }
    const checkpointDir = isAbsolute(ref.dir) ? ref.dir : join(ctx.out, ref.dir);
    const checked = await validateCheckpoint(ctx.params.family, checkpointDir);
    ctx.log(`checkpoint ok: ${checked.tensors} tensors with the shapes config.json implies`);
    const tokenizer = checkTokenizerFiles(checkpointDir);
    // What the bundle stage will read of them (special token ids), refused now rather than after the compile.
    readSpecialTokens(checkpointDir);
    ctx.log(`tokenizer ok: ${tokenizer.files.join(', ')} (${tokenizer.vocab} tokens)`);
    // The NaN/Inf check covers what validateCheckpoint found the graphs and host tables read.
    const finite = await checkFiniteStage(source, checkpointDir, ctx.log, { reads: checked.reads });
    await writeFile(join(ctx.out, CHECKPOINT_REF), JSON.stringify(ref, null, 2));
    const twin = source.kind === 'tiny' ? twinMargins(checkpointDir) : null;
    return { summary: { tensors: checked.tensors, files: Object.keys(ref.files).length, bytes: Object.values(ref.files).reduce((a, b) => a + b, 0), finite, twinMargins: twin } };
  },
};
