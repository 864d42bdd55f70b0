// forge bisect --prompt and --from (issue 17): bisect on the porter's own prompt instead of the
// recipe's (the trace every gate reads holds that prompt, and the report says so), and bisect started
// from a build's run record (recipe and arch taken from it; a contradicting --arch or recipe refused
// naming both; a file that is neither a run record nor a qhx_generate result refused naming it). On
// the healthy tiny-qwen3 twin; plus the pure parts: the --from parser and the start it resolves.
import { describe, it, expect, beforeAll } from 'vitest';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { forge, lastJson } from './helpers/forge-cli.js';
import { cacheRoot } from '../src/paths.js';
import { defaultTarget, parseFromFile, readFromFile, resolveStart, fromText } from '../src/bisect/from.js';
import { checkPrompts } from '../src/build.js';
import { firstRunDivergence } from '../src/bisect/runtime-run.js';
import type { TracePrompt } from '../src/gates/trace.js';
import type { BisectResult } from '../src/bisect/run.js';
import type { RunRecord } from '../src/engine/record.js';
import { recipeSandbox } from './helpers/recipe-sandbox.js';

// A passage start the twin memorised (oracles/twin_corpus.py) that is not among the recipe's gates.prompts:
// a confident continuation, so the healthy twin stays healthy on it.
const PROMPT = 'Water boils at a temperature of';

let work: string;
let recipes: string;
beforeAll(() => void ({ work, recipes } = recipeSandbox('forge-bisect-from-')));

const lastBisect = (stdout: string) => lastJson(stdout) as BisectResult;
const traceOf = (b: BisectResult) => JSON.parse(readFileSync(join(cacheRoot(), 'trace', b.build.stages.find((s) => s.name === 'trace')!.key!, 'trace.json'), 'utf8')) as { prompts: TracePrompt[] };
/** HF's trace of PROMPT, from the --prompt test: the ids and continuation a qhx_generate run is made of below. */
let promptTrace: TracePrompt | undefined;

