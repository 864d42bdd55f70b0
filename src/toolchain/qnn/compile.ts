// The QNN compile stage's toolchain: ONNX graphs -> one QNN HTP context binary, through the PyPI
// onnxruntime + onnxruntime-qnn pair (onnxruntime-node cannot load the QNN plugin EP), driven as a
// Python helper (oracles/qnn_compile.py) under a wall-clock limit. See that file for what is checked
// before a compile counts as done: onnxruntime-qnn fails silently in several ways.
import { fileURLToPath } from 'node:url';
import { existsSync } from 'node:fs';
import { mkdir, readFile, rm } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';
import { runOwned, type OwnedResult } from '../../engine/subprocess.js';
import { ensureVenv } from '../venv.js';

/** The HTP a context is built for (a subset of HexagonArch). */
export interface HtpTarget {
  /** QNN soc_model id: what the compiler actually builds for (69 = SM8750 / v79, 87 = SM8850 / v81). */
  socModel: number;
  /** 'v79', 'v81', ...: checked against the arch the binary reports. */
  dspArch: string;
  vtcmMb: number;
}

export interface CompileContextOptions {
  /** The graphs of ONE context, in order (e.g. [shard0.prefill.onnx, shard0.decode.onnx]); they share weights. */
  graphs: string[];
  outDir: string;
  /** The binary is `<outDir>/<contextName>.bin`; each graph gets `<outDir>/<graph>_ctx.onnx`. */
  contextName: string;
  arch: HtpTarget;
  /** enable_htp_fp16_precision: float graphs run in fp16 on the HTP. */
  fp16: boolean;
  /** A compile still running after this long is killed (with its children) and reported as a timeout. */
  timeoutSeconds: number;
  /** htp_graph_finalization_optimization_mode, 0-3 (default 3). */
  optLevel?: 0 | 1 | 2 | 3;
  /** One context per graph (`<graph>.bin`) instead of one weight-shared context; what the x86 simulator can load. */
  separate?: boolean;
  /** Accept graphs whose nodes partly stayed on CPU (default: such a compile fails). */
  allowCpuFallback?: boolean;
  /** Python to run the helper with (default: forge's venv, created if missing). */
  python?: string;
  /** The helper script (default: oracles/qnn_compile.py); tests substitute their own. */
  script?: string;
}

export interface CompileReport {
  /** The context binary (the first of `bins` when `separate`). */
  bin: string;
  bytes: number;
  bins: Array<{ path: string; bytes: number; graphs: string[] | null }>;
  shared: boolean;
  wrappers: Array<{ graph: string; path: string; bin: string; qnnGraph: string; cpuNodes: string[] }>;
  /** EPContext `ep_sdk_version`, e.g. 'v2.51.0.260929181845'. */
  epSdkVersion: string;
  /** QAIRT / QNN SDK version the binary was built with, e.g. '2.51.0'. */
  qairtVersion: string | null;
  onnxruntime: string;
  onnxruntimeQnn: string | null;
  /** EPContext model metadata `ep_compatibility_info.QNNExecutionProvider`, e.g. 'v2:6:2.51.0:5.51.0:79:69:8:0'. */
  compatibility: string | null;
  /** What the binary says it targets (QnnSystem binary info + the HTP options string inside it). */
  target: { socModel: number | null; socType: string | null; arch: number | null; dspArch: string | null; vtcmBytes: number | null; fp16Relaxed: boolean | null; optLevel: number | null };
  /** What QnnSystem reads from the main binary: graphs, API and SDK versions, blob size, soc ({error} if it could not). */
  binaryInfo: Record<string, unknown>;
  compileSeconds: number;
  graphSeconds: number[];
  /** Peak RSS of the compiling Python process. */
  peakRssBytes: number;
  /** Wall time including Python start-up. */
  wallSeconds: number;
  /** `<outDir>/compile.log`: ORT's verbose log with QNN's messages. */
  log: string;
  /** The EP's reasons for rejecting nodes, from the log (non-empty only with allowCpuFallback). */
  logReasons: string[];
}

export type QnnFailureKind = 'failed' | 'timeout' | 'memory' | 'toolchain-missing';

