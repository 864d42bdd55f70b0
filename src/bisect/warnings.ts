// forge bisect's "no fault" is not "nothing to watch": a layer far weaker than the others while
// passing, and a shipped logit error large against the model's own margins, are what a real model
// with smaller margins, or a longer conversation, would not survive. Said beside the verdict, from
// figures the bisect already has (the oracle's per-layer rows and chained logit error, the trace's
// margins): nothing is rebuilt.
import type { LayerFigures } from './locate.js';
import { nearTies } from '../bundle/confidence.js';
import type { RoutingTally } from '../families/types.js';
import { flipText } from '../gates/oracle.js';

export interface Warning {
  kind: 'weak-layer' | 'logit-error' | 'routing';
  text: string;
}

/** How many times the median's distance from cosine 1 a layer's must be to stand out, and the least that counts. */
const OUTLIER = 4;
const MIN_DISTANCE = 1e-3;
/** A layer passing within this share of the gate's headroom (1 − threshold) passes by a hair. */
const NEAR = 0.1;

/**
 * The weakest layers (shipped, along the chain) that stand out from the median or pass the
 * `threshold` by a hair, and the steps HF decides by less than twice the shipped graphs' chained
 * logit error; for a family that routes on the host, the decisions where the chained router picks
 * other experts than HF's (the runtime held all the same: HF's gaps there are small, or the flip did
 * not reach the token).
 */
export function noFaultWarnings(layers: LayerFigures[], threshold: number, shippedLogitError: number | undefined, stepMargins: number[], routing?: RoutingTally): Warning[] {
  const out: Warning[] = [];
  const shipped = layers.filter((l) => l.shipped !== undefined).map((l) => ({ layer: l.layer, d: 1 - l.shipped! }));
  if (shipped.length >= 3) {
    const sorted = shipped.map((x) => x.d).sort((a, b) => a - b);
    const median = sorted[Math.floor(sorted.length / 2)];
    const weak = shipped.filter((x) => x.d >= MIN_DISTANCE && x.d > OUTLIER * Math.max(median, 1e-9)).sort((a, b) => b.d - a.d);
    if (weak.length) {
      out.push({ kind: 'weak-layer', text: `${weak.map((w) => `layer ${w.layer} keeps ${(1 - w.d).toFixed(5)}`).join(', ')} against a median of ${(1 - median).toFixed(5)} over ${shipped.length} layers: it passes, and it is where drift would start` });
    }
    // At a coarse precision every layer is far from 1 and none stands out from the median; one that
    // clears the gate by a sliver of its headroom is still where the next input would fail it.
    const hair = shipped.filter((x) => !weak.includes(x) && 1 - x.d - threshold < NEAR * (1 - threshold)).sort((a, b) => b.d - a.d);
    const rest = shipped.filter((x) => !hair.includes(x) && !weak.includes(x));
    if (hair.length) {
      const others = rest.length ? ` (the other layers ${(1 - Math.max(...rest.map((x) => x.d))).toFixed(5)} or more)` : '';
      out.push({ kind: 'weak-layer', text: `${hair.map((w) => `layer ${w.layer} keeps ${(1 - w.d).toFixed(5)}, ${(1 - w.d - threshold).toFixed(5)} above the ${threshold} gate`).join(', ')}${others}: it passes by a hair, and it is where drift would start` });
    }
  }
  if (shippedLogitError !== undefined && stepMargins.length) {
    const close = nearTies({ stepMargins }, shippedLogitError);
    const min = Math.min(...stepMargins);
    if (close) out.push({ kind: 'logit-error', text: `the shipped graphs move the logits by up to ${shippedLogitError.toFixed(4)}: ${close} of ${stepMargins.length} traced steps have HF margins under twice that (smallest ${min.toFixed(4)}) and could flip on another run or input` });
  }
  if (routing?.flips.length) {
    const f = routing.flips;
    out.push({ kind: 'routing', text: `the shipped router picks other experts than HF at ${f.length} of ${routing.decisions} decisions, e.g. prompt ${f.slice(0, 2).map((x) => `${x.prompt} ${flipText(x)}`).join(' and prompt ')}${f.length > 2 ? ` (${f.length - 2} more)` : ''}: the tokens held, and it is where routing would flip one` });
  }
  return out;
}
