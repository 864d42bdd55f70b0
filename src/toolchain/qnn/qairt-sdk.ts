// Where the QAIRT SDK is (QAIRT_SDK_ROOT) and which version it is. Apart from qairt.ts so that tool
// versions (every stage's cache key) can name it without importing the compile helpers.
import { existsSync, readFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';

export const QAIRT_HOST = 'x86_64-linux-clang';

export interface QairtSdk {
  root: string;
  bin: string;
  lib: string;
  /** Python modules of the converters. */
  python: string;
}

/** The SDK named by QAIRT_SDK_ROOT, or null when it is not set. Throws when it is set but unusable. */
export function qairtSdk(env: NodeJS.ProcessEnv = process.env, exists: (p: string) => boolean = existsSync): QairtSdk | null {
  const root = env.QAIRT_SDK_ROOT;
  if (!root) return null;
  const sdk: QairtSdk = { root: resolve(root), bin: join(resolve(root), 'bin', QAIRT_HOST), lib: join(resolve(root), 'lib', QAIRT_HOST), python: join(resolve(root), 'lib', 'python') };
  const missing = ['qnn-onnx-converter', 'qnn-model-lib-generator', 'qnn-context-binary-generator', 'qnn-context-binary-utility']
    .map((t) => join(sdk.bin, t))
    .concat([join(sdk.lib, 'libQnnHtp.so'), join(sdk.lib, 'libQnnHtpNetRunExtensions.so')])
    .filter((p) => !exists(p));
  if (missing.length) {
    throw new Error(`QAIRT_SDK_ROOT=${root} is not a usable QAIRT SDK: missing ${missing.join(', ')}. ` +
      'Point it at the unpacked SDK (the directory with bin/x86_64-linux-clang/), or unset it to use onnxruntime-qnn.');
  }
  return sdk;
}

/** The SDK's version: `version:` in its sdk.yaml, else the name of its directory (SDKs unpack as <version>/). */
export function qairtSdkVersion(sdk: QairtSdk): string {
  const yaml = join(sdk.root, 'sdk.yaml');
  const m = existsSync(yaml) ? /^\s*version\s*:\s*['"]?([^'"\s]+)/m.exec(readFileSync(yaml, 'utf8')) : null;
  return m ? m[1] : basename(sdk.root);
}
