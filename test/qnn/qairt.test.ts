// The classic QAIRT SDK path: the commands and config files it would run. No SDK is installed where
// these tests run, so they pin the plan, not its execution.
import { describe, it, expect } from 'vitest';
import { contextBinaryFacts, contextConfig, htpConfig, qairtPlan, qnnGraphName } from '../../src/toolchain/qnn/qairt.js';
import { qairtSdk, type QairtSdk } from '../../src/toolchain/qnn/qairt-sdk.js';

const SDK: QairtSdk = { root: '/opt/qairt', bin: '/opt/qairt/bin/x86_64-linux-clang', lib: '/opt/qairt/lib/x86_64-linux-clang', python: '/opt/qairt/lib/python' };
const V81 = { socModel: 87, dspArch: 'v81', vtcmMb: 8 };

describe('QAIRT SDK discovery', () => {
  it('is off when QAIRT_SDK_ROOT is not set', () => {
    expect(qairtSdk({})).toBeNull();
  });

  it('names what is missing from a QAIRT_SDK_ROOT that is not an SDK, and how to fix it', () => {
    expect(() => qairtSdk({ QAIRT_SDK_ROOT: '/opt/empty' }, () => false)).toThrow(
      /QAIRT_SDK_ROOT=\/opt\/empty is not a usable QAIRT SDK: missing \/opt\/empty\/bin\/x86_64-linux-clang\/qnn-onnx-converter.*unset it to use onnxruntime-qnn/);
  });

  it('finds the tools and libraries of a complete SDK', () => {
    expect(qairtSdk({ QAIRT_SDK_ROOT: '/opt/qairt' }, () => true)).toEqual(SDK);
  });
});

describe('QAIRT configs', () => {
  it('writes the HTP config with graph names, O level, VTCM, fp16, device and weight sharing', () => {
    expect(htpConfig({ graphNames: ['shard0_prefill', 'shard0_decode'], arch: V81, fp16: true, weightSharing: true })).toEqual({
      graphs: [{ graph_names: ['shard0_prefill', 'shard0_decode'], O: 3, vtcm_mb: 8, fp16_relaxed_precision: 1 }],
      devices: [{ soc_model: 87, dsp_arch: 'v81' }],
      context: { weight_sharing_enabled: true },
    });
  });

  it('wraps the HTP config in backend_extensions (unwrapped, the generator ignores it silently)', () => {
    expect(contextConfig(SDK, '/out/htp.json')).toEqual({
      backend_extensions: { shared_library_path: '/opt/qairt/lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so', config_file_path: '/out/htp.json' },
    });
  });

  it('names graphs as C identifiers', () => {
    expect(qnnGraphName('/b/shard0.prefill.onnx')).toBe('shard0_prefill');
    expect(qnnGraphName('0-lm.onnx')).toBe('g_0_lm');
  });
});

describe('QAIRT plan for one weight-shared context', () => {
  const plan = qairtPlan({ sdk: SDK, graphs: ['/b/shard0.prefill.onnx', '/b/shard0.decode.onnx'], outDir: '/out', contextName: 'shard0', arch: V81, fp16: true, qdqWeights: true });

  it('converts each graph, builds a model library for each, then one context binary from both, then reads it back', () => {
    expect(plan.steps.map((s) => s.argv)).toEqual([
      ['/opt/qairt/bin/x86_64-linux-clang/qnn-onnx-converter', '--input_network', '/b/shard0.prefill.onnx', '--output_path', '/out/model/shard0_prefill.cpp', '--preserve_io_datatype', '--float_bitwidth', '16', '--float_fallback'],
      ['/opt/qairt/bin/x86_64-linux-clang/qnn-model-lib-generator', '-c', '/out/model/shard0_prefill.cpp', '-b', '/out/model/shard0_prefill.bin', '-t', 'x86_64-linux-clang', '-l', 'shard0_prefill', '-o', '/out/libs'],
      ['/opt/qairt/bin/x86_64-linux-clang/qnn-onnx-converter', '--input_network', '/b/shard0.decode.onnx', '--output_path', '/out/model/shard0_decode.cpp', '--preserve_io_datatype', '--float_bitwidth', '16', '--float_fallback'],
      ['/opt/qairt/bin/x86_64-linux-clang/qnn-model-lib-generator', '-c', '/out/model/shard0_decode.cpp', '-b', '/out/model/shard0_decode.bin', '-t', 'x86_64-linux-clang', '-l', 'shard0_decode', '-o', '/out/libs'],
      ['/opt/qairt/bin/x86_64-linux-clang/qnn-context-binary-generator',
        '--model', '/out/libs/x86_64-linux-clang/libshard0_prefill.so,/out/libs/x86_64-linux-clang/libshard0_decode.so',
        '--backend', '/opt/qairt/lib/x86_64-linux-clang/libQnnHtp.so', '--binary_file', 'shard0', '--output_dir', '/out', '--config_file', '/out/context_config.json'],
      ['/opt/qairt/bin/x86_64-linux-clang/qnn-context-binary-utility', '--context_binary', '/out/shard0.bin', '--json_file', '/out/shard0.info.json'],
    ]);
    expect(plan.bin).toBe('/out/shard0.bin');
  });

  it('writes the wrapped config and the HTP config naming both graphs for v81', () => {
    const files = Object.fromEntries(plan.files.map((f) => [f.path, JSON.parse(f.contents)]));
    expect(files['/out/context_config.json'].backend_extensions.config_file_path).toBe('/out/htp.json');
    expect(files['/out/htp.json'].graphs[0].graph_names).toEqual(['shard0_prefill', 'shard0_decode']);
    expect(files['/out/htp.json'].devices).toEqual([{ soc_model: 87, dsp_arch: 'v81' }]);
    expect(files['/out/htp.json'].context.weight_sharing_enabled).toBe(true);
  });

  it('runs the tools with the SDK environment (what envsetup.sh would set)', () => {
    expect(plan.env).toMatchObject({ QNN_SDK_ROOT: '/opt/qairt', LD_LIBRARY_PATH: expect.stringMatching(/^\/opt\/qairt\/lib\/x86_64-linux-clang/), PYTHONPATH: expect.stringMatching(/^\/opt\/qairt\/lib\/python/) });
  });

  it('keeps float weights float (no --float_fallback) and shares no weights in a one-graph context', () => {
    const q = qairtPlan({ sdk: SDK, graphs: ['/b/lm_head.onnx'], outDir: '/out', contextName: 'lm_head', arch: V81, fp16: true, qdqWeights: false });
    expect(q.steps[0].argv.slice(5)).toEqual(['--preserve_io_datatype', '--float_bitwidth', '16']);
    expect(JSON.parse(q.files.find((f) => f.path.endsWith('htp.json'))!.contents).context.weight_sharing_enabled).toBe(false);
  });
});

describe('reading back what a binary targets', () => {
  it('finds soc model, arch and graph names wherever the utility puts them', () => {
    const doc = { info: { socModel: 87, contextMetadata: {}, hwInfo: { dspArch: 81 }, graphs: [{ info: { graphName: 'shard0_prefill' } }, { info: { graphName: 'shard0_decode' } }] } };
    expect(contextBinaryFacts(doc)).toEqual({ socModel: 87, dspArch: 'v81', graphs: ['shard0_prefill', 'shard0_decode'] });
    expect(contextBinaryFacts({ soc_model: '69', dsp_arch: 'v79' })).toEqual({ socModel: 69, dspArch: 'v79', graphs: [] });
  });
});
