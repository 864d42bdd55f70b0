// How checkpoint tensors become graph weights under a quant scheme — the one place that decides the
// ONNX form of a quantized weight. Each tensor is streamed row chunk by row chunk from safetensors
// into a data file shared by every graph of a context (prefill and decode read the same bytes), and
// each graph that uses it gets a reference plus the few nodes that turn it into float.
import type { Checkpoint } from '../io/checkpoint.js';
import { f32ToF16Array } from '../io/dtype.js';
import type { GraphBuilder } from '../onnx/builder.js';
import type { ElemType } from '../onnx/dtype.js';
import type { ExternalDataWriter, ExternalRef } from '../onnx/external.js';
import type { QuantScheme } from '../recipe/schema.js';
import { quantizeRows } from './w8.js';

interface Stored {
  dtype: ElemType;
  dims: number[];
  ref: ExternalRef;
  scale?: { ref: ExternalRef; dims: number[] };
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
      const scales = new Float32Array(rows);
      const ref = await this.sink.appendChunked(rows * cols, async (write) => {
        for await (const chunk of this.ckpt.iterRows(name, { rowsPerChunk })) {
          const q = new Int8Array(chunk.rowCount * cols);
          quantizeRows(chunk.data, cols, q, scales.subarray(chunk.rowStart, chunk.rowStart + chunk.rowCount));
          write(new Uint8Array(q.buffer));
        }
      });
      const scaleRef = this.sink.append(new Uint8Array(scales.buffer));
      stored = { dtype: 'int8', dims, ref, scale: { ref: scaleRef, dims: [rows] } };
      this.bytesWritten += rows * cols + rows * 4;
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
   * A linear layer's weight [out, in] as a float32 value for Gemm(transB=1).
   * fp32: the tensor itself. fp16: Cast. w8: DequantizeLinear(int8, per-row float32 scale, axis 0),
   * the weight-only form the QNN HTP folds into an int8 FullyConnected.
   */
  async matmul(g: GraphBuilder, name: string, shape: [number, number], scheme: QuantScheme): Promise<string> {
    const s = await this.store(name, shape, scheme);
    const w = g.externalInitializer(name, s.dtype, s.dims, s.ref);
    if (scheme === 'fp32') return w;
    if (scheme === 'fp16') return g.op('Cast', [w], { to: 1 });
    const scale = g.externalInitializer(`${name}.scale`, 'float32', s.scale!.dims, s.scale!.ref);
    return g.op('DequantizeLinear', [w, scale], { axis: 0 });
  }

  /** A small float tensor (norm weight, bias) kept in float32, inline in each graph. */
  async small(g: GraphBuilder, name: string, shape: number[], transform?: (x: Float32Array) => Float32Array): Promise<string> {
    this.shapeOf(name, shape);
    const data = await this.ckpt.readF32(name);
    return g.initializer(name, transform ? transform(data) : data, shape, 'float32');
  }
}
