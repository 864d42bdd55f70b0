// The QNN compile toolchain (onnxruntime-qnn AOT on Linux x86_64), run for real on tiny-qwen3's
// shard: its prefill and decode graphs compiled into one weight-shared context binary per arch.
import { describe, it, expect, beforeAll } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, statSync, writeFileSync, chmodSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { compileContext, detectMemoryFailure, QnnCompileError, type CompileReport, type HtpTarget } from '../../src/toolchain/qnn/compile.js';
import { venvPython } from '../../src/toolchain/venv.js';

const V79: HtpTarget = { socModel: 69, dspArch: 'v79', vtcmMb: 8 };
const V81: HtpTarget = { socModel: 87, dspArch: 'v81', vtcmMb: 8 };

let dir: string;
// fp32Copy: fp32 graphs with fp32 weights (the reference export's bf16-in-place Casts are not what a compile takes).
let bundles: { w8: string; fp32: string; fp32Copy: string; trace: string };
const shard = (b: string) => [join(b, 'shard0.prefill.onnx'), join(b, 'shard0.decode.onnx')];
const compile = (graphs: string[], arch: HtpTarget, name: string, extra: Partial<Parameters<typeof compileContext>[0]> = {}) =>
  compileContext({ graphs, outDir: join(dir, name), contextName: 'shard0', arch, fp16: true, timeoutSeconds: 300, ...extra });
const sizes: Record<string, number> = {};

/** Running (a zombie waiting for a reaper that never comes counts as dead). */
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

// One 64x64 linear layer in forge's first W8 form (int8 weight, per-row scale, DequantizeLinear(axis=0), Gemm(transB=1)):
// the QNN EP leaves the DequantizeLinear on CPU, which is why W8 is MatMulNBits now.
const DQ_GEMM = `
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
w = np.random.default_rng(0).integers(-127, 128, (64, 64)).astype(np.int8)
g = h.make_graph([h.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0), h.make_node("Gemm", ["x", "wd"], ["y"], transB=1)], "dq",
                 [h.make_tensor_value_info("x", T.FLOAT, [1, 64])], [h.make_tensor_value_info("y", T.FLOAT, [1, 64])],
                 [nh.from_array(w, "w"), nh.from_array(np.full(64, 0.01, np.float32), "s")])
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
onnx.save(m, sys.argv[1])
`;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'forge-qnn-'));
  const r = await $({ quiet: true })`node --import tsx test/helpers/make-bundle.ts ${join(dir, 'bundles')}`;
  bundles = JSON.parse(r.stdout.trim().split('\n').pop()!);
});

