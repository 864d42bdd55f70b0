// Runs a pipeline: each node's cache key comes from its stage version, params, tool versions and the
// content hashes of its inputs; a hit is reused, a miss runs in a child process under the scheduler.
import { fork } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { mkdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { performance } from 'node:perf_hooks';
import { sha256Hex, stableStringify } from './hash.js';
import { codeHash } from './code-hash.js';
import type { EntryMeta, StageCache } from './cache.js';
import type { Scheduler } from './scheduler.js';
import { workingSet, type MemoryPrediction, type Pipeline, type StageModule, type StageNode } from './stage.js';
import { watchTreeMemory, type MemoryPeak } from './memory.js';
import { checkEvicted, checkPrediction } from './predict.js';
import type { ChildMessage, ChildRequest } from './child.js';
import type { Progress } from './progress.js';
import { type RemoteCache } from './remote-cache.js';
import { mb } from '../units.js';
import { s3Reason } from './s3.js';
import { describeFailure } from './io-failure.js';
import { repoRoot } from '../paths.js';

/**
 * skipped: an input failed (or its gate did), so it could not run; cancelled: it could have run, but
 * another stage failed or the build was interrupted first, so it was stopped or never started.
 */
export type StageStatus = 'ran' | 'cached' | 'failed' | 'skipped' | 'cancelled';

export interface StageRecord {
  name: string;
  status: StageStatus;
  /** The stage's own time: from its cache lookup to its end, less what it spent queued. */
  seconds: number;
  /** How long it waited for a scheduler slot (memory) or another build's lock before it started; absent when it did not wait. */
  queuedSeconds?: number;
  /** Peak RSS of the stage's process tree when it ran here; null when it came from the cache. */
  peakRssBytes: number | null;
  /** Peak private (RssAnon) and mapped (RssFile) bytes summed over its process tree, sampled from /proc; null when it did not run here (or off Linux). */
  peakPrivateBytes: number | null;
  peakMappedBytes: number | null;
  /** What the stage was predicted to need (absent when its prediction could not be made: an input failed). */
  predicted?: MemoryPrediction;
  /** Set when the measured peak exceeded the prediction by more than 25%: which figure, by how much. */
  overPrediction?: string;
  /** Bytes its process tree read from storage while it ran here (absent where not measured). */
  diskReadBytes?: number;
  /** Set when that was far more than it needs to read: its pages were evicted while it ran (predict.ts checkEvicted). */
  evicted?: string;
  key?: string;
  error?: string;
  /** A cached stage's entry came from the shared (remote) cache: downloaded and verified by this build. */
  source?: 'remote';
  /** What the shared cache did for this stage: `uploaded …`, `upload failed: …`, `not used: …` (a bad remote entry). */
  remote?: string;
}

export interface PipelineResult {
  ok: boolean;
  stages: StageRecord[];
  entries: Map<string, { dir: string; meta: EntryMeta }>;
  failure?: { stage: string; message: string };
  /** Why the run was stopped from outside (opts.signal's reason), when it was. */
  interrupted?: string;
}

export interface RunOptions {
  cache: StageCache;
  scheduler: Scheduler;
  progress: Progress;
  /** Versions of every tool a stage may name; a missing one is an error, not an empty string. */
  toolVersions: Record<string, string>;
  until?: string;
  force?: string[];
  /** Aborting it stops the run: running stages are terminated, waiting ones never start. */
  signal?: AbortSignal;
  /** The shared cache: read on a local miss, written after a stage ran (or when it lacks a local entry). */
  remote?: RemoteCache;
  /** How often a stage waiting on another build's lock says it still is (default LOCK_NOTICE_MS, 30 s). */
  lockNoticeMs?: number;
}

export function cacheKey(parts: { stage: string; version: string; code: string; params: unknown; inputs: Record<string, string>; tools: Record<string, string> }): string {
  return sha256Hex(stableStringify(parts));
}

/** The nodes `until` needs (itself and its ancestors), or all of them. */
export function selectNodes(p: Pipeline, until?: string): StageNode[] {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  if (!until) return p.nodes;
  if (!byId.has(until)) throw new Error(`unknown stage '${until}' for --until; stages: ${p.nodes.map((n) => n.id).join(', ')}`);
  const keep = new Set<string>();
  const visit = (id: string) => {
    if (keep.has(id)) return;
    keep.add(id);
    const n = byId.get(id)!;
    for (const dep of [...Object.values(n.inputs), ...(n.after ?? []), ...n.memory.from]) visit(dep);
  };
  visit(until);
  return p.nodes.filter((n) => keep.has(n.id));
}

const childScript = () => join(repoRoot(), 'src', 'engine', 'child.ts');
const tsxLoader = () => pathToFileURL(join(repoRoot(), 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;

// A stage asked to stop gets SIGTERM (it kills its subprocess groups and exits at once); SIGKILL
// follows if it has not gone after this long.
const STOP_GRACE_MS = 1500;

/** What a stage's inputs hold: their entries' files, and a checkpoint the fetch entry only points at. */
function inputBytes(metas: EntryMeta[]): number {
  let total = 0;
  for (const m of metas) {
    const files = Object.values(m.files).reduce((a, f) => a + f.size, 0);
    const referenced = (m.outcome.summary as { bytes?: unknown } | undefined)?.bytes;
    total += m.stage === 'fetch' && typeof referenced === 'number' ? Math.max(files, referenced) : files;
  }
  return total;
}

type ChildResult = { outcome: EntryMeta['outcome']; peakRssBytes: number; memory: MemoryPeak | null };

function runChild(node: StageNode, req: ChildRequest, logFile: string, progress: Progress, stop: AbortSignal): Promise<ChildResult> {
  return new Promise((resolve, reject) => {
    const log = createWriteStream(logFile);
    const child = fork(childScript(), [], { execArgv: ['--import', tsxLoader()], stdio: ['ignore', 'pipe', 'pipe', 'ipc'] });
    // The whole tree (the stage process and every subprocess it runs), from fork to its 'done'.
    const memory = child.pid !== undefined ? watchTreeMemory(child.pid) : null;
    child.stdout!.pipe(log, { end: false });
    child.stderr!.pipe(log, { end: false });
    let settled = false;
    let killTimer: NodeJS.Timeout | undefined;
    const gone = () => child.exitCode !== null || child.signalCode !== null;
    // Stopping fails the stage only once its process is gone, so the caller's removal of the temp
    // dir and release of the lock never race a stage still writing.
    let pending: Error | undefined;
    const stopWith = (err: Error) => {
      if (gone()) return finish(() => reject(err));
      if (pending) return;
      pending = err;
      clearTimeout(timer);
      child.kill('SIGTERM');
      killTimer = setTimeout(() => child.kill('SIGKILL'), STOP_GRACE_MS);
    };
    const finish = (fn: () => void) => {
      if (settled) return;
      settled = true;
      memory?.stop();
      clearTimeout(timer);
      stop.removeEventListener('abort', onStop);
      fn();
      // The log closes after the child's pipes drain.
      child.once('close', () => log.end());
      if (child.exitCode !== null) log.end();
    };
    const timer = node.timeoutSeconds
      ? setTimeout(() => {
          stopWith(new Error(`timed out after ${node.timeoutSeconds} s (log: ${logFile})`));
        }, node.timeoutSeconds * 1000)
      : undefined;
    const onStop = () => stopWith(new StageCancelled(String(stop.reason ?? 'stopped')));
    stop.addEventListener('abort', onStop, { once: true });
    // A log that cannot be written (a full disk) fails the stage with the path, instead of an
    // unhandled 'error' event that would take the whole build down without a run record.
    log.on('error', (e: NodeJS.ErrnoException) => {
      stopWith(new Error(`cannot write the stage log ${logFile}: ${e.code ?? e.message}${e.code ? ` (${e.message})` : ''}`));
    });
    child.on('message', (m: ChildMessage) => {
      if (m.type === 'log') {
        if (!log.destroyed) log.write(`${m.message}\n`);
        progress.log(node.id, m.message);
      } else if (m.type === 'progress') progress.update(node.id, m.done, m.total, m.label);
      else if (pending) return; // being stopped: what it says now no longer counts
      else if (m.type === 'done') {
        const peak = memory?.stop() ?? null;
        finish(() => resolve({ outcome: (m.outcome ?? {}) as EntryMeta['outcome'], peakRssBytes: m.peakRssBytes, memory: peak }));
      }
      else if (m.type === 'failed') {
        if (!log.destroyed) log.write(`${m.stack ?? m.message}\n`);
        finish(() => reject(new Error(m.message)));
      }
    });
    child.on('error', (e) => finish(() => reject(e)));
    child.on('exit', (code, signal) => {
      clearTimeout(killTimer);
      if (pending) finish(() => reject(pending));
      finish(() => reject(new Error(`stage process exited (${signal ?? code}) before finishing; log: ${logFile}`)));
    });
    if (stop.aborted) onStop();
    else child.send(req);
  });
}

/** A stage stopped because another one failed or the build was interrupted. */
export class StageCancelled extends Error {}

/** The measured figures of a stage that did not run here (cached, skipped, failed, cancelled). */
const NOT_MEASURED = { peakRssBytes: null, peakPrivateBytes: null, peakMappedBytes: null } as const;

export async function runPipeline(pipeline: Pipeline, opts: RunOptions): Promise<PipelineResult> {
  const nodes = selectNodes(pipeline, opts.until);
  const force = new Set(opts.force ?? []);
  for (const f of force) {
    if (!pipeline.nodes.some((n) => n.id === f)) throw new Error(`unknown stage '${f}' for --force; stages: ${pipeline.nodes.map((n) => n.id).join(', ')}`);
  }
  const modules = new Map<string, StageModule>();
  for (const n of nodes) {
    const mod = (await import(pathToFileURL(n.module).href)) as { stage?: StageModule };
    if (!mod.stage) throw new Error(`${n.module} does not export 'stage'`);
    modules.set(n.id, mod.stage);
    for (const t of n.tools) if (!(t in opts.toolVersions)) throw new Error(`stage ${n.id} names tool '${t}' whose version is unknown`);
  }
  const records = new Map<string, StageRecord>();
  const entries = new Map<string, { dir: string; meta: EntryMeta }>();
  // Failures by node, reported in pipeline order (not in the order parallel stages happened to fail).
  const failures = new Map<string, string>();
  const done = new Map<string, Promise<EntryMeta | null>>();
  // The first stage error (or an interrupt) stops the rest at once rather than letting unrelated long
  // stages run on before it is reported. A failed gate does not: the other gates' verdicts still
  // belong in the report.
  const stopAll = new AbortController();
  const onInterrupt = () => stopAll.abort(`interrupted: ${String(opts.signal!.reason ?? 'signal')}`);
  if (opts.signal?.aborted) onInterrupt();
  else opts.signal?.addEventListener('abort', onInterrupt, { once: true });
  // Temp dirs of builds killed earlier (nothing else will remove them).
  await opts.cache.sweepStaleTemps();
  const cancelled = (node: StageNode, seconds = 0, key?: string, queuedSeconds = 0) => {
    records.set(node.id, { name: node.id, status: 'cancelled', seconds, ...(queuedSeconds >= 0.05 ? { queuedSeconds } : {}), ...NOT_MEASURED, ...predictedOf(node), ...(key ? { key } : {}), error: String(stopAll.signal.reason) });
    opts.progress.end(node.id, 'cancelled', seconds, queuedSeconds);
    return null;
  };

  // Each node's memory prediction, made as soon as the outputs it reads exist (plan.json for the
  // compile), so a stage that cannot fit is refused then, before hours of other stages.
  const predictions = new Map<string, Promise<MemoryPrediction | null>>();
  const predicted = new Map<string, MemoryPrediction>();
  const predictedOf = (node: StageNode) => (predicted.has(node.id) ? { predicted: predicted.get(node.id)! } : {});
  const refused = new Set<string>();
  const refuse = (node: StageNode, message: string) => {
    refused.add(node.id);
    records.set(node.id, { name: node.id, status: 'failed', seconds: 0, ...NOT_MEASURED, ...predictedOf(node), error: message });
    opts.progress.end(node.id, 'failed', 0);
    failures.set(node.id, message);
    if (!stopAll.signal.aborted) stopAll.abort(`stopped: ${node.id} was refused (memory)`);
  };
  const blocked = (m: EntryMeta | null) => m === null || (m.outcome.gate !== undefined && !m.outcome.gate.ok);
  const predictNode = async (node: StageNode): Promise<MemoryPrediction | null> => {
    const metas = await Promise.all(node.memory.from.map((id) => done.get(id)!));
    if (metas.some((m) => m === null)) return null; // the stage will be skipped with its failed input
    const dirs = Object.fromEntries(node.memory.from.map((id, i) => [id, opts.cache.entryDir(id, metas[i]!.key)]));
    let p: MemoryPrediction;
    try {
      p = node.memory.predict(dirs);
    } catch (e) {
      refuse(node, `cannot predict its memory: ${(e as Error).message}`);
      return null;
    }
    predicted.set(node.id, p);
    const remedy = node.memory.remedy;
    const why = opts.scheduler.refusal(node.id, p, remedy ? (limit) => remedy(dirs, p, limit) : undefined);
    if (!why) return p;
    // Only a stage that would run is refused: one in the cache needs no memory. Its inputs fix its
    // key; they are waited for, its `after` nodes (the long gates before a compile) are not.
    const upstream = await Promise.all(Object.entries(node.inputs).map(async ([name, id]) => [name, await done.get(id)!] as const));
    if (upstream.some(([, m]) => blocked(m))) return null; // skipped with its failed input
    const key = keyOf(node, Object.fromEntries(upstream.map(([name, m]) => [name, m!.contentHash])));
    if (!force.has(node.id) && ((await opts.cache.lookup(node.id, key)) || (await remoteHas(node.id, key)))) return p;
    refuse(node, why);
    return null;
  };
  const remote = opts.remote;
  const remoteHas = (stage: string, key: string) => (remote ? remote.has(stage, key).catch(() => false) : Promise.resolve(false));
  // Keys whose remote entry was found unusable: the entry this build makes replaces it.
  const remoteBad = new Map<string, string>();
  const uploads: Promise<void>[] = [];
  /** Writes an entry back to the shared cache in the background; the run waits for it at the end. */
  const writeBack = (node: StageNode, dir: string, meta: EntryMeta) => {
    if (!remote || stopAll.signal.aborted) return;
    const note = (text: string) => {
      const r = records.get(node.id);
      if (r) r.remote = r.remote ? `${r.remote}; ${text}` : text;
    };
    // Ctrl-C stops uploads too (a half upload is no entry); a failed stage elsewhere does not: this entry is good.
    uploads.push(remote.upload(dir, meta, { replace: remoteBad.has(meta.key), signal: opts.signal }).then(
      (u) => {
        if (u.outcome === 'present') return;
        note(u.outcome === 'uploaded' ? `uploaded ${u.files} file${u.files === 1 ? '' : 's'}, ${mb(u.bytes)}` : `uploaded, but another writer's entry for this key won`);
        opts.progress.log(node.id, `${records.get(node.id)?.remote} to ${remote.url}`);
      },
      (e: Error) => {
        // The shared cache is a convenience: the build goes on with its local entry, and says so.
        note(`upload failed: ${s3Reason(e)}`);
        opts.progress.warn(node.id, `upload to the shared cache ${remote.url} failed (the build goes on): ${s3Reason(e)}`);
      },
    ));
  };
  /** The entry's lock; a build that finds another holding it says whose, and keeps saying so while it waits. */
  const lockStage = <T>(node: StageNode, key: string, fn: () => Promise<T>) =>
    opts.cache.withLock(node.id, key, fn, { onWait: (m) => opts.progress.note(node.id, m), ...(opts.lockNoticeMs ? { noticeMs: opts.lockNoticeMs } : {}) });
  /**
   * On a local miss: the entry from the shared cache, downloaded and verified under the local entry's
   * lock, or null (absent, or unusable: then the stage runs and its entry replaces the remote one).
   */
  const fetchRemote = async (node: StageNode, key: string): Promise<{ meta: EntryMeta; bytes: number | null } | null> => {
    if (!remote) return null;
    return lockStage(node, key, async () => {
      const local = await opts.cache.lookup(node.id, key); // another local build made it meanwhile
      if (local) return { meta: local, bytes: null };
      if (stopAll.signal.aborted) return null;
      const tmp = await opts.cache.makeTemp(node.id, key);
      const got = await remote.fetchInto(opts.cache, node.id, key, tmp, stopAll.signal)
        .catch((e: Error) => ({ meta: null, why: 'unusable' as const, message: e.message }));
      if (got.meta) return { meta: got.meta, bytes: got.bytes };
      await rm(tmp, { recursive: true, force: true });
      if (stopAll.signal.aborted) return null; // stopped mid-download: cancelled below, nothing to warn about
      if (got.why === 'unusable') {
        remoteBad.set(key, got.message);
        opts.progress.warn(node.id, `the shared cache's entry is not used, the stage runs instead: ${got.message}`);
      }
      return null;
    });
  };
  const keyOf = (node: StageNode, inputHashes: Record<string, string>) => {
    const mod = modules.get(node.id)!;
    const tools = Object.fromEntries(node.tools.map((t) => [t, opts.toolVersions[t]]));
    return cacheKey({ stage: mod.name, version: mod.version, code: codeHash(node.module), params: node.params, inputs: inputHashes, tools });
  };

  const runNode = async (node: StageNode): Promise<EntryMeta | null> => {
    const upstream = await Promise.all(Object.entries(node.inputs).map(async ([name, id]) => [name, id, await done.get(id)!] as const));
    const order = await Promise.all((node.after ?? []).map((id) => done.get(id)!));
    const prediction = await predictions.get(node.id)!;
    if (refused.has(node.id)) return null;
    const t0 = performance.now();
    // Time queued (for a scheduler slot, then another build's lock) is not the stage's: kept apart.
    let waitFrom: number | null = null;
    let startedAt: number | null = null;
    const waited = () => (waitFrom === null ? 0 : ((startedAt ?? performance.now()) - waitFrom) / 1000);
    const seconds = () => (performance.now() - t0) / 1000 - waited();
    // A slot and a lock taken at once is no wait worth naming.
    const queuedSeconds = () => (waited() >= 0.05 ? waited() : 0);
    const queued = () => (queuedSeconds() ? { queuedSeconds: queuedSeconds() } : {});
    if (upstream.some(([, , m]) => blocked(m)) || order.some(blocked) || prediction === null) {
      records.set(node.id, { name: node.id, status: 'skipped', seconds: 0, ...NOT_MEASURED, ...predictedOf(node) });
      return null;
    }
    if (stopAll.signal.aborted) return cancelled(node);
    const mod = modules.get(node.id)!;
    const tools = Object.fromEntries(node.tools.map((t) => [t, opts.toolVersions[t]]));
    const key = keyOf(node, Object.fromEntries(upstream.map(([name, , m]) => [name, m!.contentHash])));
    const inputs = Object.fromEntries(upstream.map(([name, id, m]) => [name, opts.cache.entryDir(id, m!.key)]));
    // A gate's verdict is part of its entry: a cached failed gate fails this build too.
    const failedGate = (m: EntryMeta) => {
      const gate = m.outcome.gate;
      if (gate && !gate.ok) failures.set(node.id, `gate ${gate.name} failed`);
    };
    const hit = force.has(node.id) ? null : await opts.cache.lookup(node.id, key);
    if (hit) {
      records.set(node.id, { name: node.id, status: 'cached', seconds: seconds(), ...NOT_MEASURED, predicted: prediction, key });
      entries.set(node.id, { dir: opts.cache.entryDir(node.id, key), meta: hit });
      opts.progress.end(node.id, 'cached', seconds());
      failedGate(hit);
      writeBack(node, opts.cache.entryDir(node.id, key), hit);
      return hit;
    }
    const fetched = force.has(node.id) ? null : await fetchRemote(node, key);
    if (fetched) {
      const fromRemote = fetched.bytes !== null;
      records.set(node.id, {
        name: node.id, status: 'cached', seconds: seconds(), ...NOT_MEASURED, predicted: prediction, key,
        ...(fromRemote ? { source: 'remote' as const, remote: `downloaded ${mb(fetched.bytes!)}` } : {}),
      });
      entries.set(node.id, { dir: opts.cache.entryDir(node.id, key), meta: fetched.meta });
      if (fromRemote) opts.progress.log(node.id, `downloaded ${mb(fetched.bytes!)} from ${remote!.url}`);
      opts.progress.end(node.id, fromRemote ? 'cached (remote)' : 'cached', seconds());
      failedGate(fetched.meta);
      return fetched.meta;
    }
    try {
      waitFrom = performance.now();
      const meta = await opts.scheduler.run(workingSet(prediction), async () => {
        if (stopAll.signal.aborted) throw new StageCancelled(String(stopAll.signal.reason));
        return lockStage(node, key, async () => {
          startedAt = performance.now();
          // Another build may have made it while we waited for the lock.
          const again = force.has(node.id) ? null : await opts.cache.lookup(node.id, key);
          if (again) return { meta: again, ran: false };
          if (stopAll.signal.aborted) throw new StageCancelled(String(stopAll.signal.reason));
          opts.progress.start(node.id);
          const logDir = join(opts.cache.root, node.id, 'logs');
          await mkdir(logDir, { recursive: true });
          const out = await opts.cache.makeTemp(node.id, key);
          try {
            const started = performance.now();
            const res = await runChild(node, { module: node.module, params: node.params, inputs, out, tools }, join(logDir, `${key}.log`), opts.progress, stopAll.signal);
            const overPrediction = checkPrediction(prediction, res.memory);
            // For forge's own developers (a constant in pipelines/memory.ts gone stale): kept in the
            // run record and the report, shown on the console with --verbose only.
            if (overPrediction) opts.progress.log(node.id, overPrediction);
            // For the porter: a stage that ran ten times slower because its pages kept being dropped.
            const evicted = checkEvicted(prediction, res.memory, inputBytes(upstream.map(([, , m]) => m!)));
            if (evicted) opts.progress.warn(node.id, evicted);
            const meta = await opts.cache.commit(out, {
              stage: node.id, module: mod.name, version: mod.version, key,
              seconds: (performance.now() - started) / 1000, peakRssBytes: res.peakRssBytes,
              peakPrivateBytes: res.memory?.privateBytes ?? null, peakMappedBytes: res.memory?.mappedBytes ?? null,
              predicted: prediction, ...(overPrediction ? { overPrediction } : {}),
              ...(res.memory?.diskReadBytes !== undefined ? { diskReadBytes: res.memory.diskReadBytes } : {}), ...(evicted ? { evicted } : {}), outcome: res.outcome,
            });
            return { meta, ran: true };
          } catch (e) {
            // A write of the engine's own (the entry's meta.json, its hashing) that hit a full disk
            // names no file: named here as the stage process names its own, while `out` still exists.
            if (e instanceof Error && !(e instanceof StageCancelled)) e.message = describeFailure(e, out);
            // No half entry stays in the cache's temp space; logs the error names are kept.
            const moved = await opts.cache.discardTemp(out, join(logDir, key)).catch(() => new Map<string, string>());
            if (e instanceof Error) for (const [from, to] of moved) e.message = e.message.replaceAll(from, to);
            throw e;
          }
        });
      }, prediction.privateBytes, node.id);
      const status = meta.ran ? 'ran' : 'cached';
      const m = meta.meta;
      const badRemote = remoteBad.has(key) ? { remote: `not used: ${remoteBad.get(key)}` } : {};
      const measured = meta.ran
        ? {
          peakRssBytes: m.peakRssBytes, peakPrivateBytes: m.peakPrivateBytes ?? null, peakMappedBytes: m.peakMappedBytes ?? null, ...(m.overPrediction ? { overPrediction: m.overPrediction } : {}),
          ...(m.diskReadBytes !== undefined ? { diskReadBytes: m.diskReadBytes } : {}), ...(m.evicted ? { evicted: m.evicted } : {}),
        }
        : NOT_MEASURED;
      records.set(node.id, { name: node.id, status, seconds: seconds(), ...queued(), ...measured, predicted: prediction, key, ...badRemote });
      entries.set(node.id, { dir: opts.cache.entryDir(node.id, key), meta: meta.meta });
      opts.progress.end(node.id, status, seconds(), queuedSeconds());
      failedGate(meta.meta);
      if (meta.ran) writeBack(node, opts.cache.entryDir(node.id, key), meta.meta);
      return meta.meta;
    } catch (e) {
      if (e instanceof StageCancelled) return cancelled(node, seconds(), key, queuedSeconds());
      const message = (e as Error).message;
      records.set(node.id, { name: node.id, status: 'failed', seconds: seconds(), ...queued(), ...NOT_MEASURED, predicted: prediction, key, error: message });
      opts.progress.end(node.id, 'failed', seconds(), queuedSeconds());
      failures.set(node.id, message);
      if (!stopAll.signal.aborted) stopAll.abort(`stopped after ${node.id} failed`);
      return null;
    }
  };

  // Nodes are listed in dependency order; each awaits its inputs, so independent ones overlap.
  for (const node of nodes) {
    for (const dep of [...Object.values(node.inputs), ...(node.after ?? []), ...node.memory.from]) {
      if (!done.has(dep)) throw new Error(`stage ${node.id} reads '${dep}', which is not an earlier stage`);
    }
    predictions.set(node.id, predictNode(node).catch((e: Error) => {
      refuse(node, `cannot predict its memory: ${e.message}`);
      return null;
    }));
    done.set(node.id, runNode(node));
  }
  await Promise.all(done.values());
  // Uploads never fail the run (each records its own outcome), so waiting for them is all that is left.
  await Promise.all(uploads);
  opts.signal?.removeEventListener('abort', onInterrupt);
  const stages = nodes.map((n) => records.get(n.id)!);
  const first = nodes.find((n) => failures.has(n.id));
  const failure = first ? { stage: first.id, message: failures.get(first.id)! } : undefined;
  const interrupted = opts.signal?.aborted ? String(opts.signal.reason ?? 'signal') : undefined;
  return {
    ok: !failure && !interrupted && stages.every((s) => s.status === 'ran' || s.status === 'cached'),
    stages, entries, failure, ...(interrupted ? { interrupted } : {}),
  };
}
