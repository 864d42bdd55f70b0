// The order vitest runs the test files in (one at a time: vitest.config fileParallelism false). Its
// own order, except that bisect-families.test.ts and then nightly.test.ts run last: they read the
// stages other files build from the run's one cache instead of building them again. bisect-families
// bisects every family's healthy twin, which the family tests build; nightly.test.ts builds the
// shipped twin matrix (tiny-qwen3 for v81 and v79, tiny-qwen3.5 for v81), which bundle, compile and
// qwen3_5 build too (a farm nightly on a warm cache does the same).
import { BaseSequencer, type TestSpecification } from 'vitest/node';

const LAST = ['test/bisect-families.test.ts', 'test/nightly.test.ts'];

export default class Sequencer extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const last = (f: TestSpecification) => LAST.some((l) => f.moduleId.endsWith(l));
    const rank = (f: TestSpecification) => LAST.findIndex((l) => f.moduleId.endsWith(l));
    return [...sorted.filter((f) => !last(f)), ...sorted.filter(last).sort((a, b) => rank(a) - rank(b))];
  }
}
