// The one entry point. Sub-commands are thin: they parse flags, call a module, print.
import { Command, Option } from 'commander';
import { loadRecipe, listRecipeIds } from './recipe/load.js';
import { build } from './build.js';
import { planRecipe, formatPlan } from './plan/for-recipe.js';
import { doctor, formatDoctor } from './toolchain/doctor.js';
import { clean, sweepShared } from './clean.js';
import { runTests } from './selftest.js';
import { publishBundle } from './hub/publish.js';
import { compareBundles } from './bundle/compare.js';
import { bisect, TARGETS } from './bisect/run.js';
import { summaryText } from './bisect/report.js';
import { describeSummary, nightly } from './nightly/run.js';
import { listBuilds, nightlyBuild, nightlyFromResults } from './nightly/ci.js';
import { HOW_IT_RUNS } from './nightly/report.js';
import { runWorker } from './nightly/worker.js';
import { formatStatus, queueStatus } from './nightly/status.js';
import { defaultMemoryBudget } from './engine/scheduler.js';
import { totalmem } from 'node:os';
import { ARCH_IDS } from './arch/table.js';
import { resolve } from 'node:path';
import type { TargetSpec } from './gates/parity.js';
import { verdictLines } from './bundle/verdict.js';
import { REMOTE_CACHE_ENV } from './engine/remote-cache.js';
import { queueUrl, REDIS_PASSWORD_ENV, urlHasPassword } from './nightly/queue.js';

let verbose = process.argv.includes('--verbose');

function fail(e: unknown): never {
  const err = e as Error;
  process.stderr.write(`forge: ${verbose ? err.stack ?? err.message : err.message}\n`);
  process.exit(1);
}

