// Not a test: a quick throughput measurement of the bulk dtype conversions.
//   npx tsx test/io/measure-dtype-throughput.ts [million-elements]
// Prints MB/s of input consumed (and M elements/s), median of 7 runs after warm-up.

import { bf16ToF16Array, bf16ToF32Array, f16ToF32Array, f32ToBf16Array, f32ToF16Array } from '../../src/io/dtype.js';

const n = Math.round(Number(process.argv[2] ?? 32) * 1e6);

// Weight-like values: roughly N(0, 0.02), plus a sprinkling of outliers and subnormals.
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
const weights = new Float32Array(n);
for (let i = 0; i < n; i++) {
  const gauss = Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand());
  weights[i] = i % 997 === 0 ? gauss * 300 : i % 991 === 0 ? gauss * 1e-6 : gauss * 0.02;
}
const weightsBf16 = f32ToBf16Array(weights);
const weightsF16 = f32ToF16Array(weights);
const randomBits = new Float32Array(new Uint32Array(n).map(() => (rand() * 2 ** 32) >>> 0).buffer);

const outF32 = new Float32Array(n);
const outU16 = new Uint16Array(n);

function measure(label: string, inputBytes: number, run: () => void): void {
  run(); // warm-up: lets V8 optimise the loop
  const times: number[] = [];
  for (let r = 0; r < 7; r++) {
    const t0 = process.hrtime.bigint();
    run();
    times.push(Number(process.hrtime.bigint() - t0) / 1e9);
  }
  const median = times.sort((a, b) => a - b)[3];
  const mbps = inputBytes / 1e6 / median;
  console.log(`${label.padEnd(34)} ${mbps.toFixed(0).padStart(6)} MB/s in   ${(n / 1e6 / median).toFixed(0).padStart(5)} M elem/s`);
}

console.log(`node ${process.version}, ${n / 1e6} M elements per run`);
measure('bf16 → f32', n * 2, () => bf16ToF32Array(weightsBf16, outF32));
measure('f16 → f32', n * 2, () => f16ToF32Array(weightsF16, outF32));
measure('f32 → f16 (weight-like values)', n * 4, () => f32ToF16Array(weights, outU16));
measure('f32 → f16 (random bit patterns)', n * 4, () => f32ToF16Array(randomBits, outU16));
measure('f32 → bf16', n * 4, () => f32ToBf16Array(weights, outU16));
measure('bf16 → f16', n * 2, () => bf16ToF16Array(weightsBf16, outU16));
