#!/usr/bin/env python3
"""Runs compiled QNN contexts on this machine's HTP: the x86_64 simulator inside onnxruntime-qnn's
libQnnHtp.so. Used by the emulation gate (src/gates/emulation.ts).

    python oracles/qnn_simulate.py info
        Where the simulator is: {"libDir", "htp", "system", "epLib", "machine", "os", versions};
        "missing" lists what this host lacks to run it (empty when it can).

    python oracles/qnn_simulate.py run --wrapper G_ctx.onnx --soc-model 87 [--no-fp16]
                                       --feeds F.safetensors --out O.safetensors
        Loads the EPContext wrapper (it names its context binary, which must sit beside it) with the
        QNN EP on the HTP backend, CPU fallback disabled, and runs it once per case of F: tensors
        `<case>/<input>`, cases 0..N-1 (`__metadata__.cases` = N). Writes every output of every case
        to O as `<case>/<output>` (float32), and prints one JSON line:
        {"ok": true, "cases": N, "loadSeconds", "runSeconds": [...], "inputs", "outputs", "providers"}.

The caller runs this in a child process of its own: a crash of the simulator (a signal) is seen
there as the process dying, with this script's last stderr lines. Other failures: exit 1 and one
"qnn_simulate:" line on stderr; exit 3 when onnxruntime-qnn is not importable.
"""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def fail(msg, code=1):
    print("qnn_simulate: " + " ".join(str(msg).split()), file=sys.stderr, flush=True)
    sys.exit(code)


def note(msg):
    """Progress on stderr, so a crash report can say how far the run got."""
    print(f"[qnn_simulate] {msg}", file=sys.stderr, flush=True)


def qnn_package():
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except Exception as e:  # noqa: BLE001
        fail(f"onnxruntime-qnn is not importable in {sys.executable} ({type(e).__name__}: {e})", 3)
    return ort, onnxruntime_qnn


def info(_a):
    ort, oq = qnn_package()
    lib_dir = os.path.dirname(oq.get_library_path())
    files = {"htp": "libQnnHtp.so", "system": "libQnnSystem.so", "epLib": "libonnxruntime_providers_qnn.so"}
    out = {k: os.path.join(lib_dir, v) for k, v in files.items()}
    missing = [v for k, v in files.items() if not os.path.isfile(out[k])]
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        missing.insert(0, f"an x86_64 Linux host (this is {platform.system()} {platform.machine()}): the HTP simulator in "
                          "onnxruntime-qnn's libQnnHtp.so is built for x86_64 Linux only")
    info_mod = getattr(oq, "build_and_package_info", None)
    import importlib.metadata as m
    print(json.dumps({"libDir": lib_dir, **out, "machine": platform.machine(), "os": platform.system(),
                      "onnxruntime": ort.__version__, "onnxruntimeQnn": m.version("onnxruntime-qnn"),
                      "qairt": getattr(info_mod, "qnn_version", None), "missing": missing}))


def run(a):
    from safetensors.numpy import load_file, save_file
    ort, oq = qnn_package()
    for p in (a.wrapper, a.feeds):
        if not os.path.isfile(p):
            fail(f"not found: {p}", 2)
    feeds_all = load_file(a.feeds)
    with open(a.feeds, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    n = int(header.get("__metadata__", {}).get("cases", "-1"))
    if n < 1:
        fail(f"{a.feeds} names no cases (__metadata__.cases)", 2)

    ort.set_default_logger_severity(3)
    ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        fail("the QNN plugin EP registered but offers no device")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices(devices, {"backend_path": oq.get_qnn_htp_path(), "soc_model": str(a.soc_model),
                                          "enable_htp_fp16_precision": "1" if a.fp16 else "0"})
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    note(f"loading {a.wrapper}")
    t = time.time()
    try:
        sess = ort.InferenceSession(a.wrapper, so)
    except Exception as e:  # noqa: BLE001
        fail(f"{os.path.basename(a.wrapper)} does not load on the HTP simulator: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    load = time.time() - t
    providers = sess.get_providers()
    if "QNNExecutionProvider" not in providers:
        fail(f"{os.path.basename(a.wrapper)} loaded without the QNN EP (providers {providers})")
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]

    outputs, secs = {}, []
    for c in range(n):
        feeds = {}
        for name in in_names:
            key = f"{c}/{name}"
            if key not in feeds_all:
                fail(f"case {c} has no input {name}")
            feeds[name] = feeds_all[key]
        note(f"case {c + 1}/{n}")
        t = time.time()
        try:
            got = sess.run(out_names, feeds)
        except Exception as e:  # noqa: BLE001
            fail(f"case {c}: run failed on the HTP simulator: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
        secs.append(round(time.time() - t, 4))
        for name, v in zip(out_names, got):
            outputs[f"{c}/{name}"] = np.ascontiguousarray(v, dtype=np.float32)
    save_file(outputs, a.out)
    print(json.dumps({"ok": True, "cases": n, "loadSeconds": round(load, 4), "runSeconds": secs,
                      "inputs": in_names, "outputs": out_names, "providers": providers}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info")
    r = sub.add_parser("run")
    r.add_argument("--wrapper", required=True)
    r.add_argument("--soc-model", type=int, required=True)
    r.add_argument("--fp16", dest="fp16", action="store_true", default=True)
    r.add_argument("--no-fp16", dest="fp16", action="store_false")
    r.add_argument("--feeds", required=True)
    r.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        {"info": info, "run": run}[a.cmd](a)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        fail(f"{a.cmd}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
