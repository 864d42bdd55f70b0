// The Hexagon targets forge knows. Every number carries its source; where a number was not measured
// on that arch, the comment says what it is borrowed from.
//
// Sources:
//  [ort-soc]  onnxruntime core/providers/qnn/soc_utils.cc (soc_model ids)
//  [et-qc]    executorch backends/qualcomm/serialization/qc_schema.py (soc ids, 4 GB per-context note)
//  [seeds]    the hand-made seed bundles and their issues (shared/REFERENCE.md "Limits seen"):
//             a ~3.6 GB v81 context fails with MEM_ALLOC (0x3ea), ~1.8 GB shards load; the HTP
//             process domain is ~3.5–4 GB; ~8 concurrent contexts.
//  [phimoe]   the hand-made Phi-tiny-MoE bundle (issue 14): on v81, 7 contexts holding 64 graphs
//             (per-layer decode graphs and their batched-prefill twins) exhausted the unsigned
//             protection domain's cDSP heap during graph setup and rebooted the phone, while its 4
//             decode-only contexts load; on v79 the full 7-context, 64-graph bundle runs.
//  [qnn-probe] oracles/qnn_probe.py forms --only bits=4 (onnxruntime-qnn 2.7.0, QAIRT 2.51), one
//             2048×2048 linear, compiled offline for soc_model 43, 57, 69 and 87 alike: MatMulNBits
//             bits=4 with blocks 32, 64 and 128 leaves no node on the CPU, context binaries of
//             2,428,928 / 2,293,760 / 2,228,224 bytes (0.579 / 0.547 / 0.531 bytes a weight); block
//             32 on the x86 HTP simulator matches ORT CPU at cosine 0.99999988 (shared/REFERENCE.md).
//             Compiled, not run on a phone.
//  [qnn-pad]  oracles/qnn_probe.py padded (same toolchain): MatMulNBits whose K its block_size does
//             not divide stays on the CPU ("K must be divisible by block_size"); Pad(constant 0) of
//             the input → MatMulNBits on the zero-padded weight leaves no node on the CPU, bits 8
//             and 4, for soc_model 43, 57, 69 and 87 on 64×120 and 64×150 linears (padded to 128
//             and 160), and for 69 and 87 on 2048×2040 (padded to 2048): 4,292,608 bytes at bits 8
//             (fp16 Gemm 8,417,280), 2,433,024 at bits 4; on the x86 HTP simulator within cosine
//             0.99999991 of the unpadded x·dequant(W)ᵀ (quant/pad.ts). Compiled and simulated, not
//             run on a phone.

export type ArchId = 'v73' | 'v75' | 'v79' | 'v81';

export interface KnownBlock {
  id: string;
  what: string;
  source: string;
}

export interface HexagonArch {
  id: ArchId;
  soc: string;
  marketingName: string;
  /** QNN soc_model id; always passed numerically to the compiler. */
  socModel: number;
  /** QNN dsp_arch string. */
  dspArch: ArchId;
  vtcmMb: number;
  /** Largest bytes of weights we plan into one context: the known-good size plus a margin, never the failing size. */
  contextCeilingBytes: number;
  /** How many contexts a bundle may ask the runtime to hold. */
  maxContexts: number;
  /**
   * How many graphs one process may set up across all its contexts (each graph's setup takes cDSP
   * heap in the unsigned protection domain). A known-good count, never a failing one.
   */
  maxGraphsPerProcess: number;
  /** Activation dtypes the HTP compiles on this arch. */
  bf16: boolean;
  knownBlocks: KnownBlock[];
  sources: string[];
}

const GB = 1_000_000_000;

// [seeds] 1.81 GB shards load on v81, 3.6 GB fails: the ceiling sits just above the proven size
// (10% headroom over 1.81 GB) and far below the failure, so a plan never reaches untested ground.
const V81_CEILING = 2.0 * GB;

// [phimoe] On v81 64 graphs fail and the bundle's 4 decode-only contexts load, but the source gives
// their contexts, not their graph count. 34 is an inference, not a measurement: the graphs of the
// decode-only bundle as issue 14 describes the hand-made one (per layer an attention+router graph,
// 32, one fused expert graph serving every layer, the lm-head), which loaded. It stands as the
// known-good count until a v81 run measures where between it and 64 the bound lies. v79 ran all 64.
const V81_GRAPHS = 34;
const V79_GRAPHS = 64;