// Numeric flags: a value that is not what the flag takes is an error naming the flag, never a
// silent default (parseInt('abc') is NaN, '0' jobs is no jobs, '2x' is not 2). A plain Error, not
// commander's InvalidArgumentError, so it reaches fail() as one line without the help text.
const positiveInt = (flag: string) => (v: string) => {
  if (!/^\s*\d+\s*$/.test(v) || Number(v) < 1) throw new Error(`${flag} wants a whole number of at least 1, got '${v}'`);
  return Number(v);
};
const gbToBytes = (flag: string) => (v: string) => {
  const n = /^\s*(\d+(\.\d*)?|\.\d+)\s*$/.test(v) ? Number(v) : NaN;
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${flag} wants a number of GB above 0, got '${v}'`);
  return Math.floor(n * 1e9);
};

const program = new Command('forge')
  .description('Hugging Face checkpoints → Qualcomm Hexagon NPU bundles, gated against the HF fp32 reference')
  .option('--verbose', 'stack traces on errors, stage logs on the console, and (build) the per-stage table and memory prediction misses')
  .showHelpAfterError()
  .hook('preAction', (cmd) => { verbose = Boolean(cmd.opts().verbose); });

program.command('list')
  .description('list the recipes')
  .option('--json', 'machine-readable output')
  .action((o: { json?: boolean }) => {
    // One invalid recipe does not hide the others: it is listed apart with its error, and the command fails.
    const invalid: Array<{ id: string; error: string }> = [];
    const rows = listRecipeIds().flatMap((id) => {
      try {
        const { recipe } = loadRecipe(id);
        const source = recipe.source.kind === 'hub' ? `${recipe.source.repo}@${recipe.source.revision?.slice(0, 10) ?? 'unpinned'}` : recipe.source.kind === 'tiny' ? `tiny twin (${recipe.source.twin})` : recipe.source.path;
        return [{ id, family: recipe.family, modalities: recipe.modalities, source }];
      } catch (e) {
        invalid.push({ id, error: (e as Error).message });
        return [];
      }
    });
    if (o.json) console.log(JSON.stringify(rows));
    else {
      const idWidth = Math.max(16, ...rows.map((r) => r.id.length));
      for (const r of rows) console.log(`${r.id.padEnd(idWidth)} ${r.family.padEnd(9)} ${r.modalities.join('+').padEnd(10)} ${r.source}`);
    }
    for (const r of invalid) console.error(`forge: invalid recipe ${r.id}: ${r.error}`);
    if (invalid.length) process.exitCode = 1;
  });

// The shared stage cache; the environment variable lets a worker's child builds inherit it.
const cacheOption = () => new Option('--cache <s3-url>', `shared stage cache in S3-compatible storage, s3://bucket/prefix, read and written beside the local one (default: $${REMOTE_CACHE_ENV}); credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL_S3`);
// The Redis password never on the command line (`ps` shows argv to every user of the machine).
const passwordFileOption = () => new Option('--redis-password-file <file>', `file holding the --queue Redis password (default: $${REDIS_PASSWORD_ENV}); keeps it out of argv`);
/** The --queue URL with its password from the file or the environment; a password left in argv is said once. */
function resolveQueue(url: string, passwordFile?: string): string {
  if (urlHasPassword(url)) process.stderr.write(`forge: warning: the --queue URL carries a password, which every user of this machine sees in ps; give it in $${REDIS_PASSWORD_ENV} or --redis-password-file instead\n`);
  return queueUrl(url, { passwordFile });
}
const archOption = () => new Option('--arch <arch>', `target Hexagon arch (${ARCH_IDS.join(', ')})`).makeOptionMandatory();

program.command('plan <recipe>')
  .description('show the shard plan (layer ranges under the arch ceiling); offline when the recipe records the model config')
  .addOption(archOption())
  .option('--json', 'machine-readable output')
  .action(async (id: string, o: { arch: string; json?: boolean }) => {
    const plan = await planRecipe(id, o.arch, verbose);
    console.log(o.json ? JSON.stringify(plan) : formatPlan(plan));
  });

program.command('build <recipe>')
  .description('build out/<recipe>/<arch>/: fetch → plan → … (cached, resumable)')
  .addOption(archOption())
  .option('--json', 'print the run record as the last line of stdout')
  .option('--out <dir>', 'output directory (default out/<recipe>/<arch>)')
  .option('--revision <sha>', "hub commit (40 hex digits) to fetch for a recipe whose source.revision is null (not pinned); on a pinned recipe only its own sha is accepted")
  .option('--until <stage>', 'stop after this stage')
  .option('--force <stage...>', 're-run these stages even when cached')
  .addOption(cacheOption())
  .option('--jobs <n>', 'stages run at once (default: CPU count)', positiveInt('--jobs'))
  .option('--memory-budget <GB>', 'sum of predicted stage peaks allowed at once; a stage predicted over it is refused (default: RAM less 10%, at least 2 GB)', gbToBytes('--memory-budget'))
  .option('--shard-ceiling <GB>', "cut layer shards under this ceiling instead of the arch's (more, smaller contexts: a compile that fits a smaller machine; not the device-optimal plan)", gbToBytes('--shard-ceiling'))
  .addOption(new Option('--target <where>', 'where the parity gate runs the bundle').choices(['host', 'adb']).default('host'))
  .option('--serial <serial>', 'adb device serial (with --target adb)')
  .option('--runner <path>', 'qhx_generate built for Android arm64 (with --target adb; docs/DEVICE.md)')
  .option('--device-libs <dir>', 'ORT + QNN libraries for the device (with --target adb; docs/DEVICE.md)')
  .option('--toolchain <name|file>', 'compile and simulate with a pinned toolchain (toolchains/<name>.txt, or a requirements file) in its own venv, instead of the main environment')
  .action(async (id: string, o: { arch: string; json?: boolean; out?: string; revision?: string; until?: string; force?: string[]; cache?: string; jobs?: number; memoryBudget?: number; shardCeiling?: number; target: string; serial?: string; runner?: string; deviceLibs?: string; toolchain?: string }) => {
    let target: TargetSpec = { kind: 'host' };
    if (o.target === 'adb') {
      if (!o.serial || !o.runner || !o.deviceLibs) throw new Error('--target adb needs --serial, --runner and --device-libs (see docs/DEVICE.md)');
      target = { kind: 'adb', serial: o.serial, runner: resolve(o.runner), libDir: resolve(o.deviceLibs) };
    }
    const record = await build({ recipe: id, arch: o.arch, out: o.out, revision: o.revision, until: o.until, force: o.force, remoteCache: o.cache, jobs: o.jobs, memoryBudgetBytes: o.memoryBudget, shardCeilingBytes: o.shardCeiling, verbose, target, toolchain: o.toolchain });
    // The last screen is the verdict (per gate its figure against its threshold, the bundle, the
    // report); the stage table and forge's own diagnostics only with --verbose.
    if (o.json) console.log(JSON.stringify(record));
    else console.log(verdictLines(record, { verbose }).join('\n'));
    if (record.status === 'interrupted') process.exit(130);
    if (!record.ok) process.exit(1);
  });

program.command('bisect [recipe]')
  .description('where the shipped graphs first leave the HF reference (layer, op, step, link; free-running drift; an f16 hand-off between contexts; the runtime, a phone) and which override (precision, fp16 rescale, hand-off dtype) brings them back; report under out/<recipe>/<arch>/bisect/')
  .option('--arch <arch>', `target Hexagon arch (${ARCH_IDS.join(', ')}); required unless --from names it`)
  .addOption(new Option('--target <where>', 'where the chain is run: host (the ONNX graphs, then the native runtime, on this CPU; the default), emulation (then the compiled graphs on the x86 HTP simulator; the default --from a build whose emulation gate alone failed), adb (then the runtime on a phone)').choices([...TARGETS]))
  .option('--serial <serial>', 'adb device serial (with --target adb)')
  .option('--runner <path>', 'qhx_generate built for Android arm64 (with --target adb; docs/DEVICE.md)')
  .option('--device-libs <dir>', 'ORT + QNN libraries for the device (with --target adb; docs/DEVICE.md)')
  .option('--prompt <text>', "bisect on this prompt instead of the recipe's gates.prompts (repeatable; every build and fix trial traces them)", (v: string, all: string[] = []) => [...all, v])
  .option('--from <file>', "start from a forge build's run record (out/<recipe>/<arch>/build/run.json: the recipe and arch come from it), or from a qhx_generate --json result (its prompt ids traced, its tokens checked against HF's)")
  .option('--apply', "write the chosen fix into the recipe file (override or rescale lines, or the arch's handoff)")
  .option('--out <dir>', 'report directory (default out/<recipe>/<arch>/bisect)')
  .option('--json', 'print bisect.json as the last line of stdout')
  .action(async (id: string | undefined, o: { arch?: string; target?: string; serial?: string; runner?: string; deviceLibs?: string; prompt?: string[]; from?: string; apply?: boolean; out?: string; json?: boolean }) => {
    const device = { ...(o.serial ? { serial: o.serial } : {}), ...(o.runner ? { runner: o.runner } : {}), ...(o.deviceLibs ? { libDir: o.deviceLibs } : {}) };
    const r = await bisect({ recipe: id, arch: o.arch, target: o.target, device, prompts: o.prompt, from: o.from, apply: Boolean(o.apply), out: o.out, verbose, log: (m) => process.stderr.write(`[forge] bisect: ${m}\n`) });
    console.log(summaryText(r));
    if (o.apply && !r.applied) console.log(`--apply: nothing written to the recipe: ${r.verdict === 'no-fault' ? 'there is no fault to fix' : 'no fix restored the gate'}`);
    if (o.json) console.log(JSON.stringify(r));
    // A fault found is not an error of bisect's: exit 0 whether or not it found one (the verdict says).
  });

program.command('publish <bundle-dir>')
  .description('upload a built bundle to the Hugging Face hub: one commit, only the files that changed; refuses a bundle whose gates did not all pass')
  .requiredOption('--repo <org/name>', 'hub model repo (created if missing)')
  .option('--dry-run', 'print the plan (upload / skip-unchanged, size per file) and write nothing')
  .option('--private', 'create the repo private; refuses an existing public repo')
  .option('--json', 'print the result as JSON')
  .addHelpText('after', '\nHF_TOKEN (write access) authenticates and is never printed; HF_ENDPOINT selects another hub.')
  .action(async (dir: string, o: { repo: string; dryRun?: boolean; private?: boolean; json?: boolean }) => {
    const r = await publishBundle({ bundleDir: dir, repo: o.repo, dryRun: Boolean(o.dryRun), private: o.private, log: (m) => process.stderr.write(`${m}\n`) });
    if (o.json) console.log(JSON.stringify(r));
  });

program.command('compare <bundle-a> <bundle-b>')
  .description('compare two bundles for reproducibility: byte for byte, except the context binaries their manifests declare nondeterministic (compared by size and description); exit 1 on any difference')
  .option('--json', 'print the comparison as JSON')
  .action(async (a: string, b: string, o: { json?: boolean }) => {
    const r = await compareBundles(resolve(a), resolve(b));
    if (o.json) console.log(JSON.stringify(r));
    else {
      for (const d of r.differences) console.log(`DIFFERS ${d.file}: ${d.what}`);
      console.log(`${r.same ? 'same' : 'DIFFERENT'}: ${r.files} files, ${r.differences.length} differences` +
        (r.nondeterministic.length ? `; compared by size and description only (declared nondeterministic): ${r.nondeterministic.join(', ')}` : ''));
    }
    if (!r.same) process.exitCode = 1;
  });

program.command('nightly')
  .description('build every recipe × arch (× toolchain) of a matrix (sequentially here, or as jobs for `forge worker`s with --queue; the stage cache is shared) and report regressions against the previous nightly: nightly.json, report.md, report.html; exit 1 on a regression or a failed build. --list, --build and --from-results split it across CI jobs (.github/workflows/nightly.yml)')
  .option('--matrix <file>', 'matrix file (default nightly/twins.json)')
  .option('--out <dir>', 'out dir: reports, history/ and builds/ (default out/nightly)')
  .option('--compare <nightly.json>', "previous nightly to compare with (default: the out dir's nightly.json)")
  .option('--queue <redis-url>', 'enqueue the builds on this Redis (redis://host:port) for `forge worker`s and wait for their results')
  .option('--run <id>', 'with --queue: the run id jobs are named by (default: the start time); the same id again waits for the same jobs instead of adding them twice')
  .addOption(passwordFileOption())
  .option('--status', 'with --queue: print every job of the latest nightly (or of --run) and exit: state, worker, stage, attempts')
  .option('--json', 'print nightly.json (with --list: the builds; with --status: the jobs) as the last line of stdout')
  .option('--list', "list the matrix's builds (id, recipe, arch, toolchain, slug) and build nothing")
  .option('--build <id>', 'run only this build of the matrix (e.g. tiny-qwen3/v81/qnn-2.6.0) and write <out>/build-summary.json; no report')
  .option('--from-results <dir>', 'build nothing: report on the build-summary.json files under <dir> (one per matrix build, as --build jobs wrote them)')
  .addOption(cacheOption())
  .addHelpText('after', `\n${HOW_IT_RUNS}`)
  .action(async (o: { matrix?: string; out?: string; compare?: string; queue?: string; redisPasswordFile?: string; run?: string; status?: boolean; json?: boolean; list?: boolean; build?: string; fromResults?: string; cache?: string }) => {
    if (o.redisPasswordFile && !o.queue) throw new Error('--redis-password-file is for the Redis of --queue: give --queue redis://host:port too');
    if (o.queue) o.queue = resolveQueue(o.queue, o.redisPasswordFile);
    if (o.status) {
      if (!o.queue) throw new Error('--status reads the job queue: give it --queue redis://host:port');
      const s = await queueStatus(o.queue, o.run);
      console.log(o.json ? JSON.stringify(s) : formatStatus(s));
      return;
    }
    if (o.run && !o.queue) throw new Error('--run names the jobs of a queued nightly: give it --queue redis://host:port');
    if ([o.list, o.build, o.fromResults, o.queue].filter(Boolean).length > 1) throw new Error('--list, --build, --from-results and --queue are alternatives: give one');
    if (o.queue && o.cache) throw new Error("--cache with --queue: the workers build, so give each `forge worker` the --cache (or FORGE_REMOTE_CACHE)");
    if (o.list) {
      const builds = listBuilds(o.matrix);
      console.log(o.json ? JSON.stringify(builds) : builds.map((b) => b.id).join('\n'));
      return;
    }
    if (o.build) {
      const r = await nightlyBuild({ id: o.build, matrix: o.matrix, out: o.out, verbose, remoteCache: o.cache });
      if ('interrupted' in r) process.exit(130);
      if (o.json) console.log(JSON.stringify(r.summary));
      else console.log(`${r.summary.id}: ${describeSummary(r.summary)}; ${r.file}`);
      return;
    }
    const r = o.fromResults
      ? nightlyFromResults({ results: o.fromResults, matrix: o.matrix, out: o.out, compare: o.compare })
      : await nightly({ matrix: o.matrix, out: o.out, compare: o.compare, verbose, remoteCache: o.cache, queue: o.queue, run: o.run });
    if (r.interrupted) process.exit(130);
    // With --json stdout is the document alone; the flagged lines still reach a CI log, on stderr.
    for (const c of r.comparison.regressions) (o.json ? console.error : console.log)(`REGRESSION ${c.build} ${c.figure}: ${c.before} → ${c.after} (${c.why ?? ''})`);
    if (o.json) console.log(JSON.stringify(r.nightly));
    // Builds the farm's machines could not run: not regressions, but not a green nightly either.
    const notBuilt = r.nightly.builds.filter((b) => b.infra);
    for (const b of notBuilt) (o.json ? console.error : console.log)(`NOT BUILT ${b.id}: ${b.infra}`);
    if (!o.json) {
      const verdict = r.comparison.regressions.length ? 'REGRESSION' : notBuilt.length ? 'incomplete' : 'ok';
      console.log(`${verdict}: ${r.nightly.builds.length} builds, ${r.comparison.regressions.length} flagged${notBuilt.length ? `, ${notBuilt.length} not built (the machines failed, not the builds)` : ''}; ${r.dir}/report.md`);
    }
    if (r.comparison.regressions.length || notBuilt.length) process.exitCode = 1;
  });

program.command('worker')
  .description('take build jobs of `forge nightly --queue` from Redis and build them here, one at a time (or --concurrency); runs until stopped')
  .requiredOption('--queue <redis-url>', `the Redis the nightly enqueues on (redis://host:port; the password from $${REDIS_PASSWORD_ENV} or --redis-password-file)`)
  .addOption(passwordFileOption())
  .option('--memory-budget <GB>', "largest peak a job may declare to be taken here, and each build's --memory-budget (default: RAM less 10%, at least 2 GB)", gbToBytes('--memory-budget'))
  .option('--concurrency <n>', 'builds at once (default 1)', positiveInt('--concurrency'))
  .option('--out <dir>', 'where builds are written: <dir>/<recipe>/<arch>[@<toolchain>] (default out/worker)')
  .addOption(cacheOption())
  .action(async (o: { queue: string; redisPasswordFile?: string; memoryBudget?: number; concurrency?: number; out?: string; cache?: string }) => {
    await runWorker({ queue: resolveQueue(o.queue, o.redisPasswordFile), memoryBudgetBytes: o.memoryBudget ?? defaultMemoryBudget(totalmem()), concurrency: o.concurrency, out: o.out, verbose, ...(o.cache ? { remoteCache: o.cache } : {}) });
  });

program.command('doctor')
  .description('what is installed and which toolchains are usable')
  .option('--json', 'machine-readable output')
  .action(async (o: { json?: boolean }) => {
    const report = await doctor();
    console.log(o.json ? JSON.stringify(report) : formatDoctor(report));
  });

program.command('clean')
  .description('remove the stage cache (and with --all the Python environments too); --sweep: remove the orphaned uploads of a shared S3 cache')
  .option('--all', 'also remove the Python environments and the tiny twins under FORGE_HOME')
  .option('--sweep <s3-url>', 'instead: remove the files no meta.json names from the shared cache s3://bucket/prefix (committed entries stay)')
  .option('--older-than <hours>', 'with --sweep: only uploads whose every file is older than this (default 24)', '24')
  .option('--dry-run', 'with --sweep: list what would be removed')
  .action(async (o: { all?: boolean; sweep?: string; olderThan: string; dryRun?: boolean }) => {
    if (o.sweep && o.all) throw new Error('forge clean: --sweep cleans the shared cache only; --all is for the local one');
    console.log(o.sweep ? await sweepShared(o.sweep, Number(o.olderThan), Boolean(o.dryRun)) : await clean(Boolean(o.all)));
  });

program.command('test [args...]')
  .description("run forge's own test suite (vitest, then ctest once native/ has tests); sets up what it needs first")
  .allowUnknownOption()
  .action(async (args: string[]) => process.exit(await runTests(args ?? [])));

program.parseAsync(process.argv).catch(fail);
