import { defineConfig } from 'vitest/config';
import Sequencer from './test/sequencer.js';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 120_000,
    hookTimeout: 600_000,
    // Builds spawn Python and native tools; two cores on CI, so keep files from fighting.
    fileParallelism: false,
    sequence: { sequencer: Sequencer },
  },
});
