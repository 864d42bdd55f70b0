// How checkpoint tensors become graph weights under a quant scheme — the one place that decides the
// ONNX form of a quantized weight. W8 is com.microsoft MatMulNBits(bits=8): the QNN HTP compiles it
// with int8 weights and float activations (a per-channel DequantizeLinear → Gemm, the obvious form,
// is left on the CPU by the QNN EP, its weights never reaching the context binary — see the issue
// notes for the size evidence). Each tensor is streamed row chunk by row chunk from safetensors
// into a data file shared by every graph of a context (prefill and decode read the same bytes), and
// each graph that uses it gets a reference plus the few nodes that turn it into float.
import type { Checkpoint } from '../io/checkpoint.js';
import { f32ToF16Array } from '../io/dtype.js';
import { MS_DOMAIN, type GraphBuilder } from '../onnx/builder.js';
import { linear as gemmLinear } from '../families/blocks.js';
import type { ElemType } from '../onnx/dtype.js';
import type { ExternalDataWriter, ExternalRef } from '../onnx/external.js';
import type { QuantScheme } from '../recipe/schema.js';
import { quantizeRows, w8BlockSize } from './w8.js';

interface Stored {
  dtype: ElemType;
  dims: number[];
  ref: ExternalRef;
  scale?: { ref: ExternalRef; dims: number[] };
  blockSize?: number;
}


/** Row chunks of about this many f32 bytes: big enough for throughput, small enough for memory. */
const CHUNK_BYTES = 8 << 20;

export class WeightStore {
  private readonly stored = new Map<string, Stored>();
  /** Bytes of weights written, by scheme — the plan's estimate is checked against it. */
  bytesWritten = 0;

  constructor(
    private readonly ckpt: Checkpoint,
    private readonly sink: ExternalDataWriter,
    private readonly onTensor: (name: string) => void = () => {},
  ) {}

  private shapeOf(name: string, expected: number[]): number[] {
    return [...this.ckpt.expectShape(name, expected).shape];
  }

  private async store(name: string, expected: number[], scheme: QuantScheme | 'f32-small'): Promise<Stored> {
    const key = `${name}@${scheme}`;
    const hit = this.stored.get(key);
    if (hit) return hit;
    const dims = this.shapeOf(name, expected);
    const rows = dims.length > 1 ? dims[0] : 1;
    const cols = dims.reduce((a, b) => a * b, 1) / rows;
    const rowsPerChunk = Math.max(1, Math.floor(CHUNK_BYTES / (cols * 4)));
    let stored: Stored;
    if (scheme === 'w8') {
      const blockSize = w8BlockSize(cols, name);
      const blocks = cols / blockSize;
      const scales = new Float32Array(rows);
      // One reused input and output buffer per tensor: no garbage per chunk.
      const f32 = new Float32Array(rowsPerChunk * cols);
      const codes = new Uint8Array(rowsPerChunk * cols);
      const ref = await this.sink.appendChunked(rows * cols, async (write) => {
        for (let r0 = 0; r0 < rows; r0 += rowsPerChunk) {
          const n = Math.min(rowsPerChunk, rows - r0);
          const data = await this.ckpt.readRowsInto(name, r0, f32.subarray(0, n * cols));
          // MatMulNBits stores unsigned codes with an implicit zero point of 128.
          quantizeRows(data, cols, codes, scales.subarray(r0, r0 + n), 128);
          write(codes.subarray(0, n * cols));
        }
      });
      // Every block of a row shares the row's scale: per-output-channel W8 expressed in MatMulNBits' blocks.
      const blockScales = new Float32Array(rows * blocks);
      for (let r = 0; r < rows; r++) blockScales.fill(scales[r], r * blocks, (r + 1) * blocks);
      const scaleRef = this.sink.append(new Uint8Array(blockScales.buffer));
      stored = { dtype: 'uint8', dims: [rows, blocks, blockSize], ref, scale: { ref: scaleRef, dims: [rows * blocks] }, blockSize };
      this.bytesWritten += rows * cols + rows * blocks * 4;
    } else {
      const half = scheme === 'fp16';
      const bytesPer = half ? 2 : 4;
      const ref = await this.sink.appendChunked(rows * cols * bytesPer, async (write) => {
        for await (const chunk of this.ckpt.iterRows(name, { rowsPerChunk })) {
          const out = half ? f32ToF16Array(chunk.data) : chunk.data;
          write(new Uint8Array(out.buffer, out.byteOffset, out.byteLength));
        }
      });
      stored = { dtype: half ? 'float16' : 'float32', dims, ref };
      this.bytesWritten += rows * cols * bytesPer;
    }
    this.stored.set(key, stored);
    this.onTensor(name);
    return stored;
  }

  /**
   * A linear layer x [1, N, in] → [1, N, out] with the checkpoint weight `name` [out, in].
   * fp32: Gemm(transB=1) on the tensor. fp16: the same after a Cast. w8: MatMulNBits(bits=8) on
   * rank-3 x (the QNN EP refuses rank 2 there).
   */
  async linear(g: GraphBuilder, x: string, name: string, shape: [number, number], scheme: QuantScheme, n: number, bias?: string): Promise<string> {
    const [out, inDim] = shape;
    const s = await this.store(name, shape, scheme);
    const w = g.externalInitializer(name, s.dtype, s.dims, s.ref);
    if (scheme !== 'w8') return gemmLinear(g, x, scheme === 'fp16' ? g.op('Cast', [w], { to: 1 }) : w, inDim, out, n, bias);
    const scale = g.externalInitializer(`${name}.scale`, 'float32', s.scale!.dims, s.scale!.ref);
    const y = g.op('MatMulNBits', [x, w, scale], { K: inDim, N: out, bits: 8, block_size: s.blockSize! }, 1, { domain: MS_DOMAIN });
    return bias ? g.op('Add', [y, bias]) : y;
  }

  /** A small float tensor (norm weight, bias) kept in float32, inline in each graph. */
  async small(g: GraphBuilder, name: string, shape: number[], transform?: (x: Float32Array) => Float32Array): Promise<string> {
    this.shapeOf(name, shape);
    const data = await this.ckpt.readF32(name);
    return g.initializer(name, transform ? transform(data) : data, shape, 'float32');
  }
}
