// ExternalDataWriter's asynchronous side: appendStream (writes in flight while the caller
// computes) and commitAsync (waits for them, fsyncs off the main thread).
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ExternalDataWriter } from '../../src/onnx/external.js';

const root = mkdtempSync(join(tmpdir(), 'forge-external-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const bytes = (n: number, v: number) => new Uint8Array(n).fill(v);

describe('ExternalDataWriter.appendStream', () => {
  it('places chunks in order, aligned like append, whatever order their writes finish in', async () => {
    const path = join(root, 'a.data');
    const sink = new ExternalDataWriter(path, { align: 64 });
    const first = sink.append(bytes(10, 1));
    const ref = await sink.appendStream(300, async (write) => {
      const pending = [write(bytes(100, 2)), write(bytes(150, 3))];
      expect(() => sink.append(bytes(1, 9))).toThrow(/append during appendStream/);
      expect(() => sink.commit()).toThrow(/writes in flight/);
      pending.push(write(bytes(50, 4)));
      await Promise.all(pending);
    });
    const last = sink.append(bytes(5, 5));
    await sink.commitAsync();
    expect(first).toMatchObject({ offset: 0, length: 10 });
    expect(ref).toMatchObject({ offset: 64, length: 300 });
    expect(last).toMatchObject({ offset: 384, length: 5 });
    const file = readFileSync(path);
    expect(file.length).toBe(389);
    expect([file[9], file[10], file[63], file[64], file[163], file[164], file[313], file[314], file[363], file[364], file[384]]).toEqual([1, 0, 0, 2, 2, 3, 3, 4, 4, 0, 5]);
  });

  it('refuses more or fewer bytes than declared, and an aborted stream leaves no file behind', async () => {
    const dir = mkdtempSync(join(root, 'b-'));
    const sink = new ExternalDataWriter(join(dir, 'b.data'));
    await expect(sink.appendStream(10, async (write) => void (await write(bytes(11, 1))))).rejects.toThrow(/more than 10 bytes/);
    const other = new ExternalDataWriter(join(dir, 'c.data'));
    await expect(other.appendStream(10, async (write) => void (await write(bytes(4, 1))))).rejects.toThrow(/4 bytes written, 10 declared/);
    sink.abort();
    other.abort();
    await new Promise((r) => setTimeout(r, 50));
    expect(readdirSync(dir)).toEqual([]);
    expect(existsSync(join(dir, 'b.data'))).toBe(false);
  });
});
