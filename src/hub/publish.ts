// `forge publish`: a built bundle onto the hub, in one commit, only what changed.
// Everything that can refuse does so before the first request: the run record must show a passing
// build with every required gate passed, and every file must match SHA256SUMS. Then the hub's tree
// at the branch head is compared by content (LFS sha256, or git blob id for regular files), so an
// unchanged bundle makes no upload and no commit. The commit is pinned to the head it was compared
// against (parentCommit), so a concurrent push makes it fail rather than lie about "unchanged".
// Interrupted uploads resume for free: the LFS batch call answers "already have it" for objects that
// arrived, and the library then skips them.
import { existsSync, openAsBlob, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { commitIter, createRepo, listFiles, modelInfo, whoAmI, type CommitOperation, type ListFileEntry } from '@huggingface/hub';
import { RUN_RECORD, type RunRecord } from '../engine/record.js';
import { SUMS } from '../bundle/bundle-stage.js';
import { checkRelativePath, checkTokenShape, formatBytes, gitBlobHasher, hubError, hubToken, hubUrl, redact, statusOf, unreachableCode } from './hub-client.js';
import { hashFile, listFiles as listLocalFiles, sha256OfFile } from '../engine/hash.js';

export interface PublishOptions {
  bundleDir: string;
  /** "org/name" */
  repo: string;
  dryRun?: boolean;
  /** For a repo this creates; an existing repo keeps its visibility. Unset: the namespace's default. */
  private?: boolean;
  hubUrl?: string;
  /** Defaults to HF_TOKEN. Never printed. */
  accessToken?: string;
  /** @default ['oracle', 'parity'] */
  requiredGates?: string[];
  /** @default 'main' */
  branch?: string;
  log?: (line: string) => void;
}

export interface PlanEntry {
  path: string;
  size: number;
  sha256: string;
  action: 'upload' | 'skip-unchanged';
  /** For uploads: not on the hub yet, or there with other content. */
  reason?: 'new' | 'changed' | 'not compared';
}

export interface PublishResult {
  repo: string;
  url: string;
  dryRun: boolean;
  /** false: a dry run that could not reach the hub; the plan lists every file as an upload. */
  compared: boolean;
  /** The repo did not exist (a dry run would create it; a real run did). */
  createsRepo: boolean;
  /** The branch head the plan was made against; null for a repo that does not exist yet. */
  base: string | null;
  plan: PlanEntry[];
  /** Files on the hub that the bundle does not have; left as they are. */
  remoteOnly: string[];
  /** null when nothing was committed (dry run, or nothing changed). */
  commit: { oid: string; url: string } | null;
  uploadedBytes: number;
}

interface LocalFile { path: string; abs: string; size: number; sha256: string }

/** The stages that are gates: a record that ran one must hold its verdict. */
const GATE_STAGES = ['oracle', 'parity', 'emulation'];

/**
 * Why a run record does not vouch for a publishable bundle: a build that did not finish whole (failed,
 * interrupted, stopped by --until, a stage skipped), or a gate the recipe asks for (as the record
 * says in gatesRequired) that is missing, was not run, or failed. Deleting a gate's entry does not
 * help: the recipe's list and the record's own stages still name it.
 */
export function gateProblems(record: RunRecord, requiredGates: string[] = ['oracle', 'parity']): string[] {
  const problems: string[] = [];
  const status = (record as { status?: unknown }).status;
  const until = (record as { until?: unknown }).until;
  if (record.ok !== true) problems.push(`the build did not pass (${RUN_RECORD} has ok: ${JSON.stringify(record.ok)}${record.error ? `: ${record.error}` : ''})`);
  else if (status !== undefined && status !== 'ok') problems.push(`the run was ${JSON.stringify(status)}, not a whole build (${RUN_RECORD} status)`);
  if (until !== undefined) problems.push(`it is a partial build (--until ${String(until)}): it made no gated bundle`);
  const stages = Array.isArray(record.stages) ? record.stages : [];
  for (const s of stages) {
    if (s && s.status !== 'ran' && s.status !== 'cached') problems.push(`stage ${s.name} was ${s.status}, so this is not a whole build`);
  }
  const recorded = record.gatesRequired;
  if (!Array.isArray(recorded) || !recorded.every((g) => typeof g === 'string')) {
    problems.push(`${RUN_RECORD} does not say which gates its recipe asks for (gatesRequired); rebuild it with this forge`);
  }
  const gates = record.gates && typeof record.gates === 'object' ? record.gates : {};
  const notRun = record.gatesNotRun ?? {};
  const required = new Set([...requiredGates, ...(Array.isArray(recorded) ? recorded : []), ...stages.map((s) => s?.name).filter((n) => GATE_STAGES.includes(n))]);
  for (const g of [...required].sort()) {
    const gate = gates[g];
    if (gate) continue;
    problems.push(notRun[g] !== undefined ? `gate ${g} was not run (${notRun[g]}) but the recipe asks for it` : `gate ${g} is missing from ${RUN_RECORD} although the recipe asks for it`);
  }
  for (const [g, gate] of Object.entries(gates).sort()) {
    // A verdict inside the gate (a graph, a variant, the simulator's parity) counts as much as the
    // gate's own flag: a record whose gate says ok over a failed graph is refused, naming the graph.
    const inner = failedVerdicts(gate);
    const named = inner.length ? ` (${inner.join('; ')})` : '';
    if (gate?.ok !== true) problems.push(`gate ${g} failed${named}`);
    else if (inner.length) problems.push(`gate ${g} says ok, but ${inner.length === 1 ? 'a verdict' : `${inner.length} verdicts`} inside it failed: ${inner.join('; ')}`);
  }
  return problems;
}

/** How a verdict's container names it: `graphs` hold graphs, `variants` variants; anything else by its path. */
const KIND: Record<string, string> = { graphs: 'graph', variants: 'variant' };

/**
 * Every verdict below a gate's own that says ok: false (any object with `ok: false`, at any depth:
 * `graphs[<variant/graph>]`, parity `variants[...]`, the simulator's `parity` and `oracle.graphs`),
 * each named with its headline figure where it has one.
 */
export function failedVerdicts(gate: unknown): string[] {
  const found: string[] = [];
  const walk = (v: unknown, path: string[]) => {
    if (!v || typeof v !== 'object') return;
    if (path.length && (v as { ok?: unknown }).ok === false) found.push(`${verdictName(path)} failed${headline(v as Record<string, unknown>)}`);
    for (const [k, child] of Object.entries(v)) if (child && typeof child === 'object') walk(child, [...path, k]);
  };
  walk(gate, []);
  return found;
}

function verdictName(path: string[]): string {
  const last = path.length - 1;
  const kind = last > 0 ? KIND[path[last - 1]] : undefined;
  if (!kind) return path.join('.');
  const where = path.slice(0, last - 1).join('.');
  return `${kind} ${path[last]}${where ? ` (${where})` : ''}`;
}

function headline(v: Record<string, unknown>): string {
  const figures: string[] = [];
  if (typeof v.minCosine === 'number') figures.push(`min cosine ${v.minCosine}`);
  if (typeof v.top1 === 'string') figures.push(`top-1 ${v.top1}`);
  if (typeof v.matched === 'number' && typeof v.total === 'number') figures.push(`${v.matched}/${v.total} matched`);
  if (typeof v.ties === 'number' && v.ties > 0) figures.push(`${v.ties} ties`);
  return figures.length ? `: ${figures.join(', ')}` : '';
}

/** The checks that need no network. Throws one error naming every problem found. */
export async function checkBundle(bundleDir: string, requiredGates: string[] = ['oracle', 'parity']): Promise<{ files: LocalFile[]; record: RunRecord }> {
  const refuse = (why: string) => new Error(`refusing to publish ${bundleDir}: ${why}`);
  const runPath = join(bundleDir, RUN_RECORD);
  if (!existsSync(runPath)) throw refuse(`${RUN_RECORD} is missing (publish only what forge build made)`);
  let record: RunRecord;
  try {
    record = JSON.parse(readFileSync(runPath, 'utf8')) as RunRecord;
  } catch {
    throw refuse(`${RUN_RECORD} is not valid JSON`);
  }
  const problems = gateProblems(record, requiredGates);
  if (problems.length) throw refuse(problems.join('; '));

  const sumsPath = join(bundleDir, SUMS);
  if (!existsSync(sumsPath)) throw refuse(`${SUMS} is missing`);
  const listed = new Map<string, string>();
  for (const [i, line] of readFileSync(sumsPath, 'utf8').split('\n').entries()) {
    if (!line.trim()) continue;
    const m = /^([0-9a-f]{64}) [ *](.+)$/.exec(line);
    if (!m) throw refuse(`${SUMS} line ${i + 1} is not "<sha256>  <path>"`);
    checkRelativePath(m[2]);
    listed.set(m[2], m[1]);
  }
  const files: LocalFile[] = [];
  for (const [path, want] of listed) {
    const abs = join(bundleDir, path);
    if (!existsSync(abs)) throw refuse(`${path} is listed in ${SUMS} but missing`);
    const got = await sha256OfFile(abs);
    if (got !== want) throw refuse(`${path} does not match ${SUMS} (sha256 ${got.slice(0, 12)}…, listed ${want.slice(0, 12)}…)`);
    if (!path.startsWith('build/')) files.push({ path, abs, size: statSync(abs).size, sha256: got });
  }
  const unlisted = (await listLocalFiles(bundleDir)).filter((p) => p !== SUMS && !p.startsWith('build/') && !listed.has(p));
  if (unlisted.length) throw refuse(`not covered by ${SUMS}: ${unlisted.join(', ')}`);
  files.push({ path: SUMS, abs: sumsPath, size: statSync(sumsPath).size, sha256: await sha256OfFile(sumsPath) });
  return { files: files.sort((a, b) => a.path.localeCompare(b.path)), record };
}

async function sameContent(local: LocalFile, remote: ListFileEntry): Promise<boolean> {
  if (remote.lfs) return remote.lfs.oid === local.sha256 && remote.lfs.size === local.size;
  if (remote.size !== local.size || !remote.oid) return false;
  return (await hashFile(local.abs, gitBlobHasher(local.size))) === remote.oid;
}

export async function publishBundle(opts: PublishOptions): Promise<PublishResult> {
  const log = opts.log ?? (() => {});
  const repo = opts.repo;
  if (!/^[\w.-]+\/[\w.-]+$/.test(repo)) throw new Error(`the repo must be "namespace/name", not ${JSON.stringify(repo)}`);
  const dryRun = !!opts.dryRun;
  const branch = opts.branch ?? 'main';
  const { files, record } = await checkBundle(opts.bundleDir, opts.requiredGates ?? ['oracle', 'parity']);

  const token = hubToken(opts.accessToken);
  if (!dryRun && !token) throw new Error('publishing needs a hub token with write access: set HF_TOKEN');
  checkTokenShape(token);
  const base = hubUrl(opts.hubUrl);
  const say = (m: string) => log(redact(m, token));
  const notRun = Object.entries(record.gatesNotRun ?? {}).map(([g, why]) => `${g} (not run: ${why})`);
  if (notRun.length) say(`gates this build did not run: ${notRun.join('; ')}`);
  const common = { hubUrl: base, ...(token ? { accessToken: token } : {}) };
  const call = async <T>(what: string, f: () => Promise<T>): Promise<T> => {
    try { return await f(); } catch (e) { throw hubError(e, what, token); }
  };

  // The hub's side: who we are, the branch head, the tree there. A dry run that cannot reach the hub
  // at all still lists what it would upload, saying it compared nothing.
  let head: string | null = null;
  const remote = new Map<string, ListFileEntry>();
  let compared = true;
  try {
    head = await hubHead();
    if (head) {
      await call(`listing ${repo}@${head.slice(0, 10)}`, async () => {
        for await (const f of listFiles({ ...common, repo: { type: 'model', name: repo }, revision: head!, recursive: true })) {
          if (f.type === 'file') remote.set(f.path, f);
        }
      });
    }
  } catch (e) {
    const code = unreachableCode(e);
    if (!dryRun || !code) throw e;
    compared = false;
    head = null;
    remote.clear();
    say(`could not reach the hub (${code}): not compared with what ${repo} holds; every file is listed as an upload`);
  }

  async function hubHead(): Promise<string | null> {
    if (token) {
      const me = await call('checking the token', () => whoAmI({ hubUrl: base, accessToken: token }));
      say(`hub ${base}: token accepted for ${me.name}`);
    }
    // The head first, then the tree at exactly that commit: the plan and the commit's parent agree.
    try {
      const info = await modelInfo({ ...common, name: repo, revision: branch, additionalFields: ['sha'] });
      // Weights meant to stay private must not land in a public repo because it happened to exist.
      if (opts.private === true && info.private === false) throw new Error(`refusing to publish to ${repo}: it is public and a private repo was asked for`);
      if (opts.private === false && info.private === true) say(`note: ${repo} exists and is private; publishing does not change that`);
      return info.sha ?? null;
    } catch (e) {
      const s = statusOf(e);
      if (!s) throw unreachableCode(e) ? hubError(e, `looking up ${repo}`, token) : e;
      // 404: no such repo. 401 without a token: private or absent, which a dry run cannot tell apart.
      if (!(s === 404 || (s === 401 && !token))) throw hubError(e, `looking up ${repo}`, token);
      if (s === 401) say(`no HF_TOKEN: ${repo} is not visible (absent, or private); planning as if it did not exist`);
      return null;
    }
  }

  const plan: PlanEntry[] = [];
  for (const f of files) {
    const r = remote.get(f.path);
    const same = r ? await sameContent(f, r) : false;
    const reason = !compared ? 'not compared' : r ? 'changed' : 'new';
    plan.push({ path: f.path, size: f.size, sha256: f.sha256, action: same ? 'skip-unchanged' : 'upload', ...(same ? {} : { reason }) });
  }
  const local = new Set(files.map((f) => f.path));
  const remoteOnly = [...remote.keys()].filter((p) => !local.has(p) && p !== '.gitattributes').sort();
  const result: PublishResult = {
    repo, url: `${base}/${repo}`, dryRun, compared, createsRepo: compared && head === null, base: head, plan, remoteOnly, commit: null, uploadedBytes: 0,
  };
  for (const line of formatPlan(result, opts.bundleDir).split('\n')) say(line);
  const uploads = plan.filter((p) => p.action === 'upload');
  if (dryRun) return result;
  if (uploads.length === 0) {
    say(`nothing to upload: ${repo} already has this bundle`);
    return result;
  }

  if (head === null) {
    await call(`creating ${repo}`, async () => {
      try {
        await createRepo({ ...common, accessToken: token!, repo: { type: 'model', name: repo }, ...(opts.private !== undefined ? { private: opts.private } : {}) });
        say(`created ${opts.private ? 'private ' : ''}repo ${repo}`);
      } catch (e) {
        if (statusOf(e) !== 409) throw e; // made by someone else since we looked: commit onto it
      }
    });
  }

  const byPath = new Map(files.map((f) => [f.path, f]));
  const operations: CommitOperation[] = await Promise.all(uploads.map(async (u) => ({
    operation: 'addOrUpdate' as const, path: u.path, content: (await openAsBlob(byPath.get(u.path)!.abs)) as Blob,
  })));
  const gates = [...Object.entries(record.gates ?? {}).map(([n, g]) => `${n}: ${g.ok ? 'pass' : 'FAIL'}`), ...notRun].join(', ');
  try {
    const it = commitIter({
      ...common,
      repo: { type: 'model', name: repo },
      branch,
      operations,
      title: `forge publish ${record.recipe}/${record.arch}`,
      description: `Built by forge. Gates: ${gates}. Files are listed with their sha256 in ${SUMS}.`,
      ...(head ? { parentCommit: head } : {}),
    });
    const done = new Set<string>();
    let next = await it.next();
    while (!next.done) {
      const ev = next.value;
      if (ev.event === 'phase' && ev.phase === 'uploadingLargeFiles') say('uploading large files (objects the hub already has are skipped)');
      if (ev.event === 'phase' && ev.phase === 'committing') say('committing');
      if (ev.event === 'fileProgress' && ev.state === 'uploading' && ev.progress === 1 && !done.has(ev.path)) {
        done.add(ev.path);
        say(`  sent ${ev.path}`);
      }
      next = await it.next();
    }
    const out = next.value;
    if (!out) throw new Error('the hub returned no commit');
    result.commit = { oid: out.commit.oid, url: out.commit.url };
  } catch (e) {
    const err = hubError(e, `uploading to ${repo}`, token);
    err.message += '; nothing was committed (run again to resume: uploaded objects are not sent twice)';
    throw err;
  }
  result.createsRepo = head === null;
  result.uploadedBytes = uploads.reduce((a, u) => a + u.size, 0);
  say(`committed ${result.commit.oid.slice(0, 10)}: ${uploads.length} file(s), ${formatBytes(result.uploadedBytes)} → ${result.url}`);
  return result;
}

/** The plan as the CLI prints it: one line per file, then totals. */
export function formatPlan(r: PublishResult, bundleDir?: string): string {
  const target = !r.compared ? 'hub not reached' : r.createsRepo ? 'new repo' : `at ${r.base?.slice(0, 10)}`;
  const lines = [`publish ${bundleDir ?? 'bundle'} → ${r.repo} (${target})${r.dryRun ? ' [dry run]' : ''}`];
  const w = Math.max(...r.plan.map((p) => formatBytes(p.size).length));
  for (const p of r.plan) {
    const what = p.action === 'upload' ? `upload (${p.reason})`.padEnd(22) : 'skip-unchanged'.padEnd(22);
    lines.push(`  ${what} ${formatBytes(p.size).padStart(w)}  ${p.path}`);
  }
  for (const p of r.remoteOnly) lines.push(`  ${'keep (hub only)'.padEnd(22)} ${''.padStart(w)}  ${p}`);
  const up = r.plan.filter((p) => p.action === 'upload');
  const bytes = up.reduce((a, p) => a + p.size, 0);
  lines.push(`${up.length} to upload (${formatBytes(bytes)}), ${r.plan.length - up.length} unchanged${r.dryRun ? '; dry run: nothing written' : ''}`);
  return lines.join('\n');
}
