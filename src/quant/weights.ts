// How checkpoint tensors become graph weights under a quant scheme — the one place that decides the
// ONNX form of a quantized weight. W4 (quant/w4.ts: blocks of 32) has two forms, one per compile
// toolchain, with the same codes and scales: com.microsoft MatMulNBits(bits=4) for onnxruntime-qnn,
// and in the 'qdq' form an int4 weight → DequantizeLinear(axis 1, block_size 32) → Gemm for the
// QAIRT converter (quant/w4-qdq.ts: why, and the opset-21 graph it needs). A matrix whose
// in-features the block does not divide is stored zero-padded and its input padded in the graph
// (quant/pad.ts), and the store records each matrix's precision (precisions()). W8 has two forms
// likewise, with the same codes and scales (so the same numbers on the CPU):
//  - 'matmulnbits' (onnxruntime-qnn): com.microsoft MatMulNBits(bits=8). The QNN EP compiles it with
//    int8 weights and float activations; a per-channel DequantizeLinear → Gemm is left on the CPU by
//    the QNN EP, its weights never reaching the context binary (see the issue notes for the sizes).
//  - 'qdq' (the QAIRT converter): int8 weight → DequantizeLinear(axis 0) → Gemm, the QDQ form
//    qnn-onnx-converter reads as weight encodings (--float_fallback keeps the rest float).
// Each tensor is streamed row chunk by row chunk from safetensors into a data file shared by every
// graph of a context (prefill and decode read the same bytes), and each graph that uses it gets a
// reference plus the few nodes that turn it into float. The reference export's fp32 weights are not
// written at all when the store is given checkpoint links: each is the checkpoint tensor itself, in
// its stored dtype, Cast to float in the graph (bf16 and f16 widen to f32 exactly).
import type { Checkpoint } from '../io/checkpoint.js';
import { bf16ToF32Array, f32ToF16Array } from '../io/dtype.js';
import { MS_DOMAIN, type GraphBuilder } from '../onnx/builder.js';
import { linear as gemmLinear } from '../families/blocks.js';
import { ELEM, type WeightElemType } from '../onnx/dtype.js';
import type { ExternalDataWriter, ExternalRef } from '../onnx/external.js';
import type { CheckpointLinks } from '../onnx/linked-data.js';
import type { DType } from '../io/dtype.js';
import type { QuantScheme } from '../recipe/schema.js';
import { quantizeRows, w8BlockSize, w8Precision } from './w8.js';
import { quantizeW4Rows, W4_BLOCK, w4Precision, type MatrixPrecision } from './w4.js';
import { PrecisionChooser } from './precision.js';
import { padColumns } from './pad.js';
import { toOnnxInt4, W4_QDQ_OPSET } from './w4-qdq.js';
import type { Bf16W8 } from './w8-simd.js';

/** Rows [first, end) of a matrix [out, in]: what a graph reads when it uses only those outputs. */
export type RowRange = readonly [number, number];

/** The ONNX form of a W8 (and W4) weight: what the compile toolchain reads as quantized weights (see above). */
export type W8Form = 'matmulnbits' | 'qdq';

interface Stored {
  dtype: WeightElemType;
  dims: number[];
  ref: ExternalRef;
  scale?: { ref: ExternalRef; dims: number[] };
  /** MatMulNBits' block, or the block of a blocked DequantizeLinear (W4 QDQ). */
  blockSize?: number;
  /** MatMulNBits' bits (W8 and W4 in their 'matmulnbits' forms); absent for float and QDQ weights. */
  bits?: 4 | 8;
}

/** A matmul weight as a graph stores it: its precision, and why when it is not the scheme asked for. */
export interface MatrixEntry extends MatrixPrecision {
  tensor: string;
  shape: number[];
}

/** Checkpoint dtypes a graph can read in place (Cast to float where not f32). */
const IN_PLACE: Partial<Record<DType, WeightElemType>> = { BF16: 'bfloat16', F16: 'float16', F32: 'float32' };