describe('forge bisect --prompt and --from', () => {
  it('--prompt: bisects on that prompt, not the recipe\'s, and says so', async () => {
    const out = join(work, 'bisect-prompt');
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--prompt', PROMPT, '--json', '--out', out], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    const b = lastBisect(run.stdout);
    expect(b.verdict, b.message).toBe('no-fault');
    expect(b.prompts).toEqual({ source: '--prompt', texts: [PROMPT] });
    const file = JSON.parse(readFileSync(join(out, 'bisect.json'), 'utf8')) as BisectResult;
    expect(file.prompts.texts).toEqual([PROMPT]);
    expect(readFileSync(join(out, 'summary.txt'), 'utf8')).toContain(`prompts:     --prompt ${JSON.stringify(PROMPT)}`);
    expect(readFileSync(join(out, 'bisect.html'), 'utf8')).toContain(`<li>${PROMPT}</li>`);
    // The trace the gates read is of that prompt alone.
    const meta = traceOf(b);
    expect(meta.prompts.map((p) => p.text)).toEqual([PROMPT]);
    promptTrace = meta.prompts[0];
    // The recipe's own bisect traces the recipe's prompts: a different trace.
    const recipe = JSON.parse(readFileSync(join(recipes, 'tiny-qwen3', 'recipe.json'), 'utf8')) as { gates: { prompts: string[] } };
    expect(recipe.gates.prompts).not.toContain(PROMPT);
    console.log(`[measured] bisect tiny-qwen3 --prompt: ${b.verdict}, stages ${b.build.stages.map((s) => `${s.name} ${s.status} ${s.seconds.toFixed(1)}s`).join(', ')}; ${b.seconds.toFixed(1)} s inside`);
  }, 900_000); // a new trace and oracle on the twin (cached export and quantize), the drift scan

  it('--from a qhx_generate run: HF traces its prompt ids, the report names where its tokens leave HF\'s, then bisects the chain', async () => {
    const hf = promptTrace!;
    expect(hf, 'the --prompt test traces PROMPT first').toBeDefined();
    // "The device said this": HF's tokens, except the runner-up at generated token 4.
    const generated = hf.generated.slice(0, 10);
    generated[4] = hf.runner_up[4];
    const qhx = join(work, 'qhx.json');
    writeFileSync(qhx, JSON.stringify({ prompt_ids: hf.prompt_tokens, generated_ids: generated, text: null, text_error: 'test', stopped_at_eos: false, backend: 'cpu', timings: {} }));
    const out = join(work, 'bisect-qhx');
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--from', qhx, '--json', '--out', out], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    const b = lastBisect(run.stdout);
    expect(b.from).toMatchObject({ kind: 'qhx', promptIds: hf.prompt_tokens, generatedIds: generated, backend: 'cpu' });
    expect(b.prompts).toEqual({ source: '--from', texts: [PROMPT], ids: [hf.prompt_tokens] });
    expect(b.run).toEqual({ runTokens: 10, hfTokens: hf.generated.length, compared: 10, first: { index: 4, step: hf.prompt_tokens.length + 3, hf: { token: hf.generated[4], runnerUp: hf.runner_up[4], margin: hf.margins[4] }, run: hf.runner_up[4] } });
    // The trace is of exactly those ids (its own cache entry), and the shipped chain on them is healthy.
    const meta = traceOf(b);
    expect(meta.prompts.map((p) => p.prompt_tokens)).toEqual([hf.prompt_tokens]);
    expect(meta.prompts[0].generated).toEqual(hf.generated);
    expect(b.verdict).toBe('no-fault');
    expect(b.message).toMatch(new RegExp(`^the run leaves HF's greedy continuation at generated token 4 \\(step ${hf.prompt_tokens.length + 3}\\): HF picks ${hf.generated[4]} by [0-9.]+ over ${hf.runner_up[4]}, the run picked ${hf.runner_up[4]}; the chain on that prompt: no fault`));
    expect(readFileSync(join(out, 'summary.txt'), 'utf8')).toContain('the run:     the run leaves');
    console.log(`[measured] bisect --from qhx: ${b.message}; ${b.seconds.toFixed(1)} s inside`);

    // Ids outside the vocabulary: the trace refuses them, naming the id.
    writeFileSync(qhx, JSON.stringify({ prompt_ids: [1, 10_000_000], generated_ids: [2] }));
    const oov = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--from', qhx], { FORGE_RECIPES: recipes });
    expect(oov.code).toBe(1);
    expect(oov.stderr).toMatch(/token id 10000000 is outside the vocabulary \(\d+ ids/);
    // No recipe or arch: a qhx result names neither.
    const bare = await forge(['bisect', '--from', qhx], { FORGE_RECIPES: recipes });
    expect(bare.code).toBe(1);
    expect(bare.stderr).toContain(`--from ${qhx}: a qhx_generate result names no recipe or arch: give the recipe and --arch on the command line`);
  }, 900_000);

  it('--prompt "" is refused before anything is built', async () => {
    const run = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--prompt', 'fine', '--prompt', '  '], { FORGE_RECIPES: recipes });
    expect(run.code).toBe(1);
    expect(run.stderr).toMatch(/--prompt: prompt 2 of 2 is empty/);
    expect(run.stderr).not.toMatch(/\[forge\] (fetch|trace)/);
  });

  it('--from a build\'s run.json: recipe and arch from it, the build named in the report; a contradicting --arch or recipe refused', async () => {
    const built = join(work, 'built');
    const b0 = await forge(['build', 'tiny-qwen3', '--arch', 'v81', '--until', 'oracle', '--json', '--out', built], { FORGE_RECIPES: recipes });
    expect(b0.code, b0.stderr).toBe(0);
    const runJson = join(built, 'build', 'run.json');
    expect((JSON.parse(readFileSync(runJson, 'utf8')) as RunRecord).status).toBe('partial');

    const recordBefore = readFileSync(runJson, 'utf8');
    const out = join(work, 'bisect-from');
    const run = await forge(['bisect', '--from', runJson, '--json', '--out', out], { FORGE_RECIPES: recipes });
    expect(run.code, run.stderr).toBe(0);
    const b = lastBisect(run.stdout);
    expect(b).toMatchObject({ recipe: 'tiny-qwen3', arch: 'v81', target: 'host', verdict: 'no-fault', prompts: { source: 'recipe' } });
    expect(b.from).toMatchObject({ kind: 'run-record', file: runJson, recipe: 'tiny-qwen3', arch: 'v81', status: 'partial', until: 'oracle', failedGates: [] });
    expect(run.stdout).toContain(`from:        the build recorded in ${runJson}: tiny-qwen3 for v81, status partial (--until oracle)`);
    expect(readFileSync(join(out, 'bisect.html'), 'utf8')).toContain(`<p id="from">Started from the build recorded in ${runJson}: tiny-qwen3 for v81, status partial`);
    // Bisect builds into a throwaway dir: the build it started from keeps its record byte for byte.
    expect(readFileSync(runJson, 'utf8')).toBe(recordBefore);
    // The same recipe and arch given again agree with it.
    const same = await forge(['bisect', 'tiny-qwen3', '--arch', 'v81', '--from', runJson, '--out', join(work, 'bisect-same')], { FORGE_RECIPES: recipes });
    expect(same.code, same.stderr).toBe(0);

    const arch = await forge(['bisect', '--arch', 'v79', '--from', runJson], { FORGE_RECIPES: recipes });
    expect(arch.code).toBe(1);
    expect(arch.stderr).toContain(`forge: forge bisect: --arch v79 contradicts --from ${runJson}, a build for arch v81`);
    const recipe = await forge(['bisect', 'tiny-gemma4', '--from', runJson], { FORGE_RECIPES: recipes });
    expect(recipe.code).toBe(1);
    expect(recipe.stderr).toContain(`recipe tiny-gemma4 contradicts --from ${runJson}, a build of recipe tiny-qwen3`);
  }, 600_000);

  it('--from a file that is neither kind, or no recipe at all, is refused naming the file', async () => {
    const garbage = join(work, 'garbage.json');
    writeFileSync(garbage, '{"hello": "world"}');
    const r = await forge(['bisect', '--from', garbage], { FORGE_RECIPES: recipes });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`forge bisect --from ${garbage}: neither a forge run record`);
    expect(r.stderr).not.toMatch(/\n\s+at /);
    const none = await forge(['bisect', '--arch', 'v81'], { FORGE_RECIPES: recipes });
    expect(none.code).toBe(1);
    expect(none.stderr).toMatch(/give a recipe and --arch \(missing: the recipe\), or --from/);
  });
});

