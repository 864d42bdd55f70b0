import { execFile } from 'node:child_process';

const CHECK = 'import onnx,sys; onnx.checker.check_model(sys.argv[1], full_check=True)';

/**
 * Run the reference ONNX checker (with shape inference: full_check) on a model file, using
 * a Python that has the `onnx` package. Passing the path (not loaded bytes) lets it follow
 * external data and handle models over 2 GB. Rejects with the checker's own message.
 */
export function checkModel(path: string, python: string): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    execFile(python, ['-c', CHECK, path], { maxBuffer: 16 << 20 }, (err, _stdout, stderr) => {
      if (!err) return resolvePromise();
      if (typeof err.code === 'string') return reject(new Error(`cannot run ${python} for the onnx checker: ${err.message}`));
      const lines = String(stderr).trim().split('\n');
      // The traceback's last line is "onnx.onnx_cpp2py_export.checker.ValidationError: <msg>".
      const last = lines.at(-1) ?? err.message;
      const msg = last.replace(/^[\w.]*(ValidationError|InferenceError|Error):\s*/, '');
      const e = new Error(`onnx checker rejected ${path}: ${msg || err.message}`);
      (e as Error & { details?: string }).details = String(stderr);
      reject(e);
    });
  });
}
