// The native suites find the tiny bundles by environment names; make-bundle's keys map onto them
// without a per-family edit of the mapping.
import { describe, it, expect } from 'vitest';
import { nativeTestEnv } from '../src/toolchain/native.js';

describe('nativeTestEnv', () => {
  it("names the dense twin's bundles as the suites read them, and every family's by its key", () => {
    expect(nativeTestEnv({ fp32: '/a', w8: '/b', trace: '/c', hybrid: '/d', hybridW8: '/e', hybridTrace: '/f', phimoe: '/g', phimoeW8: '/h', phimoeTrace: '/i', fp32Copy: '/j' })).toEqual({
      FORGE_TEST_BUNDLE: '/a', FORGE_TEST_BUNDLE_W8: '/b', FORGE_TEST_TRACE: '/c',
      FORGE_TEST_HYBRID_BUNDLE: '/d', FORGE_TEST_HYBRID_BUNDLE_W8: '/e', FORGE_TEST_HYBRID_TRACE: '/f',
      FORGE_TEST_PHIMOE_BUNDLE: '/g', FORGE_TEST_PHIMOE_BUNDLE_W8: '/h', FORGE_TEST_PHIMOE_TRACE: '/i',
      FORGE_TEST_FP32_COPY_BUNDLE: '/j',
    });
  });

  it('refuses a key that is not a name', () => {
    expect(() => nativeTestEnv({ 'Bad-key': '/x' })).toThrow("make-bundle: 'Bad-key' is not <name>, <name>W8 or <name>Trace");
  });
});