export class QnnCompileError extends Error {
  constructor(
    message: string,
    readonly kind: QnnFailureKind,
    readonly logPath: string | null,
    readonly memory: MemoryFailure | null = null,
  ) {
    super(message);
    this.name = 'QnnCompileError';
  }
}

export function qnnCompileScript(): string {
  return fileURLToPath(new URL('../../../oracles/qnn_compile.py', import.meta.url));
}

const FIX_TOOLCHAIN = 'the Python environment lacks the QNN compiler: run `./forge doctor`, and if qnn-aot is MISSING delete the venv it names so the next build re-creates it from oracles/requirements.txt (onnxruntime==1.29.0 + onnxruntime-qnn==2.7.0, Linux x86_64, Python >= 3.11)';

/** Compiles the graphs of one context into a QNN context binary plus one EPContext wrapper per graph. */
export async function compileContext(o: CompileContextOptions): Promise<CompileReport> {
  if (o.graphs.length === 0) throw new QnnCompileError('compileContext: no graphs given', 'failed', null);
  for (const g of o.graphs) if (!existsSync(g)) throw new QnnCompileError(`compileContext: graph not found: ${g}`, 'failed', null);
  const python = o.python ?? (await ensureVenv());
  if (python.includes('/') && !existsSync(python)) {
    throw new QnnCompileError(`no Python at ${python}: ${FIX_TOOLCHAIN}`, 'toolchain-missing', null);
  }
  const outDir = resolve(o.outDir);
  await mkdir(outDir, { recursive: true });
  // Stale outputs of an earlier attempt must not pass for this one's.
  for (const g of o.graphs) {
    const stem = basename(g).replace(/\.onnx$/, '');
    await rm(join(outDir, `${stem}_ctx.onnx`), { force: true });
    await rm(join(outDir, `${stem}.bin`), { force: true });
  }
  await rm(join(outDir, `${o.contextName}.bin`), { force: true });
  const logPath = join(outDir, 'compile.log');
  await rm(logPath, { force: true });

  const arch = Number(/^v?(\d+)$/.exec(o.arch.dspArch)?.[1]);
  const args = [
    '--out', outDir, '--name', o.contextName,
    '--soc-model', String(o.arch.socModel), ...(Number.isFinite(arch) ? ['--htp-arch', String(arch)] : []),
    '--vtcm-mb', String(o.arch.vtcmMb), '--opt', String(o.optLevel ?? 3),
    o.fp16 ? '--fp16' : '--no-fp16',
    ...(o.separate ? ['--separate'] : []),
    ...(o.allowCpuFallback ? ['--allow-cpu-fallback'] : []),
    ...o.graphs.map((g) => resolve(g)),
  ];
  const r = await runWithTimeout(python, [o.script ?? qnnCompileScript(), ...args], o.timeoutSeconds);
  const label = `QNN compile of ${o.contextName} (soc_model ${o.arch.socModel}, ${o.arch.dspArch})`;
  const log = existsSync(logPath) ? logPath : null;
  if (r.spawnError) throw new QnnCompileError(`${label}: cannot run ${python}: ${r.spawnError}; ${FIX_TOOLCHAIN}`, 'toolchain-missing', log);
  if (r.timedOut) {
    throw new QnnCompileError(
      `${label} timed out after ${o.timeoutSeconds} s and was killed${log ? ` (log so far: ${log})` : ''}; ` +
        'a larger timeoutSeconds may be needed for a big context, or split it into smaller shards',
      'timeout', log);
  }
  if (r.exitCode !== 0) {
    const line = helperLine(r.stderr);
    const logText = log ? await readFile(log, 'utf8').catch(() => '') : '';
    const memory = detectMemoryFailure(`${r.stderr}\n${logText}`) ?? (r.signal === 'SIGKILL' ? { kind: 'host-oom' as const, evidence: 'killed by SIGKILL (the kernel OOM killer?)' } : null);
    if (r.exitCode === 3 || /No module named|not importable/.test(line)) {
      throw new QnnCompileError(`${label}: ${line}; ${FIX_TOOLCHAIN}`, 'toolchain-missing', log);
    }
    if (memory) {
      throw new QnnCompileError(
        `${label} ran out of memory (${memory.kind}: ${memory.evidence}); make the context smaller (fewer layers per shard)` +
          (log ? ` (log: ${log})` : ''),
        'memory', log, memory);
    }
    const how = r.signal ? `killed by ${r.signal}` : `exit ${r.exitCode}`;
    throw new QnnCompileError(`${label} failed (${how}): ${line}${log && !line.includes(log) ? ` (log: ${log})` : ''}`, 'failed', log);
  }
  const json = r.stdout.trim().split('\n').reverse().find((l) => l.startsWith('{'));
  if (!json) throw new QnnCompileError(`${label}: the helper printed no report`, 'failed', log);
  const report = JSON.parse(json) as Omit<CompileReport, 'wallSeconds'>;
  return { ...report, wallSeconds: r.seconds };
}

