// A loopback stand-in for the hub's HTTP endpoints that @huggingface/hub (2.17.5) and our downloader
// call, with state in memory. Routes were read from node_modules/@huggingface/hub/src/lib/*.ts:
//   GET  /api/whoami-v2                               whoAmI
//   POST /api/repos/create                            createRepo
//   GET  /api/models/:ns/:name/revision/:rev          modelInfo (sha of a branch head)
//   GET  /api/models/:ns/:name/tree/:rev[/:path]      listFiles (oid, size, lfs {oid,size,pointerSize})
//   POST /api/models/:ns/:name/paths-info/:rev        pathsInfo
//   POST /api/models/:ns/:name/preupload/:rev         commit: regular or lfs per file
//   POST /:ns/:name.git/info/lfs/objects/batch        commit: LFS batch; objects present get no action
//   PUT  /lfs-upload/:oid                             commit: the "basic" transfer's signed PUT
//   POST /api/models/:ns/:name/commit/:rev            commit: ndjson header/file/lfsFile/deletedFile
//   GET  /:ns/:name/resolve/:rev/:path                fileDownloadInfo and downloads (Range, ETag, X-Repo-Commit;
//                                                      LFS: 302 to /cdn/:oid with X-Linked-Etag / X-Linked-Size)
// Anything else is answered 500 and recorded in `unexpected`, which the tests require to stay empty.
import { createHash, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export const GOOD_TOKEN = 'hf_standinGoodToken0123456789';
const LFS_EXT = /\.(onnx|data|bin|safetensors|gguf|pt|npz)$/;

interface StoredFile { size: number; oid: string; content?: Buffer; lfs?: { oid: string; size: number; pointerSize: number } }
interface Commit { oid: string; title: string; parent: string | null; files: Map<string, StoredFile> }
interface Repo { name: string; private: boolean; commits: Commit[] }
export interface Logged { method: string; path: string; status: number; range?: string }

const sha = (alg: string, ...parts: (string | Buffer)[]) => parts.reduce((h, p) => h.update(p), createHash(alg)).digest('hex');
const gitOid = (b: Buffer) => sha('sha1', `blob ${b.length}\0`, b);

export class HubStandin {
  url = '';
  readonly requests: Logged[] = [];
  readonly unexpected: string[] = [];
  readonly repos = new Map<string, Repo>();
  readonly lfs = new Map<string, Buffer>();
  /** Faults to inject; the two that break a transfer fire once. */
  faults: {
    /** Drop the LFS PUT of this object after `afterBytes`, once `afterStored` other objects have arrived. */
    failUpload?: { oid: string; afterBytes: number; afterStored: number };
    /** Break a download of this path after `afterBytes` of the body. */
    dropDownload?: { path: string; afterBytes: number };
    /** Serve this path with one byte changed, until cleared. */
    corrupt?: string;
  } = {};
  private server!: Server;
  private stored = 0;

  static async start(): Promise<HubStandin> {
    const s = new HubStandin();
    s.server = createServer((req, res) => { s.handle(req, res).catch((e) => s.fail(res, req, `handler threw: ${(e as Error).stack}`)); });
    await new Promise<void>((r) => s.server.listen(0, '127.0.0.1', r));
    s.url = `http://127.0.0.1:${(s.server.address() as AddressInfo).port}`;
    return s;
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((r) => this.server.close(() => r()));
  }

  /** Requests that could change state. */
  writes(): Logged[] { return this.requests.filter((r) => r.method !== 'GET'); }
  head(name: string): Commit | undefined { const c = this.repos.get(name)?.commits; return c?.[c.length - 1]; }

  /** A repo with one commit holding these files (binary extensions as LFS), for download tests. */
  seed(name: string, files: Record<string, Buffer>, opts: { private?: boolean } = {}): string {
    const repo: Repo = { name, private: !!opts.private, commits: [] };
    this.repos.set(name, repo);
    const map = new Map<string, StoredFile>();
    for (const [p, b] of Object.entries(files)) map.set(p, this.store(p, b, LFS_EXT.test(p)));
    return this.addCommit(repo, 'seed', map).oid;
  }

  private store(path: string, b: Buffer, asLfs: boolean): StoredFile {
    if (!asLfs) return { size: b.length, oid: gitOid(b), content: b };
    const oid = sha('sha256', b);
    this.lfs.set(oid, b);
    const pointer = Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${oid}\nsize ${b.length}\n`);
    return { size: b.length, oid: gitOid(pointer), lfs: { oid, size: b.length, pointerSize: pointer.length } };
  }

  private addCommit(repo: Repo, title: string, files: Map<string, StoredFile>): Commit {
    const parent = repo.commits.at(-1)?.oid ?? null;
    const oid = sha('sha1', String(parent), title, JSON.stringify([...files].map(([p, f]) => [p, f.oid])), randomBytes(4));
    const c = { oid, title, parent, files };
    repo.commits.push(c);
    return c;
  }

  private fail(res: ServerResponse, req: IncomingMessage, why: string): void {
    const line = `${req.method} ${req.url}: ${why}`;
    this.unexpected.push(line);
    console.error(`[hub stand-in] UNEXPECTED ${line}`);
    if (!res.headersSent) this.json(res, 500, { error: `stand-in: ${why}` });
  }

  private json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
    res.writeHead(status, { 'Content-Type': 'application/json', ...headers }).end(JSON.stringify(body));
  }

  private async body(req: IncomingMessage): Promise<Buffer> {
    const parts: Buffer[] = [];
    for await (const c of req) parts.push(c as Buffer);
    return Buffer.concat(parts);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const u = new URL(req.url ?? '/', this.url);
    const path = decodeURIComponent(u.pathname);
    const entry: Logged = { method: req.method ?? '?', path, status: 0, ...(req.headers.range ? { range: req.headers.range } : {}) };
    this.requests.push(entry);
    res.on('finish', () => { entry.status = res.statusCode; });
    const auth = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    const signed = path.startsWith('/lfs-upload/') || path.startsWith('/cdn/');
    if (auth !== undefined && auth !== GOOD_TOKEN && !signed) {
      return this.json(res, 401, { error: 'Invalid credentials in Authorization header' });
    }
    const authed = auth === GOOD_TOKEN;
    const repoOr404 = (name: string): Repo | undefined => {
      const r = this.repos.get(name);
      if (!r || (r.private && !authed)) {
        this.json(res, r || !authed ? 401 : 404, { error: 'Repository not found' }, { 'X-Error-Code': 'RepoNotFound' });
        return undefined;
      }
      return r;
    };
    const commitAt = (r: Repo, rev: string): Commit | undefined => {
      const c = rev === 'main' || rev === 'HEAD' ? r.commits.at(-1) : r.commits.find((x) => x.oid === rev);
      if (!c) this.json(res, 404, { error: `Invalid rev id: ${rev}` }, { 'X-Error-Code': 'RevisionNotFound' });
      return c;
    };
    const needWrite = () => { if (!authed) this.json(res, 401, { error: 'Unauthorized' }); return authed; };
    let m: RegExpExecArray | null;

    if (req.method === 'GET' && path === '/api/whoami-v2') {
      if (!authed) return this.json(res, 401, { error: 'Unauthorized' });
      return this.json(res, 200, { type: 'user', id: 'u1', name: 'tester', fullname: 'Tester', orgs: [], auth: { type: 'access_token', accessToken: { displayName: 'ci', role: 'write', createdAt: new Date().toISOString() } } });
    }
    if (req.method === 'POST' && path === '/api/repos/create') {
      if (!needWrite()) return;
      const b = JSON.parse((await this.body(req)).toString()) as { name: string; organization?: string; type?: string; visibility?: string; private?: boolean };
      if ((b.type ?? 'model') !== 'model') return this.fail(res, req, `repo type ${b.type}`);
      const name = `${b.organization ?? 'tester'}/${b.name}`;
      if (this.repos.has(name)) return this.json(res, 409, { error: 'You already created this model repo' });
      const repo: Repo = { name, private: b.visibility === 'private' || b.private === true, commits: [] };
      this.repos.set(name, repo);
      const ga = Buffer.from('*.onnx filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n');
      this.addCommit(repo, 'initial commit', new Map([['.gitattributes', this.store('.gitattributes', ga, false)]]));
      return this.json(res, 200, { url: `${this.url}/${name}`, name });
    }
    if (req.method === 'GET' && (m = /^\/api\/models\/([^/]+\/[^/]+)\/revision\/([^/]+)$/.exec(path))) {
      const r = repoOr404(m[1]); if (!r) return;
      const c = commitAt(r, m[2]); if (!c) return;
      return this.json(res, 200, { _id: r.name, id: r.name, sha: c.oid, private: r.private, downloads: 0, likes: 0, gated: false, lastModified: new Date().toISOString(), siblings: [...c.files.keys()].map((rfilename) => ({ rfilename })) });
    }
    if (req.method === 'GET' && (m = /^\/api\/models\/([^/]+\/[^/]+)\/tree\/([^/]+)(?:\/(.*))?$/.exec(path))) {
      const r = repoOr404(m[1]); if (!r) return;
      const c = commitAt(r, m[2]); if (!c) return;
      const prefix = m[3] ? `${m[3]}/` : '';
      const recursive = u.searchParams.get('recursive') === 'true';
      const out: unknown[] = [];
      const dirs = new Set<string>();
      for (const [p, f] of [...c.files].sort(([a], [b]) => a.localeCompare(b))) {
        if (!p.startsWith(prefix)) continue;
        const rest = p.slice(prefix.length).split('/');
        for (let i = 1; i < rest.length && (recursive || i === 1); i++) dirs.add(prefix + rest.slice(0, i).join('/'));
        if (rest.length === 1 || recursive) out.push({ type: 'file', path: p, ...this.describe(f) });
      }
      for (const d of dirs) out.push({ type: 'directory', path: d, oid: sha('sha1', d), size: 0 });
      return this.json(res, 200, out);
    }
    if (req.method === 'POST' && (m = /^\/api\/models\/([^/]+\/[^/]+)\/paths-info\/([^/]+)$/.exec(path))) {
      const r = repoOr404(m[1]); if (!r) return;
      const c = commitAt(r, m[2]); if (!c) return;
      const b = JSON.parse((await this.body(req)).toString()) as { paths: string[]; expand?: boolean };
      const out = b.paths.filter((p) => c.files.has(p)).map((p) => ({ type: 'file', path: p, ...this.describe(c.files.get(p)!), ...(b.expand ? { lastCommit: { id: c.oid, title: c.title, date: new Date().toISOString() } } : {}) }));
      return this.json(res, 200, out);
    }
    if (req.method === 'POST' && (m = /^\/api\/models\/([^/]+\/[^/]+)\/preupload\/([^/]+)$/.exec(path))) {
      if (!needWrite()) return;
      const r = repoOr404(m[1]); if (!r) return;
      const b = JSON.parse((await this.body(req)).toString()) as { files: { path: string; size: number; sample: string }[] };
      // Like the hub: LFS for big files, binary extensions, or content that is not text.
      const lfsFor = (f: { path: string; size: number; sample: string }) => f.size > 10_000_000 || LFS_EXT.test(f.path) || Buffer.from(f.sample, 'base64').includes(0);
      return this.json(res, 200, { files: b.files.map((f) => ({ path: f.path, uploadMode: lfsFor(f) ? 'lfs' : 'regular', shouldIgnore: false })) });
    }
    if (req.method === 'POST' && (m = /^\/([^/]+\/[^/]+)\.git\/info\/lfs\/objects\/batch$/.exec(path))) {
      if (!needWrite()) return;
      const r = repoOr404(m[1]); if (!r) return;
      const b = JSON.parse((await this.body(req)).toString()) as { operation: string; objects: { oid: string; size: number }[] };
      if (b.operation !== 'upload') return this.fail(res, req, `lfs batch operation ${b.operation}`);
      const objects = b.objects.map((o) => this.lfs.has(o.oid) ? { oid: o.oid, size: o.size }
        : { oid: o.oid, size: o.size, authenticated: true, actions: { upload: { href: `${this.url}/lfs-upload/${o.oid}?size=${o.size}&sig=${randomBytes(6).toString('hex')}` } } });
      return this.json(res, 200, { transfer: 'basic', objects }, { 'Content-Type': 'application/vnd.git-lfs+json' });
    }
    if (req.method === 'PUT' && (m = /^\/lfs-upload\/([0-9a-f]{64})$/.exec(path))) {
      const oid = m[1];
      const fault = this.faults.failUpload?.oid === oid ? this.faults.failUpload : undefined;
      const parts: Buffer[] = [];
      let n = 0;
      for await (const c of req) {
        parts.push(c as Buffer);
        n += (c as Buffer).length;
        if (fault && n >= fault.afterBytes) {
          this.faults.failUpload = undefined;
          const t0 = Date.now();
          while (this.stored < fault.afterStored && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 10));
          entry.status = -1;
          req.socket.destroy();
          return;
        }
      }
      const b = Buffer.concat(parts);
      if (sha('sha256', b) !== oid || String(b.length) !== u.searchParams.get('size')) return this.json(res, 400, { error: 'content does not match oid/size' });
      this.lfs.set(oid, b);
      this.stored++;
      res.writeHead(200, { ETag: `"${oid}"` }).end();
      return;
    }
    if (req.method === 'POST' && (m = /^\/api\/models\/([^/]+\/[^/]+)\/commit\/([^/]+)$/.exec(path))) {
      if (!needWrite()) return;
      const r = repoOr404(m[1]); if (!r) return;
      if (m[2] !== 'main') return this.fail(res, req, `commit to branch ${m[2]}`);
      const lines = (await this.body(req)).toString().split('\n').filter(Boolean).map((l) => JSON.parse(l) as { key: string; value: Record<string, unknown> });
      const header = lines.find((l) => l.key === 'header')?.value ?? {};
      const head = r.commits.at(-1)!;
      if (header.parentCommit && header.parentCommit !== head.oid) return this.json(res, 412, { error: 'A commit has happened since. Please refresh and try again.' });
      const files = new Map(head.files);
      for (const { key, value } of lines) {
        if (key === 'header') continue;
        const p = value.path as string;
        if (key === 'file') files.set(p, this.store(p, Buffer.from(value.content as string, value.encoding === 'base64' ? 'base64' : 'utf8'), false));
        else if (key === 'lfsFile') {
          const b = this.lfs.get(value.oid as string);
          if (!b) return this.json(res, 422, { error: `LFS object ${value.oid} was not uploaded` });
          files.set(p, this.store(p, b, true));
        } else if (key === 'deletedFile') files.delete(p);
        else return this.fail(res, req, `commit line ${key}`);
      }
      const c = this.addCommit(r, String(header.summary ?? ''), files);
      return this.json(res, 200, { success: true, commitOid: c.oid, commitUrl: `${this.url}/${r.name}/commit/${c.oid}`, hookOutput: '' });
    }
    if (req.method === 'GET' && (m = /^\/([^/]+\/[^/]+)\/resolve\/([^/]+)\/(.+)$/.exec(path))) {
      const r = repoOr404(m[1]); if (!r) return;
      const c = commitAt(r, m[2]); if (!c) return;
      const f = c.files.get(m[3]);
      if (!f) return this.json(res, 404, { error: 'Entry not found' }, { 'X-Error-Code': 'EntryNotFound' });
      const common = { 'X-Repo-Commit': c.oid };
      if (f.lfs) {
        res.writeHead(302, { ...common, Location: `${this.url}/cdn/${f.lfs.oid}?path=${encodeURIComponent(m[3])}&sig=${randomBytes(6).toString('hex')}`, 'X-Linked-Etag': `"${f.lfs.oid}"`, 'X-Linked-Size': String(f.size), ETag: `"${f.oid}"` }).end();
        return;
      }
      return this.serve(req, res, m[3], f.content!, { ...common, ETag: `"${f.oid}"` });
    }
    if (req.method === 'GET' && (m = /^\/cdn\/([0-9a-f]{64})$/.exec(path))) {
      const b = this.lfs.get(m[1]);
      if (!b) return this.json(res, 404, { error: 'no such object' });
      return this.serve(req, res, u.searchParams.get('path') ?? '', b, { ETag: `"${m[1]}"` });
    }
    this.fail(res, req, 'no such endpoint in the stand-in');
  }

  private describe(f: StoredFile) {
    return { oid: f.oid, size: f.size, ...(f.lfs ? { lfs: f.lfs } : {}) };
  }

  /** Bytes with Range support (one range, "a-" or "a-b"), and the download faults. */
  private serve(req: IncomingMessage, res: ServerResponse, path: string, data: Buffer, headers: Record<string, string>): void {
    let body = data;
    if (this.faults.corrupt === path) { body = Buffer.from(data); body[0] ^= 0xff; }
    const range = /^bytes=(\d+)-(\d*)$/.exec(req.headers.range ?? '');
    let start = 0;
    let end = body.length - 1;
    if (range) {
      start = Number(range[1]);
      end = range[2] ? Math.min(Number(range[2]), end) : end;
      if (start > end) { res.writeHead(416, { 'Content-Range': `bytes */${body.length}` }).end(); return; }
    }
    const slice = body.subarray(start, end + 1);
    res.writeHead(range ? 206 : 200, {
      ...headers, 'Accept-Ranges': 'bytes', 'Content-Length': String(slice.length), 'Content-Type': 'application/octet-stream',
      ...(range ? { 'Content-Range': `bytes ${start}-${end}/${body.length}` } : {}),
    });
    const drop = this.faults.dropDownload;
    if (drop?.path === path && slice.length > drop.afterBytes) {
      this.faults.dropDownload = undefined;
      res.write(slice.subarray(0, drop.afterBytes), () => setTimeout(() => res.socket?.destroy(), 20));
      return;
    }
    res.end(slice);
  }
}