/** Row chunks of about this many f32 bytes: big enough for throughput, small enough for memory. */
const CHUNK_BYTES = 8 << 20;
/** bf16 sources stream in chunks of this many checkpoint bytes, this many reads ahead of the one converted. */
const RAW_CHUNK_BYTES = 4 << 20;
const READS_AHEAD = 2;

type Write = (chunk: Uint8Array) => Promise<void>;

/**
 * A tensor whose fp16 form also goes, whole, to a sink of its own: the tied embedding's host table,
 * converted once for both. `written` says whether a graph stored the tensor in fp16 (else the
 * caller writes the table itself).
 */
export class F16Copy {
  written = false;
  constructor(readonly tensor: string, readonly sink: ExternalDataWriter) {}
}

export interface WeightStoreOptions {
  /** Called once per stored tensor (progress). */
  onTensor?: (name: string) => void;
  f16Copy?: F16Copy;
  w8Form?: W8Form;
  /** fp32 weights are referenced in the checkpoint's own files through these links, not converted and written. */
  inPlace?: CheckpointLinks;
  /** Per-matrix precision (recipe overrides, the auto map); default: every matrix in its graph's scheme. */
  precision?: PrecisionChooser;
}

export class WeightStore {
  private readonly stored = new Map<string, Stored>();
  private readonly matrices = new Map<string, MatrixEntry>();
  private work: Bf16W8 | undefined;
  private readonly onTensor: (name: string) => void;
  private readonly f16Copy: F16Copy | undefined;
  private readonly w8Form: W8Form;
  private readonly inPlace: CheckpointLinks | undefined;
  private readonly chooser: PrecisionChooser;

  constructor(private readonly ckpt: Checkpoint, private readonly sink: ExternalDataWriter, o: WeightStoreOptions = {}) {
    this.onTensor = o.onTensor ?? (() => {});
    this.f16Copy = o.f16Copy;
    this.w8Form = o.w8Form ?? 'matmulnbits';
    this.inPlace = o.inPlace;
    this.chooser = o.precision ?? new PrecisionChooser();
  }

  /**
   * Input and output regions of at least `bytes` each, reused tensor after tensor. The kernels'
   * module is loaded here, on first use: compiling them (wabt) costs ~0.1 s that only an export
   * should pay, not every forge command that imports this file.
   */
  private async workspace(bytes: number): Promise<Bf16W8> {
    if (!this.work || this.work.regions[0].byteLength < bytes) {
      const size = Math.max(RAW_CHUNK_BYTES, bytes);
      const { Bf16W8 } = await import('./w8-simd.js');
      // Input chunks, then output chunks of twice the size (f32 from bf16 doubles the bytes).
      this.work = new Bf16W8([...new Array(READS_AHEAD + 1).fill(size), size * 2, size * 2]);
    }
    return this.work;
  }

