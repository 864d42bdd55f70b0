// The Hexagon targets forge knows. Every number carries its source; where a number was not measured
// on that arch, the comment says what it is borrowed from.
//
// Sources:
//  [ort-soc]  onnxruntime core/providers/qnn/soc_utils.cc (soc_model ids)
//  [et-qc]    executorch backends/qualcomm/serialization/qc_schema.py (soc ids, 4 GB per-context note)
//  [seeds]    the hand-made seed bundles and their issues (shared/REFERENCE.md "Limits seen"):
//             a ~3.6 GB v81 context fails with MEM_ALLOC (0x3ea), ~1.8 GB shards load; the HTP
//             process domain is ~3.5–4 GB; ~8 concurrent contexts.

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
  /** Activation dtypes the HTP compiles on this arch. */
  bf16: boolean;
  knownBlocks: KnownBlock[];
  sources: string[];
}

const GB = 1_000_000_000;

// [seeds] 1.81 GB shards load on v81, 3.6 GB fails: the ceiling sits just above the proven size
// (10% headroom over 1.81 GB) and far below the failure, so a plan never reaches untested ground.
const V81_CEILING = 2.0 * GB;

const commonBlocks: KnownBlock[] = [
  { id: 'w4', what: 'W4 weights do not compile on HTP; W8A16 is the floor', source: '[seeds]' },
  { id: 'proto-2gb', what: 'ONNX protobuf limit of 2 GB: weights always go to external data', source: 'protobuf' },
];

export const ARCHES: Record<ArchId, HexagonArch> = {
  v73: {
    id: 'v73', soc: 'SM8550', marketingName: 'Snapdragon 8 Gen 2',
    socModel: 43, // [ort-soc]
    dspArch: 'v73', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // not measured on v73: borrowed from v81 [seeds]
    maxContexts: 8, // not measured on v73: borrowed from [seeds]
    bf16: false,
    knownBlocks: [...commonBlocks],
    sources: ['[ort-soc]', '[et-qc]', '[seeds] (borrowed)'],
  },
  v75: {
    id: 'v75', soc: 'SM8650', marketingName: 'Snapdragon 8 Gen 3',
    socModel: 57, // [ort-soc]
    dspArch: 'v75', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // not measured on v75: borrowed from v81 [seeds]
    maxContexts: 8, // not measured on v75: borrowed from [seeds]
    bf16: false,
    knownBlocks: [...commonBlocks],
    sources: ['[ort-soc]', '[et-qc]', '[seeds] (borrowed)'],
  },
  v79: {
    id: 'v79', soc: 'SM8750', marketingName: 'Snapdragon 8 Elite',
    socModel: 69, // [ort-soc]
    dspArch: 'v79', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // not measured on v79: borrowed from v81 [seeds]; [et-qc] says 4 GB
    maxContexts: 8, // [seeds]
    bf16: false,
    knownBlocks: [...commonBlocks],
    sources: ['[ort-soc]', '[et-qc]', '[seeds]'],
  },
  v81: {
    id: 'v81', soc: 'SM8850', marketingName: 'Snapdragon 8 Elite Gen 5',
    socModel: 87, // [ort-soc]
    dspArch: 'v81', vtcmMb: 8, // [ort-soc]
    contextCeilingBytes: V81_CEILING, // [seeds]
    maxContexts: 8, // [seeds]
    bf16: false, // bf16 needs soc_model >= 88 [ort-soc]
    knownBlocks: [
      ...commonBlocks,
      { id: 'mixed-int16-float', what: 'int16 and float activations in one context fail to compose', source: '[seeds]' },
      { id: 'cdsp-heap', what: 'many graphs exhaust the cDSP heap (phi-tiny-moe v81 ships decode-only)', source: '[seeds]' },
      { id: 'ctx-3.6gb', what: 'a ~3.6 GB context fails with MEM_ALLOC (0x3ea)', source: '[seeds]' },
    ],
    sources: ['[ort-soc]', '[et-qc]', '[seeds]'],
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
