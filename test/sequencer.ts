// The order vitest runs the test files in (one at a time: vitest.config fileParallelism false). Its
// own order, except that nightly.test.ts runs last: it builds the shipped twin matrix (tiny-qwen3
// for v81 and v79, tiny-qwen3.5 for v81), which other files build too (bundle, compile, qwen3_5),
// so run after them its first nightly reads their stages from the run's one cache instead of
// building the three twins again (a farm nightly on a warm cache does the same).
import { BaseSequencer, type TestSpecification } from 'vitest/node';

const LAST = ['test/nightly.test.ts'];

export default class Sequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const last = (f: TestSpecification) => LAST.some((l) => f.moduleId.endsWith(l));
    return [...sorted.filter((f) => !last(f)), ...sorted.filter(last)];
  }
}
