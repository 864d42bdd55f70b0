// .github/workflows/nightly.yml (issue 18, part 4): actionlint accepts it, its matrix step expands
// to exactly the builds of the matrix file (run here as the workflow runs it), and its jobs hand
// each other what the next one reads: the build id to `--build`, each summary to `--from-results`.
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { $ } from 'zx';
import { repoRoot } from '../src/paths.js';
import { buildId, loadMatrix } from '../src/nightly/matrix.js';
import { nightlyBuild } from '../src/nightly/ci.js';
import { ensureActionlint } from './helpers/actionlint.js';

const WORKFLOW = join(repoRoot(), '.github', 'workflows', 'nightly.yml');
const text = readFileSync(WORKFLOW, 'utf8');

/** The `run:` line of the step with this id (the workflow keeps that step to one line for this). */
function stepRun(id: string): string {
  const m = new RegExp(`- id: ${id}\\n\\s+run: (.+)\\n`).exec(text);
  if (!m) throw new Error(`${WORKFLOW}: no one-line step 'id: ${id}'`);
  return m[1];
}

describe('the nightly workflow', () => {
  it('passes actionlint', async () => {
    const actionlint = await ensureActionlint();
    const r = await $({ nothrow: true, quiet: true, cwd: repoRoot() })`${actionlint} -no-color ${WORKFLOW}`;
    expect(r.stdout + r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
  }, 600_000);

  it('offers every shipped matrix to a manual run, and defaults to the twin matrix', () => {
    const shipped = readdirSync(join(repoRoot(), 'nightly')).filter((f) => f.endsWith('.json')).map((f) => `nightly/${f}`).sort();
    const options = [...text.matchAll(/^ {10}- (nightly\/\S+\.json)$/gm)].map((m) => m[1]).sort();
    expect(options).toEqual(shipped);
    expect(text).toMatch(/MATRIX: \$\{\{ inputs\.matrix \|\| .* \|\| 'nightly\/twins\.json' \}\}/);
  });

  for (const matrixFile of ['nightly/twins.json', 'nightly/toolchains.json']) {
    it(`expands ${matrixFile} to one job per build of the matrix, as the workflow step runs it`, async () => {
      const out = join(mkdtempSync(join(tmpdir(), 'forge-workflow-')), 'github-output');
      const r = await $({ nothrow: true, quiet: true, cwd: repoRoot(), env: { ...process.env, MATRIX: matrixFile, GITHUB_OUTPUT: out } })`bash -c ${stepRun('list')}`;
      expect(r.exitCode, r.stderr).toBe(0);
      const line = readFileSync(out, 'utf8').split('\n').find((l) => l.startsWith('builds='));
      const jobs = JSON.parse(line!.slice('builds='.length)) as Array<{ id: string; recipe: string; arch: string; toolchain?: string; slug: string }>;
      const { matrix } = loadMatrix(join(repoRoot(), matrixFile));
      expect(jobs.map((j) => ({ recipe: j.recipe, arch: j.arch, toolchain: j.toolchain }))).toEqual(matrix.builds.map((b) => ({ recipe: b.recipe, arch: b.arch, toolchain: b.toolchain })));
      expect(jobs.map((j) => j.id)).toEqual(matrix.builds.map(buildId));
      // Artifact names may not hold slashes; each build's must be its own.
      for (const j of jobs) expect(j.slug).toMatch(/^[\w.-]+$/);
      expect(new Set(jobs.map((j) => j.slug)).size).toBe(jobs.length);
    }, 120_000);
  }

  it('runs each build job as that one build of the matrix, and gathers every job summary in the report job', () => {
    expect(text).toContain('build: ${{ fromJSON(needs.matrix.outputs.builds) }}');
    expect(text).toContain('BUILD_ID: ${{ matrix.build.id }}');
    expect(text).toContain('./forge nightly --build "$BUILD_ID" --matrix "$MATRIX" --out out/nightly');
    // Each job uploads its summary as summary-<slug>; the report job downloads summary-* into results/.
    expect(text).toContain('name: summary-${{ matrix.build.slug }}');
    expect(text).toMatch(/pattern: summary-\*\n\s+path: results/);
    expect(text).toContain('./forge nightly --from-results results --matrix "$MATRIX" --out out/nightly');
    expect(text).toContain('cat out/nightly/report.md >> "$GITHUB_STEP_SUMMARY"');
    // The shared stage cache and the venvs.
    expect(text).toContain("FORGE_REMOTE_CACHE: ${{ vars.FORGE_CACHE_BUCKET && format('s3://{0}/{1}', vars.FORGE_CACHE_BUCKET, vars.FORGE_CACHE_PREFIX || 'forge') || '' }}");
    expect(text).toContain("key: forge-venv-${{ runner.os }}-${{ hashFiles('oracles/requirements.txt') }}");
    // Every action pinned to a release.
    for (const m of text.matchAll(/uses: (\S+)/g)) expect(m[1]).toMatch(/^[\w-]+\/[\w/-]+@v\d+(\.\d+)*$/);
  });

  it('refuses a --build that is not in the matrix, listing the builds', async () => {
    await expect(nightlyBuild({ id: 'tiny-qwen3/v81/qnn-1.0', matrix: join(repoRoot(), 'nightly', 'toolchains.json'), log: () => {} }))
      .rejects.toThrow(/no build 'tiny-qwen3\/v81\/qnn-1\.0' in the nightly matrix .*toolchains\.json \(builds: tiny-qwen3\/v81, tiny-qwen3\/v81\/qnn-2\.6\.0\)/);
  });
});
