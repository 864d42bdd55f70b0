// Top self-time functions of a V8 .cpuprofile (from `node --cpu-prof`), with file:line, and the
// top lines inside them (positionTicks), so a slow export can be pinned to code.
//
//   node --import tsx bench/cpuprofile-top.ts FILE.cpuprofile [N]
import { readFileSync } from 'node:fs';
import { relative } from 'node:path';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number; columnNumber: number };
  hitCount?: number;
  children?: number[];
  positionTicks?: Array<{ line: number; ticks: number }>;
}
interface Profile { nodes: Node[]; samples: number[]; timeDeltas: number[]; startTime: number; endTime: number }

const [file, nArg] = process.argv.slice(2);
const prof = JSON.parse(readFileSync(file, 'utf8')) as Profile;
const n = Number(nArg ?? 20);
const byId = new Map(prof.nodes.map((x) => [x.id, x]));
// Self time per node from samples × deltas (hitCount alone ignores uneven sampling intervals).
const selfUs = new Map<number, number>();
for (let i = 0; i < prof.samples.length; i++) selfUs.set(prof.samples[i], (selfUs.get(prof.samples[i]) ?? 0) + (prof.timeDeltas[i] ?? 0));
const totalUs = prof.endTime - prof.startTime;

const where = (cf: Node['callFrame']) => {
  const url = cf.url.startsWith('file://') ? relative(process.cwd(), new URL(cf.url).pathname) : cf.url || '(native)';
  return `${cf.functionName || '(anonymous)'} ${url}:${cf.lineNumber + 1}`;
};
const agg = new Map<string, { us: number; lines: Map<number, number> }>();
for (const [id, us] of selfUs) {
  const node = byId.get(id)!;
  const key = where(node.callFrame);
  const a = agg.get(key) ?? { us: 0, lines: new Map() };
  a.us += us;
  for (const t of node.positionTicks ?? []) a.lines.set(t.line, (a.lines.get(t.line) ?? 0) + t.ticks);
  agg.set(key, a);
}
const rows = [...agg.entries()].sort((a, b) => b[1].us - a[1].us).slice(0, n);
process.stdout.write(`profile ${(totalUs / 1e6).toFixed(1)} s\n`);
for (const [key, a] of rows) {
  const lines = [...a.lines.entries()].sort((x, y) => y[1] - x[1]).slice(0, 4).map(([l, t]) => `L${l}:${t}`).join(' ');
  process.stdout.write(`${(a.us / 1e6).toFixed(2).padStart(7)} s ${((100 * a.us) / totalUs).toFixed(1).padStart(5)}%  ${key}${lines ? `  [ticks ${lines}]` : ''}\n`);
}