describe('bisect --from, the pure parts', () => {
  const record = { recipe: 'tiny-qwen3', arch: 'v81', ok: false, status: 'failed', error: 'emulation: gate failed', stages: [{ name: 'fetch', status: 'cached', seconds: 0 }], gates: { oracle: { ok: true, graphs: {} }, emulation: { ok: false } }, tools: { node: '20', toolchain: 'qnn-2.6.0@abc' }, summaries: {}, bundle: null, buildDir: null, seconds: 1 };

  it('reads a run record: recipe, arch, status, failed gates, toolchain', () => {
    const f = parseFromFile(JSON.stringify(record), '/x/run.json');
    expect(f).toEqual({ kind: 'run-record', file: '/x/run.json', recipe: 'tiny-qwen3', arch: 'v81', status: 'failed', error: 'emulation: gate failed', failedGates: ['emulation'], toolchain: 'qnn-2.6.0@abc' });
    expect(fromText(f)).toBe('the build recorded in /x/run.json: tiny-qwen3 for v81, status failed, failed gate emulation (emulation: gate failed)');
  });

  it('bisects on the simulator by default when the build failed there alone, else on the host', () => {
    const at = (gates: Record<string, { ok: boolean }>) => defaultTarget(parseFromFile(JSON.stringify({ ...record, gates }), 'r.json'));
    expect(at({ oracle: { ok: true }, emulation: { ok: false } })).toBe('emulation');
    expect(at({ oracle: { ok: false }, emulation: { ok: false } })).toBe('host');
    expect(at({ oracle: { ok: true }, emulation: { ok: true } })).toBe('host');
    expect(defaultTarget(undefined)).toBe('host');
  });

  it('reads a qhx_generate --json result by its shape', () => {
    const qhx = { prompt_ids: [1, 2, 3], generated_ids: [4, 5], text: null, text_error: 'no tokenizer', stopped_at_eos: false, backend: 'cpu', timings: {} };
    expect(parseFromFile(JSON.stringify(qhx), 'q.json')).toEqual({ kind: 'qhx', file: 'q.json', promptIds: [1, 2, 3], generatedIds: [4, 5], backend: 'cpu' });
    // Negative or fractional ids are not token ids.
    expect(() => parseFromFile(JSON.stringify({ ...qhx, prompt_ids: [1, -2] }), 'q.json')).toThrow(/q\.json: neither .* prompt_ids\.1/);
  });

  it('refuses what is neither, not JSON, or unreadable, naming the file', () => {
    expect(() => parseFromFile('[1, 2]', 'a.json')).toThrow(/--from a\.json: neither a forge run record .*\(top level\).* nor a qhx_generate --json result/);
    expect(() => parseFromFile(JSON.stringify({ ...record, status: 'great' }), 'b.json')).toThrow(/--from b\.json: neither a forge run record \(out\/<recipe>\/<arch>\/build\/run\.json; status: /);
    expect(() => parseFromFile('{"recipe": ', 'c.json')).toThrow(/--from c\.json: not JSON/);
    expect(() => readFromFile(join(tmpdir(), 'no-such-forge-run.json'))).toThrow(/no-such-forge-run\.json: cannot read it \(ENOENT\)/);
  });

  it('resolves the recipe and arch: from the record, or the command line, never both disagreeing', () => {
    const f = parseFromFile(JSON.stringify(record), 'r.json');
    expect(resolveStart({ from: f })).toMatchObject({ recipe: 'tiny-qwen3', arch: 'v81' });
    expect(resolveStart({ recipe: 'tiny-qwen3', arch: 'v81', from: f })).toMatchObject({ recipe: 'tiny-qwen3', arch: 'v81' });
    expect(() => resolveStart({ arch: 'v79', from: f })).toThrow('--arch v79 contradicts --from r.json, a build for arch v81');
    expect(() => resolveStart({ recipe: 'tiny-llama', from: f })).toThrow('recipe tiny-llama contradicts --from r.json, a build of recipe tiny-qwen3');
    expect(resolveStart({ recipe: 'a', arch: 'v81' })).toEqual({ recipe: 'a', arch: 'v81' });
    expect(() => resolveStart({ recipe: 'a' })).toThrow('give a recipe and --arch (missing: --arch), or --from');
    const qhx = parseFromFile(JSON.stringify({ prompt_ids: [1], generated_ids: [2] }), 'q.json');
    expect(() => resolveStart({ recipe: 'a', from: qhx })).toThrow('q.json: a qhx_generate result names no recipe or arch: give --arch on the command line');
  });

  it('--prompt: an empty list, prompt or id list is refused', () => {
    expect(checkPrompts(['c', { type: 'ids', ids: [1] }])).toEqual(['c', { type: 'ids', ids: [1] }]);
    expect(() => checkPrompts([])).toThrow('--prompt: no prompts given');
    expect(() => checkPrompts(['c', ''])).toThrow('--prompt: prompt 2 of 2 is empty');
    expect(() => checkPrompts([{ type: 'ids', ids: [] }])).toThrow('--prompt: prompt 1 of 1 is empty');
  });

  it('names the first generated token where a run leaves HF\'s greedy continuation, with HF\'s margin there', () => {
    const hf: TracePrompt = { text: 't', prompt_tokens: [5, 6, 7], generated: [10, 11, 12, 13], runner_up: [20, 21, 22, 23], margins: [3, 0.01, 2, 1], steps: 6 };
    expect(firstRunDivergence(hf, [10, 21, 12])).toEqual({ runTokens: 3, hfTokens: 4, compared: 3, first: { index: 1, step: 3, hf: { token: 11, runnerUp: 21, margin: 0.01 }, run: 21 } });
    // Only the tokens both have are compared: a longer run past HF's trace, or a shorter one, is no divergence by itself.
    expect(firstRunDivergence(hf, [10, 11, 12, 13, 99])).toEqual({ runTokens: 5, hfTokens: 4, compared: 4 });
    expect(firstRunDivergence(hf, [])).toEqual({ runTokens: 0, hfTokens: 4, compared: 0 });
  });
});
