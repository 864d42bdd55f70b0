import { readFileSync } from 'node:fs';
import { Trace } from './src/gates/trace.js';
import { getFamily } from './src/families/index.js';
import { writeSafetensors } from './src/io/safetensors-writer.js';
const fam = getFamily('gemma4') as any;
const ck = '/root/.cache/forge/cache/fetch/52f8b4aed5ee5cca737ab6b3bf4f99263df3efea863dcf964a6d7e11dd9bc24a/model';
const config = fam.parseConfig(JSON.parse(readFileSync(ck + '/config.json', 'utf8')), 'config.json');
const gj = JSON.parse(readFileSync('/root/.cache/forge/cache/quantize/2c11794e14c316ee4bb81b3dd68555964455c4ca317a20fc61bd3b6ec8cdc443/graphs.json', 'utf8'));
const entry = gj.contexts.flatMap((c: any) => c.graphs).find((g: any) => g.name === 'shard1.decode');
const trace = await Trace.open('/root/.cache/forge/cache/trace/7739338614589f8ce56d827ab0bb11e6148ae3f5bfe56fa6e3cea07deaa1eebd');
const specs: any[] = []; const DT: any = { float32: 'F32', int32: 'I32' };
let i = 0;
for await (const c of fam.gateCases(config, entry, trace, gj.maxContext, '/root/.cache/forge/cache/quantize/2c11794e14c316ee4bb81b3dd68555964455c4ca317a20fc61bd3b6ec8cdc443')) {
  if (c.prompt !== 2 || c.step < 30 || c.step > 45) continue;
  for (const [name, f] of Object.entries<any>(c.feeds)) specs.push({ name: i + '/' + name, dtype: DT[f.dtype], shape: f.dims, data: f.data.slice() });
  for (const w of ['h.4','h.5','h.6','h.7','h.8','final']) specs.push({ name: i + '/exp.' + w, dtype: 'F32', shape: [64], data: await trace.get(2, c.step, w) });
  i++;
}
await writeSafetensors('/tmp/dbg-feeds.safetensors', specs, { cases: String(i) });
console.log('cases', i);
