// A stand-in QAIRT SDK directory for tests (no real SDK exists where they run): the layout forge
// checks (bin/x86_64-linux-clang/<tools>, lib/x86_64-linux-clang/<libs>, sdk.yaml), each tool a
// script that runs test/fixtures/fake-qairt/fake_qairt.py in forge's Python environment.
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureVenv } from '../../src/toolchain/venv.js';

export const FAKE_QAIRT_VERSION = '2.99.0.fake';
const TOOLS = ['qnn-onnx-converter', 'qnn-model-lib-generator', 'qnn-context-binary-generator', 'qnn-context-binary-utility'];

export interface FakeQairt {
  root: string;
  /** Faults for the next calls (see fake_qairt.py). */
  setFaults(f: Record<string, unknown>): void;
  /** Every tool call so far (the converter's with the quantized weights it read, the generator's with the HTP config it applied). */
  calls(): Array<{ tool: string; argv: string[]; htp?: any; weights?: any[] }>;
}

export async function makeFakeQairt(opts: { without?: string } = {}): Promise<FakeQairt> {
  const python = await ensureVenv();
  const script = fileURLToPath(new URL('../fixtures/fake-qairt/fake_qairt.py', import.meta.url));
  const root = mkdtempSync(join(tmpdir(), 'forge-fake-qairt-'));
  const bin = join(root, 'bin', 'x86_64-linux-clang');
  const lib = join(root, 'lib', 'x86_64-linux-clang');
  mkdirSync(bin, { recursive: true });
  mkdirSync(lib, { recursive: true });
  for (const t of TOOLS.filter((x) => x !== opts.without)) {
    writeFileSync(join(bin, t), `#!/bin/sh\nFAKE_QAIRT_SDK='${root}' exec '${python}' '${script}' ${t} "$@"\n`);
    chmodSync(join(bin, t), 0o755);
  }
  for (const l of ['libQnnHtp.so', 'libQnnHtpNetRunExtensions.so']) writeFileSync(join(lib, l), '');
  writeFileSync(join(root, 'sdk.yaml'), `name: qairt (stand-in)\nversion: ${FAKE_QAIRT_VERSION}\n`);
  const callsFile = join(root, 'calls.jsonl');
  return {
    root,
    setFaults: (f) => writeFileSync(join(root, 'fake.json'), JSON.stringify(f)),
    calls: () => (existsSync(callsFile) ? readFileSync(callsFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l)) : []),
  };
}