describe('compileContext (onnxruntime-qnn AOT)', () => {
  let v79: CompileReport;
  let v81: CompileReport;
  beforeAll(async () => {
    v79 = await compile(shard(bundles.fp32Copy), V79, 'fp32-v79');
    v81 = await compile(shard(bundles.fp32Copy), V81, 'fp32-v81');
    sizes['fp16 v79'] = v79.bytes;
    sizes['fp16 v81'] = v81.bytes;
  });

  it('writes one context binary for prefill and decode, and a thin EPContext wrapper per graph pointing at it', () => {
    for (const r of [v79, v81]) {
      expect(r.bin).toBe(join(dir, r === v79 ? 'fp32-v79' : 'fp32-v81', 'shard0.bin'));
      expect(statSync(r.bin).size).toBe(r.bytes);
      expect(r.shared).toBe(true);
      expect(r.bins).toHaveLength(1);
      expect(r.bins[0].graphs).toHaveLength(2); // both graphs live in the one binary
      expect(r.wrappers.map((w) => w.path.split('/').pop())).toEqual(['shard0.prefill_ctx.onnx', 'shard0.decode_ctx.onnx']);
      for (const w of r.wrappers) {
        expect(w.bin).toBe('shard0.bin');
        expect(w.cpuNodes).toEqual([]); // every node runs on the HTP
        expect(statSync(w.path).size).toBeLessThan(8192);
        expect(r.bins[0].graphs).toContain(w.qnnGraph);
      }
      expect(existsSync(r.log)).toBe(true);
    }
  });

  it('builds for the SoC asked for, as the binary itself reports it', () => {
    expect(v79.target).toMatchObject({ socModel: 69, socType: 'SM8750', arch: 79, dspArch: 'v79', vtcmBytes: 8 << 20, fp16Relaxed: true, optLevel: 3 });
    expect(v81.target).toMatchObject({ socModel: 87, socType: 'SM8850', arch: 81, dspArch: 'v81', vtcmBytes: 8 << 20, fp16Relaxed: true, optLevel: 3 });
    expect(readFileSync(v79.bin).equals(readFileSync(v81.bin))).toBe(false);
  });

  it('records the toolchain versions a cache key needs', async () => {
    expect(v81.qairtVersion).toBe('2.51.0');
    expect(v81.epSdkVersion).toMatch(/^v2\.51\.0\./);
    expect(v81.onnxruntime).toBe('1.29.0');
    expect(v81.onnxruntimeQnn).toBe('2.7.0');
    expect(v81.compileSeconds).toBeGreaterThan(0);
    expect(v81.peakRssBytes).toBeGreaterThan(50 << 20);
  });

  it('refuses a soc_model / arch pair that disagree (QNN would silently build for the soc_model)', async () => {
    const e = await compile([shard(bundles.fp32Copy)[1]], { ...V79, dspArch: 'v81' }, 'mismatch').catch((x) => x);
    expect(e).toBeInstanceOf(QnnCompileError);
    expect(e.message).toMatch(/soc_model 69 is SM8750 \(v79\), not v81/);
  });

  it('fails, naming the reason, when nodes would stay on CPU (an int8 DequantizeLinear(axis=0) -> Gemm weight)', async () => {
    const graph = join(dir, 'dq-gemm.onnx');
    await $({ quiet: true })`${venvPython()} -c ${DQ_GEMM} ${graph}`;
    const e = await compile([graph], V81, 'dq-gemm').catch((x) => x);
    expect(e).toBeInstanceOf(QnnCompileError);
    expect(e.kind).toBe('failed');
    expect(e.message).toMatch(/1 nodes stayed on CPU \(DequantizeLinear x1\): QNN EP does not support a standalone DQ op with per-channel quantization/);
  });

  it('compiles W8 weights as int8 (MatMulNBits bits=8, the form the exporter writes): a smaller binary than fp16', async () => {
    const w8 = await compile(shard(bundles.w8), V81, 'w8-v81');
    sizes['w8 (MatMulNBits) v81'] = w8.bytes;
    expect(w8.wrappers.every((w) => w.cpuNodes.length === 0)).toBe(true);
    // 197k weights: fp16 costs 2 bytes each, int8 1 (plus per-block scales); the rest is fixed overhead.
    expect(v81.bytes - w8.bytes).toBeGreaterThan(120_000);
    console.log('context binary bytes (tiny-qwen3 shard0, prefill+decode):', JSON.stringify(sizes));
  });
});

describe('compileContext failures', () => {
  it('kills a compile that runs past its time limit, children included, and says so', async () => {
    const script = join(dir, 'hang.py');
    const pidFile = join(dir, 'hang.pid');
    writeFileSync(script, [
      'import os, subprocess, sys, time',
      `child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])`,
      `open(${JSON.stringify(pidFile)}, "w").write(str(child.pid))`,
      'time.sleep(600)',
    ].join('\n'));
    const t0 = Date.now();
    const e = await compileContext({
      graphs: shard(bundles.fp32Copy), outDir: join(dir, 'hang'), contextName: 'shard0', arch: V81, fp16: true,
      timeoutSeconds: 2, python: venvPython(), script,
    }).catch((x) => x);
    expect((Date.now() - t0) / 1000).toBeLessThan(10);
    expect(e).toBeInstanceOf(QnnCompileError);
    expect(e.kind).toBe('timeout');
    expect(e.message).toMatch(/QNN compile of shard0 \(soc_model 87, v81\) timed out after 2 s and was killed/);
    const child = Number(readFileSync(pidFile, 'utf8'));
    await new Promise((r) => setTimeout(r, 300));
    expect(alive(child)).toBe(false); // the grandchild is gone too
  });

  it('says what to do when the Python environment has no QNN compiler', async () => {
    const noSite = join(dir, 'python-without-packages');
    writeFileSync(noSite, `#!/bin/sh\nexec ${venvPython()} -S "$@"\n`); // -S: no site-packages, so no onnxruntime
    chmodSync(noSite, 0o755);
    const e = await compileContext({ graphs: shard(bundles.fp32Copy), outDir: join(dir, 'nosite'), contextName: 'shard0', arch: V81, fp16: true, timeoutSeconds: 60, python: noSite }).catch((x) => x);
    expect(e).toBeInstanceOf(QnnCompileError);
    expect(e.kind).toBe('toolchain-missing');
    expect(e.message).toMatch(/onnxruntime-qnn is not importable/);
    expect(e.message).toMatch(/forge doctor/);
    const gone = await compileContext({ graphs: shard(bundles.fp32Copy), outDir: join(dir, 'nopy'), contextName: 'shard0', arch: V81, fp16: true, timeoutSeconds: 60, python: '/nonexistent/bin/python' }).catch((x) => x);
    expect(gone.kind).toBe('toolchain-missing');
    expect(gone.message).toMatch(/no Python at \/nonexistent\/bin\/python/);
  });
});