/** The one line a failing helper leaves on stderr ("qnn_compile: ..."), else the last lines of stderr. */
function helperLine(stderr: string): string {
  const lines = stderr.split('\n').map((l) => l.trim()).filter((l) => l && !l.includes('LIBNATIVE'));
  const own = lines.reverse().find((l) => l.startsWith('qnn_compile:'));
  return own ? own.slice('qnn_compile:'.length).trim() : lines.slice(0, 3).reverse().join(' | ') || '(no output)';
}

/** Runs a command in its own process group that dies with forge; past the limit the whole group gets SIGKILL. */
export function runWithTimeout(cmd: string, args: string[], timeoutSeconds: number, env: Record<string, string> = {}, cwd?: string): Promise<OwnedResult> {
  return runOwned(cmd, args, { timeoutSeconds, cwd, env: { PYTHONUNBUFFERED: '1', ...env } });
}

export interface MemoryFailure {
  /** htp-mem-alloc: QNN / the HTP could not allocate (QNN_COMMON_ERROR_MEM_ALLOC = 1002 = 0x3ea, a weights
   *  buffer that does not map, a context blob too big); host-oom: the compiling process itself ran out. */
  kind: 'htp-mem-alloc' | 'host-oom';
  /** The line that shows it. */
  evidence: string;
}

// Messages QNN and the QNN EP print when memory runs out. The strings are from libQnnHtp.so /
// libHtpPrepare.so / libonnxruntime_providers_qnn.so of onnxruntime-qnn 2.7.0 (QAIRT 2.51), and from
// device logs of contexts that fail to load (1002 = 0x3ea = QNN_COMMON_ERROR_MEM_ALLOC).
const HTP_MEMORY: RegExp[] = [
  /QNN_COMMON_ERROR_MEM_ALLOC/,
  /\b0x0*3ea\b/i,
  /\b(?:err(?:or)?(?: code)?|status)\s*[:=]?\s*1002\b/i,
  /Could not allocate persistent weights buffer/i,
  /Failed to map weights buffer/i,
  /fastrpc memory map .* failed/i,
  /rpcmem_alloc\(\) failed/i,
  /failed to alloc(?:ate)?\b/i,
  /Error malloc context blob/i,
  /Insufficient (?:space|memory) allocated/i,
  /Exceeds space allocated for qnn graphs/i,
  /memory allocation failed/i,
  /mempool allocation failed/i,
  /alloc_size \d+ KB > buffer_limit/i,
  /could not allocate memory for op/i,
  /\bcannot allocate\b/i,
];
const HOST_MEMORY: RegExp[] = [/std::bad_alloc/, /\bMemoryError\b/, /Cannot allocate memory/, /\bOut of memory\b/i];
// Lines that mention MEM_ALLOC without being a memory failure of this compile.
const NOT_MEMORY = /does not support IsInf|memory_alloc_limit=|Allocated \d+ bit DDR|unique QNN node name/;

/** Recognises a memory failure in a QNN compile log or error text; null when there is none. */
export function detectMemoryFailure(text: string): MemoryFailure | null {
  for (const raw of text.split('\n')) {
    const line = raw.replace(/\x1b\[[0-9;]*m/g, '').trim();
    if (!line || NOT_MEMORY.test(line)) continue;
    if (HOST_MEMORY.some((re) => re.test(line))) return { kind: 'host-oom', evidence: line.slice(0, 300) };
    if (HTP_MEMORY.some((re) => re.test(line))) return { kind: 'htp-mem-alloc', evidence: line.slice(0, 300) };
  }
  return null;
}
