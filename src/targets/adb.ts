// The adb target: a real phone. Pushes the bundle, an Android build of qhx_generate and the QNN/ORT
// libraries, runs greedily on the device's NPU, pulls the result. Refuses a missing device or one
// whose SoC is not the bundle's arch (a v81 context binary does not load on v79). Every adb call has
// a timeout. See docs/DEVICE.md for the first real run.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { basename, join } from 'node:path';
import { tmpdir } from 'node:os';
import { runOwned } from '../engine/subprocess.js';
import type { HexagonArch } from '../arch/table.js';
import { parseQhxJson, qhxArgs, qhxFailure, type GenerateRequest, type Target } from './target.js';

export interface AdbOptions {
  serial: string;
  arch: HexagonArch;
  /** qhx_generate built for Android arm64 (see docs/DEVICE.md). */
  runner: string;
  /** Directory with libonnxruntime.so, libonnxruntime_providers_qnn.so, libQnnHtp.so, libQnnSystem.so and the arch's skel/stub libraries. */
  libDir: string;
  remoteRoot?: string;
  timeoutSeconds?: number;
  adb?: string;
}

export function adbTarget(o: AdbOptions): Target {
  const adbBin = o.adb ?? process.env.ADB ?? 'adb';
  const remote = o.remoteRoot ?? '/data/local/tmp/forge';
  const timeoutSeconds = o.timeoutSeconds ?? 300;
  const adb = async (args: string[], what: string) => {
    const r = await runOwned(adbBin, ['-s', o.serial, ...args], { timeoutSeconds });
    if (r.spawnError) throw new Error(`adb ${what} on ${o.serial}: cannot run ${adbBin}: ${r.spawnError}`);
    if (r.exitCode !== 0) {
      const why = (r.stderr || r.stdout).trim().split('\n').pop() ?? '';
      throw new Error(`adb ${what} on ${o.serial} failed (${r.timedOut ? `killed after ${timeoutSeconds}s` : r.signal ? `killed by ${r.signal}` : `exit ${r.exitCode}`}): ${why}`);
    }
    return r.stdout.trim();
  };
  let checked = false;
  let pushed: string | null = null;  // the bundle already on the device: pushed once, run per prompt
  const checkDevice = async () => {
    if (checked) return;
    const state = await adb(['get-state'], 'get-state').catch((e: Error) => {
      throw new Error(`no device '${o.serial}' reachable over adb: ${e.message}`);
    });
    if (state !== 'device') throw new Error(`device '${o.serial}' is '${state}', not ready (adb get-state)`);
    const soc = await adb(['shell', 'getprop', 'ro.soc.model'], 'getprop');
    if (soc !== o.arch.soc) throw new Error(`device '${o.serial}' is ${soc || 'an unknown SoC'}, but this bundle is for ${o.arch.id} (${o.arch.soc}): context binaries are arch-pinned`);
    checked = true;
  };
  return {
    name: `adb:${o.serial}`,
    async generate(req: GenerateRequest) {
      await checkDevice();
      // The first run after a push hashes every file (a truncated or corrupted push fails there,
      // naming the file); later runs check sizes and small files only, as a user's runs do.
      const verify = pushed !== req.bundleDir;
      if (pushed !== req.bundleDir) {
        await adb(['shell', 'rm', '-rf', remote, '&&', 'mkdir', '-p', `${remote}/bundle`, `${remote}/lib`], 'prepare');
        await adb(['push', `${req.bundleDir}/.`, `${remote}/bundle`], 'push bundle');
        await adb(['push', `${o.libDir}/.`, `${remote}/lib`], 'push libraries');
        await adb(['push', o.runner, `${remote}/qhx_generate`], 'push runner');
        pushed = req.bundleDir;
      }
      // An image or audio prompt's file goes beside the bundle, under its own name (the device sees that path).
      let onDevice = req;
      for (const medium of ['image', 'audio'] as const) {
        const file = req[medium];
        if (!file) continue;
        const remoteFile = `${remote}/${medium}-${basename(file)}`;
        await adb(['push', file, remoteFile], `push ${medium}`);
        onDevice = { ...onDevice, [medium]: remoteFile };
      }
      const args = [...qhxArgs(`${remote}/bundle/${req.manifest ?? 'manifest.json'}`, `${remote}/lib/libQnnHtp.so`, `${remote}/lib/libQnnSystem.so`, `${remote}/bundle`, onDevice), ...(verify ? ['--verify'] : [])];
      const env = `LD_LIBRARY_PATH=${remote}/lib ADSP_LIBRARY_PATH=${remote}/lib FORGE_QNN_EP_LIB=${remote}/lib/libonnxruntime_providers_qnn.so`;
      await adb(['shell', `cd ${remote} && chmod 755 qhx_generate && ${env} ./qhx_generate ${args.join(' ')} > ${remote}/result.json 2> ${remote}/stderr.txt; echo $? > ${remote}/status`], 'run');
      const local = mkdtempSync(join(tmpdir(), 'forge-adb-'));
      try {
        await adb(['pull', `${remote}/status`, join(local, 'status')], 'pull status');
        await adb(['pull', `${remote}/stderr.txt`, join(local, 'stderr.txt')], 'pull stderr');
        const status = readFileSync(join(local, 'status'), 'utf8').trim();
        if (status !== '0') throw qhxFailure(o.serial, status, readFileSync(join(local, 'stderr.txt'), 'utf8'));
        await adb(['pull', `${remote}/result.json`, join(local, 'result.json')], 'pull result');
        const res = parseQhxJson(readFileSync(join(local, 'result.json'), 'utf8'), `adb:${o.serial}`);
        if (res.backend !== 'qnn') throw new Error(`qhx_generate on ${o.serial} ran on backend '${res.backend}', not qnn`);
        return res;
      } finally {
        rmSync(local, { recursive: true, force: true });
      }
    },
  };
}