describe('detectMemoryFailure', () => {
  it('recognises QNN running out of memory in a compile log or a device log', () => {
    // ORT + QNN log lines in the format of compile.log; messages from libQnnHtp.so / libHtpPrepare.so (QAIRT 2.51).
    const compileLog = [
      '2026-11-22 03:54:20.317 [V:onnxruntime:Default, qnn_backend_manager.cc:519 QnnLogging]  <W> Initializing HtpProvider',
      '2026-11-22 03:54:20.681 [V:onnxruntime:Default, qnn_backend_manager.cc:519 QnnLogging] vtcm_wrapper.cc:160:Allocated 8388608 bit DDR yield buffer 0x7fc69a7f3100.',
      '2026-11-22 03:54:31.102 [V:onnxruntime:Default, qnn_backend_manager.cc:519 QnnLogging]  <E> contextToBinary: failed to allocate 3848290304 bytes for binary',
    ].join('\n');
    expect(detectMemoryFailure(compileLog)).toEqual({ kind: 'htp-mem-alloc', evidence: expect.stringContaining('contextToBinary: failed to allocate') });
    // A context that does not load on the device (QNN HTP log, as seen with multi-GB contexts).
    const deviceLog = [
      '<E> fastrpc memory map for fd: 33 with length: 817889280 failed with error: 0x1',
      '<E> Failed to map weights buffer to device!',
      '<E> Could not allocate persistent weights buffer!',
      '<E> Context create from binary failed for deviceId 0 coreId 0 pdId 0 err 1002',
    ].join('\n');
    expect(detectMemoryFailure(deviceLog)?.kind).toBe('htp-mem-alloc');
    expect(detectMemoryFailure('contextCreateFromBinary failed. Error: QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation related error.')?.kind).toBe('htp-mem-alloc');
    expect(detectMemoryFailure('Failed to finalize QNN graph. Error code: 1002')?.kind).toBe('htp-mem-alloc');
    expect(detectMemoryFailure('QNN graph finalize failed: 0x3ea')?.kind).toBe('htp-mem-alloc');
    expect(detectMemoryFailure('terminate called after throwing an instance of \'std::bad_alloc\'')?.kind).toBe('host-oom');
  });

  it('does not mistake a healthy log for one', () => {
    const healthy = [
      '[V:onnxruntime:Default, qnn_backend_manager.cc:519 QnnLogging] vtcm_wrapper.cc:160:Allocated 8388608 bit DDR yield buffer 0x7fc69a7f3100.',
      '[V:onnxruntime:Default, qnn_backend_manager.cc:519 QnnLogging]  <W> StaticRecyclingKeyManager depth exceeded. Dynamic memory being allocated.',
      'OpO=3;...;memory_alloc_limit=3584;P=0;num_prepare_threads=1;',
      '[V:onnxruntime:, qnn_execution_provider.cc:1713 LogNodeSupport] QNN EP does not support IsInf on the HTP backend (graphFinalize fails with error 1002 / QNN_COMMON_ERROR_MEM_ALLOC).',
      'qnn_compile: shard0.decode.onnx: 28 nodes stayed on CPU (DequantizeLinear x28)',
    ].join('\n');
    expect(detectMemoryFailure(healthy)).toBeNull();
  });
});