  /**
   * Streams a bf16 tensor's rows [first, first + rows) through `convert` (input region → bytes in an output region) to
   * `writes`: the reads of the next chunks and the writes of the previous one overlap converting
   * this one.
   */
  private async streamBf16(name: string, first: number, rows: number, cols: number, writes: Write[], convert: (src: Uint16Array, out: Uint8Array, r0: number) => Uint8Array): Promise<void> {
    const regions = (await this.workspace(cols * 2)).regions;
    const ins = regions.slice(0, READS_AHEAD + 1);
    const outs = regions.slice(READS_AHEAD + 1);
    const rowsPerChunk = Math.max(1, Math.floor(ins[0].byteLength / (cols * 2)));
    const chunks = Math.ceil(rows / rowsPerChunk);
    // Chunk i lands in ins[i % ins.length]: issued once chunk i − ins.length is converted.
    const read = (i: number) => {
      const r0 = i * rowsPerChunk;
      return this.ckpt.readRowsRawInto(name, first + r0, ins[i % ins.length].subarray(0, Math.min(rowsPerChunk, rows - r0) * cols * 2));
    };
    const reading: Array<Promise<Uint8Array>> = [];
    for (let i = 0; i < Math.min(READS_AHEAD, chunks); i++) reading.push(read(i));
    const writing: Array<Promise<unknown>> = outs.map(() => Promise.resolve());
    try {
      for (let i = 0; i < chunks; i++) {
        const bytes = await reading.shift()!;
        if (i + READS_AHEAD < chunks) reading.push(read(i + READS_AHEAD));
        await writing[i % outs.length];
        const out = convert(new Uint16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 2), outs[i % outs.length], i * rowsPerChunk);
        writing[i % outs.length] = Promise.all(writes.map((w) => w(out)));
      }
      await Promise.all(writing);
    } catch (e) {
      await Promise.allSettled([...reading, ...writing]);
      throw e;
    }
  }

  private shapeOf(name: string, expected: number[]): number[] {
    return [...this.ckpt.expectShape(name, expected).shape];
  }

  private async store(name: string, expected: number[], scheme: QuantScheme | 'f32-small', range?: RowRange, scale = 1): Promise<Stored> {
    const key = `${name}${range ? `[${range[0]}:${range[1]}]` : ''}@${scheme}${scale !== 1 ? `×${scale}` : ''}`;
    const hit = this.stored.get(key);
    if (hit) return hit;
    const whole = this.shapeOf(name, expected);
    const all = whole.length > 1 ? whole[0] : 1;
    const cols = whole.reduce((a, b) => a * b, 1) / all;
    // A row range stores rows [first, end) only, as if they were the whole tensor.
    const [first, end] = range ?? [0, all];
    if (range && !(Number.isInteger(first) && Number.isInteger(end) && first >= 0 && first < end && end <= all && whole.length === 2)) {
      throw new Error(`${name}: rows [${first}, ${end}) are not a row range of [${whole}]`);
    }
    const rows = end - first;
    const dims = range ? [rows, cols] : whole;
    const rowsPerChunk = Math.max(1, Math.floor(CHUNK_BYTES / (cols * 4)));
    const bf16 = this.ckpt.info(name).dtype === 'BF16';
    // The in-features as stored: zero-padded where MatMulNBits' block does not divide them.
    const k = (scheme === 'w4' || scheme === 'w8' ? this.precisionOf(scheme, cols).paddedTo : undefined) ?? cols;
    // Rows [n, cols] as quantized: widened to [n, k] with zero columns when padded.
    const wide = k !== cols ? new Float32Array(rowsPerChunk * k) : undefined;
    const asStored = (data: Float32Array, n: number) => (wide ? padColumns(data, cols, k, wide.subarray(0, n * k)) : data);
    let stored: Stored;
    // In place means the whole tensor's bytes in its file: a row range is converted like any other weight.
    const inPlace = scheme === 'fp32' && this.inPlace && !range && scale === 1 ? IN_PLACE[this.ckpt.info(name).dtype] : undefined;
    // A power-of-two weight scale (a gated MLP's rescale): a quantized matrix keeps its codes and
    // scales its scales; a float one is scaled as it is read (the bf16 fast paths do not scale).
    const scaled = (x: Float32Array) => (scale !== 1 && x.forEach((v, i) => (x[i] = v * scale)), x);
    if (inPlace) {
      stored = { dtype: inPlace, dims, ref: await this.checkpointBytes(name, ELEM[inPlace].bytes) };
    } else if (scheme === 'w8' && bf16 && !wide) {
      const scales = new Float32Array(rows);
      const ref = await this.sink.appendStream(rows * cols, (write) =>
        this.streamBf16(name, first, rows, cols, [write], (src, out, r0) => {
          const codes = out.subarray(0, src.length);
          this.work!.quantize(src, cols, codes, scales.subarray(r0, r0 + src.length / cols), this.zeroPoint());
          return codes;
        }),
      );
      stored = this.w8Scales(name, rows, cols, scaled(scales), ref);
    } else if (scheme === 'fp16' && bf16 && scale === 1) {
      const copy = this.f16Copy && !this.f16Copy.written && this.f16Copy.tensor === name && !range ? this.f16Copy : undefined;
      const toF16 = (write: Write[]) =>
        this.streamBf16(name, first, rows, cols, write, (src, out) => {
          this.work!.toF16(src, new Uint16Array(out.buffer, out.byteOffset, src.length));
          return out.subarray(0, src.byteLength);
        });
      const ref = await this.sink.appendStream(rows * cols * 2, (write) =>
        copy ? copy.sink.appendStream(rows * cols * 2, (w2) => toF16([write, w2])).then(() => void (copy.written = true)) : toF16([write]),
      );
      stored = { dtype: 'float16', dims, ref };
    } else if (scheme === 'fp32' && bf16 && scale === 1) {
      // The reference export: bf16 widens to f32 exactly, so this is a shift, streamed like the rest.
      const ref = await this.sink.appendStream(rows * cols * 4, (write) =>
        this.streamBf16(name, first, rows, cols, [write], (src, out) => {
          bf16ToF32Array(src, new Float32Array(out.buffer, out.byteOffset, src.length));
          return out.subarray(0, src.length * 4);
        }),
      );
      stored = { dtype: 'float32', dims, ref };
    } else if (scheme === 'w4') {
      // Memory stays one chunk plus the scales (an eighth of the tensor's element count in bytes),
      // appended after the codes. bf16 streams through the SIMD kernel like W8 (same codes and
      // scales as quantizeW4Rows) unless its in-features are padded; the rest goes in row chunks
      // through quantizeW4Rows. The QDQ form stores the same nibbles as ONNX int4 (toOnnxInt4).
      const blocks = k / W4_BLOCK;
      const scales = new Float32Array(rows * blocks);
      const qdq = this.w8Form === 'qdq';
      const ref = bf16 && !wide
        ? await this.sink.appendStream((rows * k) / 2, (write) =>
            this.streamBf16(name, first, rows, cols, [write], (src, out, r0) => {
              const q = this.work!.quantizeW4(src, cols, out);
              scales.set(q.scales, r0 * blocks);
              return qdq ? toOnnxInt4(q.codes) : q.codes;
            }),
          )
        : await this.sink.appendChunked((rows * k) / 2, async (write) => {
            const f32 = new Float32Array(rowsPerChunk * cols);
            const packed = new Uint8Array((rowsPerChunk * k) / 2);
            for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
              const n = Math.min(rowsPerChunk, rows - r0);
              const data = await this.ckpt.readRowsInto(name, first + r0, f32.subarray(0, n * cols));
              quantizeW4Rows(asStored(data, n), k, packed, scales.subarray(r0 * blocks, (r0 + n) * blocks));
              const bytes = packed.subarray(0, (n * k) / 2);
              write(qdq ? toOnnxInt4(bytes) : bytes);
            }
          });
      const scaleRef = this.sink.append(new Uint8Array(scaled(scales).buffer));
      stored = qdq
        ? { dtype: 'int4', dims: [rows, k], ref, scale: { ref: scaleRef, dims: [rows, blocks] }, blockSize: W4_BLOCK }
        : { dtype: 'uint8', dims: [rows, blocks, W4_BLOCK / 2], ref, scale: { ref: scaleRef, dims: [rows * blocks] }, blockSize: W4_BLOCK, bits: 4 };
    } else if (scheme === 'w8') {
      const scales = new Float32Array(rows);
      // One reused input and output buffer per tensor: no garbage per chunk.
      const f32 = new Float32Array(rowsPerChunk * cols);
      const codes = new Uint8Array(rowsPerChunk * k);
      // Zero columns leave each row's max, hence its scale, as it was; they get the zero point's code.
      const ref = await this.sink.appendChunked(rows * k, async (write) => {
        for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
          const n = Math.min(rowsPerChunk, rows - r0);
          const data = await this.ckpt.readRowsInto(name, first + r0, f32.subarray(0, n * cols));
          quantizeRows(asStored(data, n), k, codes, scales.subarray(r0, r0 + n), this.zeroPoint());
          write(codes.subarray(0, n * k));
        }
      });
      stored = this.w8Scales(name, rows, k, scaled(scales), ref);
    } else {
      const half = scheme === 'fp16';
      const bytesPer = half ? 2 : 4;
      const ref = await this.sink.appendChunked(rows * cols * bytesPer, async (write) => {
        for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
          const data = scaled(await this.ckpt.readRows(name, first + r0, Math.min(rowsPerChunk, rows - r0)));
          const out = half ? f32ToF16Array(data) : data;
          write(new Uint8Array(out.buffer, out.byteOffset, out.byteLength));
        }
      });
      stored = { dtype: half ? 'float16' : 'float32', dims, ref };
    }
    this.stored.set(key, stored);
    this.onTensor(name);
    return stored;
  }

  /**
   * The tensor's bytes as the checkpoint stores them: in place through a link to its file, or, when
   * its offset there is misaligned for its elements, copied (still unconverted) into the data file.
   */
  private async checkpointBytes(name: string, elemBytes: number): Promise<ExternalRef> {
    const info = this.ckpt.info(name);
    const linked = this.inPlace!.ref(info, elemBytes);
    if (linked) return linked;
    const rows = this.ckpt.rowCount(name);
    const rowBytes = info.byteLength / rows;
    const buf = new Uint8Array(Math.max(1, Math.floor(RAW_CHUNK_BYTES / rowBytes)) * rowBytes);
    return this.sink.appendChunked(info.byteLength, async (write) => {
      for (let r0 = 0; r0 < rows; r0 += buf.byteLength / rowBytes) {
        const n = Math.min(buf.byteLength / rowBytes, rows - r0);
        write(await this.ckpt.readRowsRawInto(name, r0, buf.subarray(0, n * rowBytes)));
      }
    });
  }

  /** A tensor's fp16 form alone, e.g. into a sink of its own (the host embedding table). */
  async fp16(name: string, shape: number[]): Promise<void> {
    await this.store(name, shape, 'fp16');
  }

  /** MatMulNBits stores unsigned codes with an implicit zero point of 128; QDQ stores int8 (two's complement, zero point 0). */
  private zeroPoint(): number {
    return this.w8Form === 'matmulnbits' ? 128 : 0;
  }

  /** Appends a W8 tensor's scales after its codes: one per row (QDQ), or each row's repeated per MatMulNBits block. */
  private w8Scales(name: string, rows: number, cols: number, scales: Float32Array, ref: ExternalRef): Stored {
    if (this.w8Form === 'qdq') return { dtype: 'int8', dims: [rows, cols], ref, scale: { ref: this.sink.append(new Uint8Array(scales.buffer)), dims: [rows] } };
    // `cols` is a multiple of 16 here: padded where the matrix's own was not (store, w8Precision).
    const blockSize = w8BlockSize(cols, name);
    const blocks = cols / blockSize;
    // Every block of a row shares the row's scale: per-output-channel W8 expressed in MatMulNBits' blocks.
    const blockScales = new Float32Array(rows * blocks);
    for (let r = 0; r < rows; r++) blockScales.fill(scales[r], r * blocks, (r + 1) * blocks);
    const scaleRef = this.sink.append(new Uint8Array(blockScales.buffer));
    return { dtype: 'uint8', dims: [rows, blocks, blockSize], ref, scale: { ref: scaleRef, dims: [rows * blocks] }, blockSize, bits: 8 };
  }

  /**
   * A linear layer x [1, N, in] → [1, N, out] with the checkpoint weight `name` [out, in].
   * fp32: Gemm(transB=1) on the tensor (after a Cast when it is the checkpoint's bf16/f16 bytes in
   * place). fp16: the same after a Cast. w8: MatMulNBits(bits=8) on
   * rank-3 x (the QNN EP refuses rank 2 there), or in the QDQ form Gemm on DequantizeLinear.
   * w4: MatMulNBits(bits=4), or in the QDQ form Gemm on DequantizeLinear(axis 1, block_size 32) of
   * int4 codes (an opset-21 graph). A weight stored with padded in-features reads x padded with zeros
   * to them (Pad, constant 0: quant/pad.ts). The scheme is the graph's; the matrix's own comes from
   * the store's PrecisionChooser (recipe overrides, the auto map). `rows` [first, end): only those
   * rows of the weight (out = end − first), read and stored alone: a graph that uses a slice of a
   * matrix's outputs stores just that slice (Gemma 4's per-layer projection, per shard). `weightScale`: a
   * power of two the weight is multiplied by (an exact rescale: families/blocks.ts gatedMlp).
   */
  async linear(g: GraphBuilder, x: string, name: string, shape: [number, number], scheme: QuantScheme, n: number, bias?: string, rows?: RowRange, weightScale = 1): Promise<string> {
    const inDim = shape[1];
    const out = rows ? rows[1] - rows[0] : shape[0];
    const p = this.chooser.choose(name, scheme);
    const s = await this.store(name, shape, p.scheme, rows, weightScale);
    this.noteMatrix(name, rows ? [out, inDim] : shape, p);
    // A row range is its own initializer (one graph could read two ranges of one tensor).
    const init = rows ? `${name}.rows_${rows[0]}_${rows[1]}` : name;
    const w = g.externalInitializer(init, s.dtype, s.dims, s.ref);
    if (!s.scale) return gemmLinear(g, x, s.dtype === 'float32' ? w : g.op('Cast', [w], { to: 1 }), inDim, out, n, bias);
    const scale = g.externalInitializer(`${init}.scale`, 'float32', s.scale.dims, s.scale.ref);
    if (!s.bits && s.blockSize) {
      const opset = g.opsetVersion() ?? 0;
      if (opset < W4_QDQ_OPSET) throw new Error(`${name}: W4 in QDQ form is an int4 blocked DequantizeLinear, which needs opset ${W4_QDQ_OPSET}; graph ${g.name} imports ${opset}`);
      const kq = s.dims[1];
      return gemmLinear(g, padInput(g, x, init, inDim, kq), g.op('DequantizeLinear', [w, scale], { axis: 1, block_size: s.blockSize }), kq, out, n, bias);
    }
    if (!s.bits) return gemmLinear(g, x, g.op('DequantizeLinear', [w, scale], { axis: 0 }), inDim, out, n, bias);
    const k = s.dims[1] * s.blockSize!; // the in-features as stored: blob [N, K/block, block·bits/8]
    const y = g.op('MatMulNBits', [padInput(g, x, init, inDim, k), w, scale], { K: k, N: out, bits: s.bits, block_size: s.blockSize! }, 1, { domain: MS_DOMAIN });
    return bias ? g.op('Add', [y, bias]) : y;
  }

  /** Records a matrix's precision: the chooser's (and why), then its form's (a padding, and why). */
  private noteMatrix(name: string, shape: [number, number], chosen: MatrixPrecision): void {
    if (this.matrices.has(name)) return;
    const form = this.precisionOf(chosen.scheme, shape[1]);
    const why = [chosen.why, form.why].filter(Boolean).join('; ');
    this.matrices.set(name, { tensor: name, shape: [...shape], ...form, ...(why ? { why } : {}) });
  }

  /** A matrix's precision under the scheme, in this store's W8 form (the QDQ form needs no padding). */
  private precisionOf(scheme: QuantScheme, k: number): MatrixPrecision {
    return scheme === 'w4' ? w4Precision(k) : scheme === 'w8' ? w8Precision(k, this.w8Form) : { scheme };
  }

  /** Each matmul weight the graphs read, in the order first stored, with the precision it got. */
  precisions(): MatrixEntry[] {
    return [...this.matrices.values()];
  }

  /** A small float tensor (norm weight, bias) kept in float32, inline in each graph. */
  async small(g: GraphBuilder, name: string, shape: number[], transform?: (x: Float32Array) => Float32Array): Promise<string> {
    this.shapeOf(name, shape);
    const data = await this.ckpt.readF32(name);
    return g.initializer(name, transform ? transform(data) : data, shape, 'float32');
  }
}

/** x [1, N, in] zero-padded on its last axis to `k` in-features (a padded weight's: quant/pad.ts); x itself when k = in. */
function padInput(g: GraphBuilder, x: string, name: string, inDim: number, k: number): string {
  return k === inDim ? x : g.op('Pad', [x, g.constInt64([0, 0, 0, 0, 0, k - inDim], [6], `${name}.pads`)], { mode: 'constant' });
}
