import { describe, expect, it } from 'vitest';
import { PythonError } from '../src/toolchain/python.js';

describe('a failed Python helper', () => {
  it("is reported by its own one-line refusal ('<name>: error: …') when it printed one", () => {
    const stderr = 'loading weights\nsome warning\ntrace: error: prompt 0 step 3: logits hold 2 non-finite values\n';
    expect(new PythonError('oracles/trace.py', 1, stderr).message).toBe('oracles/trace.py: trace: error: prompt 0 step 3: logits hold 2 non-finite values');
  });

  it('keeps the end of stderr (the traceback) when it crashed without one', () => {
    const stderr = ['Traceback (most recent call last):', '  File "x.py", line 1', 'KeyError: \'model.norm.weight\''].join('\n');
    const m = new PythonError('oracles/trace.py', 1, stderr).message;
    expect(m.split('\n')[0]).toBe('oracles/trace.py exited with 1:');
    expect(m).toContain("KeyError: 'model.norm.weight'");
  });
});