const commonBlocks: KnownBlock[] = [
  // The seeds' "W4 weights do not compile on HTP" held for their older QAIRT, not for the pinned one.
  { id: 'w4-form', what: 'W4 weights compile only as com.microsoft MatMulNBits(bits=4) (blocks 32, 64, 128 measured; forge uses 32); a per-channel DequantizeLinear → Gemm stays on the CPU', source: '[qnn-probe]' },
  { id: 'matmulnbits-k', what: 'MatMulNBits compiles only with in-features K a multiple of its block_size (else it stays on the CPU): forge zero-pads such a matrix\'s in-features and pads its input (Pad, constant 0), which compiles whole', source: '[qnn-pad]' },
  { id: 'proto-2gb', what: 'ONNX protobuf limit of 2 GB: weights always go to external data', source: 'protobuf' },
];

export const ARCHES: Record<ArchId, HexagonArch> = {
  v73: {
    id: 'v73', soc: 'SM8550', marketingName: 'Snapdragon 8 Gen 2',
    socModel: 43, // [ort-soc]
    dspArch: 'v73', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // not measured on v73: borrowed from v81 [seeds]
    maxContexts: 8, // not measured on v73: borrowed from [seeds]
    maxGraphsPerProcess: V81_GRAPHS, // not measured on v73: borrowed from v81 [phimoe], the lower known-good count
    bf16: false,
    knownBlocks: [...commonBlocks],
    sources: ['[ort-soc]', '[et-qc]', '[seeds] (borrowed)', '[qnn-probe]', '[qnn-pad]'],
  },
  v75: {
    id: 'v75', soc: 'SM8650', marketingName: 'Snapdragon 8 Gen 3',
    socModel: 57, // [ort-soc]
    dspArch: 'v75', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // not measured on v75: borrowed from v81 [seeds]
    maxContexts: 8, // not measured on v75: borrowed from [seeds]
    maxGraphsPerProcess: V81_GRAPHS, // not measured on v75: borrowed from v81 [phimoe], the lower known-good count
    bf16: false,
    knownBlocks: [...commonBlocks],
    sources: ['[ort-soc]', '[et-qc]', '[seeds] (borrowed)', '[qnn-probe]', '[qnn-pad]'],
  },
  v79: {
    id: 'v79', soc: 'SM8750', marketingName: 'Snapdragon 8 Elite',
    socModel: 69, // [ort-soc]
    dspArch: 'v79', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // not measured on v79: borrowed from v81 [seeds]; [et-qc] says 4 GB
    maxContexts: 8, // [seeds]
    maxGraphsPerProcess: V79_GRAPHS, // [phimoe]: known good 64 (the whole bundle ran); no failure seen
    bf16: false,
    knownBlocks: [...commonBlocks],
    sources: ['[ort-soc]', '[et-qc]', '[seeds]', '[phimoe]', '[qnn-probe]', '[qnn-pad]'],
  },
  v81: {
    id: 'v81', soc: 'SM8850', marketingName: 'Snapdragon 8 Elite Gen 5',
    socModel: 87, // [ort-soc]
    dspArch: 'v81', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // [seeds]
    maxContexts: 8, // [seeds]
    maxGraphsPerProcess: V81_GRAPHS, // [phimoe]: known good 34 (inferred, see V81_GRAPHS); known bad 64
    bf16: false, // bf16 needs soc_model >= 88 [ort-soc]
    knownBlocks: [
      ...commonBlocks,
      { id: 'mixed-int16-float', what: 'int16 and float activations in one context fail to compose', source: '[seeds]' },
      { id: 'cdsp-heap', what: '64 graphs in 7 contexts (decode + batched prefill) exhaust the unsigned PD\'s cDSP heap during graph setup and reboot the phone; the 4 decode-only contexts load (phi-tiny-moe v81 ships decode-only): maxGraphsPerProcess', source: '[phimoe]' },
      { id: 'ctx-3.6gb', what: 'a ~3.6 GB context fails with MEM_ALLOC (0x3ea)', source: '[seeds]' },
    ],
    sources: ['[ort-soc]', '[et-qc]', '[seeds]', '[phimoe]', '[qnn-probe]', '[qnn-pad]'],
  },
};

export const ARCH_IDS = Object.keys(ARCHES) as ArchId[];

export class UnknownArchError extends Error {
  constructor(given: string) {
    super(`unknown arch '${given}': valid arches are ${ARCH_IDS.join(', ')}`);
    this.name = 'UnknownArchError';
  }
}

export function getArch(id: string): HexagonArch {
  if (!(ARCH_IDS as string[]).includes(id)) throw new UnknownArchError(id);
  return ARCHES[id as ArchId];
}
