// forge bisect: the first traced step at which a graph's outputs leave tolerance. The oracle gate
// keeps only each output's worst case (its lowest cosine, and where); a porter wants the first
// step where the numbers go wrong, and how many steps do. This reruns one graph of one export, fed
// HF's inputs case by case exactly as the gate feeds it (same CPU form, same cases, same compare),
// and keeps every case's cosine for the outputs asked about.
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import type { FamilyId } from '../recipe/schema.js';
import { GRAPHS_JSON, type ExportManifest } from '../export/graphs.js';
import { Trace } from '../gates/trace.js';
import { gateSessionOptions, writeGateModel } from '../gates/cpu-form.js';
import { formOptions, gateForm, GATE_COPIES, runGateCases } from '../gates/oracle.js';
import { compare } from '../gates/compare.js';
import { familyConfig } from './family-config.js';
import { casesOfLayer, gateCasesOf } from '../families/types.js';

export interface StepCosine {
  prompt: number;
  step: number;
  /** The smallest cosine over the scanned outputs at this case (−1 for a non-finite value). */
  cosine: number;
  /** The output that gave it. */
  output: string;
  /** A graph every layer shares (PhiMoE's experts): the experts this case ran (GateCase.served). */
  experts?: number[];
}

export interface StepScan {
  graph: string;
  outputs: string[];
  threshold: number;
  /** Every case in trace order (prompt, then step). */
  cases: StepCosine[];
  /** The first case under the threshold, in trace order. */
  first?: StepCosine;
  /** How many cases are under it. */
  failing: number;
}

/**
 * Runs graph `graphName` of the export in `exportDir` over every traced case and compares
 * `outputs` (oracle row names: graph outputs and probe keys) with HF at each one. `scratch` holds the
 * gate's CPU-form copy of the graph and is removed after. `layer`: of a graph every layer shares
 * (its cases say which layer they served), that layer's cases only.
 */
export async function scanSteps(
  familyId: FamilyId, checkpointDir: string, traceDir: string, exportDir: string, graphName: string, outputs: string[], threshold: number, scratch: string, layer?: number,
): Promise<StepScan> {
  const { family, config } = familyConfig(familyId, checkpointDir);
  const manifest = JSON.parse(readFileSync(join(exportDir, GRAPHS_JSON), 'utf8')) as ExportManifest;
  const entry = manifest.contexts.flatMap((c) => c.graphs).find((g) => g.name === graphName);
  if (!entry) throw new Error(`${join(exportDir, GRAPHS_JSON)} has no graph ${graphName}`);
  const wanted = new Set(outputs);
  const trace = await Trace.open(traceDir);
  const form = gateForm(entry, GATE_COPIES, family.gateWindow !== false);
  const cases: StepCosine[] = [];
  try {
    const { path } = writeGateModel(join(exportDir, entry.file), Object.keys(entry.probes), scratch, formOptions(entry, form));
    const session = await ort.InferenceSession.create(path, gateSessionOptions(form.copies));
    try {
      const all = gateCasesOf(family, config, entry, trace, manifest.maxContext, exportDir);
      await runGateCases(session, entry.file, layer === undefined ? all : casesOfLayer(all, layer), form, (c, output) => {
        let worst: StepCosine | undefined;
        for (const [name, expected] of Object.entries(c.expected)) {
          if (!wanted.has(name)) continue;
          const cosine = compare(output(name), expected, c.masks?.[name]).cosine;
          if (!worst || cosine < worst.cosine) worst = { prompt: c.prompt, step: c.step, cosine, output: name };
        }
        if (worst) cases.push(c.served ? { ...worst, experts: c.served.experts } : worst);
      });
    } finally {
      await session.release();
    }
  } finally {
    await trace.close();
    rmSync(scratch, { recursive: true, force: true });
  }
  cases.sort((a, b) => a.prompt - b.prompt || a.step - b.step);
  const under = cases.filter((c) => c.cosine < threshold);
  return { graph: graphName, outputs, threshold, cases, ...(under.length ? { first: under[0] } : {}), failing: under.length };
}

