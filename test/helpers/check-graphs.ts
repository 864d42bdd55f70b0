// Runs the full onnx.checker over every graph of an export entry, in a copy: onnx refuses a data
// file with several hard links, and the gates' scratch bundles hard-link into the cache.
import { cpSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { checkModel } from '../../src/onnx/check.js';
import { venvPython } from '../../src/toolchain/venv.js';

export async function checkExportedGraphs(entryDir: string): Promise<number> {
  const copy = mkdtempSync(join(tmpdir(), 'forge-check-'));
  try {
    cpSync(entryDir, copy, { recursive: true });
    const graphs = readdirSync(copy).filter((f) => f.endsWith('.onnx'));
    for (const file of graphs) await checkModel(join(copy, file), venvPython());
    return graphs.length;
  } finally {
    rmSync(copy, { recursive: true, force: true });
  }
}
