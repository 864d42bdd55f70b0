// `forge bisect --from <file>`: start from what the porter already has. Two kinds of file, told apart
// by shape: a forge build's run record (out/<recipe>/<arch>/build/run.json: bisect takes the recipe and
// arch from it) or a `qhx_generate --json` result (the runtime's own run: its prompt ids and the
// tokens it chose). Anything else, or a file that cannot be read or is not JSON, is one error naming it.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { z } from 'zod';

/** The part of a RunRecord (src/engine/record.ts) bisect reads; the rest of the record is let through. */
const RunRecordShape = z.object({
  recipe: z.string().min(1),
  arch: z.string().min(1),
  status: z.enum(['ok', 'partial', 'failed', 'interrupted']),
  until: z.string().optional(),
  error: z.string().optional(),
  stages: z.array(z.object({ name: z.string(), status: z.string() }).passthrough()),
  gates: z.record(z.string(), z.object({ ok: z.boolean() }).passthrough()),
  tools: z.record(z.string(), z.string()).optional(),
}).passthrough();

/** qhx_generate --json (native/src/qhx_generate.cpp's header): the fields bisect reads. */
const QhxShape = z.object({
  prompt_ids: z.array(z.number().int().nonnegative()).min(1),
  generated_ids: z.array(z.number().int().nonnegative()),
  backend: z.string().optional(),
  text: z.string().nullable().optional(),
}).passthrough();

export interface FromRunRecord {
  kind: 'run-record';
  file: string;
  recipe: string;
  arch: string;
  status: 'ok' | 'partial' | 'failed' | 'interrupted';
  until?: string;
  error?: string;
  /** The gates the record holds that failed, in the record's order. */
  failedGates: string[];
  /** The pinned compile toolchain the build used (`name@hash`), when it used one. */
  toolchain?: string;
}

export interface FromQhxRun {
  kind: 'qhx';
  file: string;
  promptIds: number[];
  generatedIds: number[];
  backend?: string;
}

export type FromFile = FromRunRecord | FromQhxRun;

/** Parses `file` (its text already read) as one of the two kinds; throws naming the file otherwise. */
export function parseFromFile(text: string, file: string): FromFile {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    throw new Error(`forge bisect --from ${file}: not JSON (${(e as Error).message})`);
  }
  const record = RunRecordShape.safeParse(raw);
  if (record.success) {
    const r = record.data;
    return {
      kind: 'run-record', file, recipe: r.recipe, arch: r.arch, status: r.status,
      ...(r.until ? { until: r.until } : {}), ...(r.error ? { error: r.error } : {}),
      failedGates: Object.entries(r.gates).filter(([, g]) => !g.ok).map(([name]) => name),
      ...(r.tools?.toolchain ? { toolchain: r.tools.toolchain } : {}),
    };
  }
  const qhx = QhxShape.safeParse(raw);
  if (qhx.success) return { kind: 'qhx', file, promptIds: qhx.data.prompt_ids, generatedIds: qhx.data.generated_ids, ...(qhx.data.backend ? { backend: qhx.data.backend } : {}) };
  // Neither: say what each kind needs, and the first field each one missed.
  const first = (e: z.ZodError) => { const i = e.issues[0]; return `${i.path.join('.') || '(top level)'}: ${i.message}`; };
  throw new Error(`forge bisect --from ${file}: neither a forge run record (out/<recipe>/<arch>/build/run.json; ${first(record.error)}) nor a qhx_generate --json result ({prompt_ids, generated_ids, …}; ${first(qhx.error)})`);
}

export function readFromFile(path: string): FromFile {
  const file = resolve(path);
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new Error(`forge bisect --from ${file}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  return parseFromFile(text, file);
}

export interface Start { recipe: string; arch: string; from?: FromFile }

/**
 * The recipe and arch bisect works on: the command line's, or a run record's. A positional recipe or
 * --arch that contradicts the record is refused naming both; a qhx result carries neither, so it
 * needs both on the command line.
 */
export function resolveStart(o: { recipe?: string; arch?: string; from?: FromFile }): Start {
  const f = o.from;
  if (!f) {
    if (!o.recipe || !o.arch) throw new Error(`forge bisect: give a recipe and --arch${!o.recipe && !o.arch ? '' : ` (missing: ${!o.recipe ? 'the recipe' : '--arch'})`}, or --from <run.json> of a forge build`);
    return { recipe: o.recipe, arch: o.arch };
  }
  if (f.kind === 'qhx') {
    if (!o.recipe || !o.arch) throw new Error(`forge bisect --from ${f.file}: a qhx_generate result names no recipe or arch: give ${!o.recipe && !o.arch ? 'the recipe and --arch' : !o.recipe ? 'the recipe' : '--arch'} on the command line`);
    return { recipe: o.recipe, arch: o.arch, from: f };
  }
  if (o.recipe && o.recipe !== f.recipe) throw new Error(`forge bisect: recipe ${o.recipe} contradicts --from ${f.file}, a build of recipe ${f.recipe}`);
  if (o.arch && o.arch !== f.arch) throw new Error(`forge bisect: --arch ${o.arch} contradicts --from ${f.file}, a build for arch ${f.arch}`);
  return { recipe: f.recipe, arch: f.arch, from: f };
}

/** Where bisect runs the chain unless --target says: on the simulator when the build it starts from failed there alone (its CPU gate held). */
export function defaultTarget(f?: FromFile): 'host' | 'emulation' {
  return f?.kind === 'run-record' && f.failedGates.includes('emulation') && !f.failedGates.includes('oracle') ? 'emulation' : 'host';
}

/** One line for the report: which build or run bisect started from. */
export function fromText(f: FromFile): string {
  if (f.kind === 'qhx') return `the qhx_generate run in ${f.file}${f.backend ? ` (backend ${f.backend})` : ''}: ${f.promptIds.length} prompt ids, ${f.generatedIds.length} generated`;
  const gates = f.failedGates.length ? `, failed gate${f.failedGates.length > 1 ? 's' : ''} ${f.failedGates.join(', ')}` : '';
  return `the build recorded in ${f.file}: ${f.recipe} for ${f.arch}, status ${f.status}${f.until ? ` (--until ${f.until})` : ''}${gates}${f.error ? ` (${f.error})` : ''}`;
}
