#!/usr/bin/env python3
"""AOT-compile ONNX graphs into one QNN HTP context binary with onnxruntime-qnn (plugin EP).

    python oracles/qnn_compile.py --out DIR --name CTX --soc-model 87 [--htp-arch 81] [--vtcm-mb 8]
        [--opt 3] [--fp16 | --no-fp16] [--separate] [--allow-cpu-fallback] GRAPH.onnx [GRAPH.onnx ...]
    python oracles/qnn_compile.py --info CTX.bin        # what a context binary says about itself

The graphs of one context (e.g. shard0.prefill.onnx shard0.decode.onnx) are compiled in order with
`ep.share_ep_contexts=1` (the last also `ep.stop_share_ep_contexts=1`) and `ep.context_embed_mode=0`,
so their weights are shared and ONE `<CTX>.bin` serves all of them; each graph gets a thin
`<graph>_ctx.onnx` EPContext wrapper that points at it. `--separate` gives every graph its own
context `<graph>.bin` instead (weight-shared contexts do not load on the x86 HTP simulator).

Prints one JSON report on stdout. ORT's verbose log (QNN's messages included) goes to
DIR/compile.log. On failure: exit 1 (compile failed or produced something unusable) or 3 (the
toolchain is missing), and one line on stderr that starts with "qnn_compile:".

Checks made before reporting success, because onnxruntime-qnn fails silently in several ways:
  - a bad soc_model makes ModelCompiler "succeed" with no binary and the graph left on CPU;
  - nodes the QNN EP rejects (e.g. a standalone per-channel DequantizeLinear) stay in the wrapper as
    CPU nodes: refused unless --allow-cpu-fallback, with the EP's reasons from the log;
  - htp_arch is ignored when soc_model is set: the binary's own soc/arch are read back (QnnSystem
    API via ctypes, and the graph options string the HTP backend embeds) and must match.
"""
import argparse
import ctypes as C
import json
import mmap
import os
import re
import resource
import sys
import time

# SoC model id -> (SoC, HTP arch). onnxruntime core/providers/qnn soc_utils; checked against the
# `soc_type=...;arch=...` string the HTP backend writes into each binary (69 -> SM8750/79, 87 -> SM8850/81).
SOCS = {43: ("SM8550", 73), 57: ("SM8650", 75), 69: ("SM8750", 79), 87: ("SM8850", 81)}

_stderr_fd = None
_log = None


def fail(msg, code=1):
    if _log is not None:
        _log.close()
    line = "qnn_compile: " + " ".join(str(msg).split())
    os.write(_stderr_fd if _stderr_fd is not None else 2, (line + "\n").encode())
    sys.exit(code)


# ---------------------------------------------------------------------------------------------
# Context binary info: QnnSystemContext_getBinaryInfo through ctypes (struct layouts of the QNN
# 2.x public headers QnnSystemInterface.h / QnnSystemContext.h / QnnDevice.h / QnnHtpDevice.h).
class _Ver(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]


class _GraphV3(C.Structure):
    _fields_ = [("graphName", C.c_char_p), ("numGraphInputs", C.c_uint32), ("graphInputs", C.c_void_p),
                ("numGraphOutputs", C.c_uint32), ("graphOutputs", C.c_void_p), ("numUpdateableTensors", C.c_uint32),
                ("updateableTensors", C.c_void_p), ("graphBlobInfoSize", C.c_uint32), ("graphBlobInfo", C.c_void_p),
                ("startOpIndex", C.c_uint32), ("endOpIndex", C.c_uint32)]


class _GraphInfo(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v", _GraphV3)]  # every version starts with graphName


class _OnChip(C.Structure):
    _fields_ = [("vtcmSize", C.c_size_t), ("socModel", C.c_uint32), ("signedPdSupport", C.c_bool),
                ("dlbcSupport", C.c_bool), ("arch", C.c_uint32)]


class _DevExt(C.Structure):
    _fields_ = [("devType", C.c_uint32), ("onChip", _OnChip)]


class _HwDevV1(C.Structure):
    _fields_ = [("deviceId", C.c_uint32), ("deviceType", C.c_uint32), ("numCores", C.c_uint32),
                ("cores", C.c_void_p), ("ext", C.POINTER(_DevExt))]


class _HwDev(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", _HwDevV1)]


class _PlatV1(C.Structure):
    _fields_ = [("numHwDevices", C.c_uint32), ("hwDevices", C.POINTER(_HwDev))]


class _Plat(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", _PlatV1)]


_COMMON = [("backendId", C.c_uint32), ("buildId", C.c_char_p), ("coreApiVersion", _Ver),
           ("backendApiVersion", _Ver), ("socVersion", C.c_char_p)]


class _BinV1(C.Structure):  # V1 and V2 (V2 appends platformInfo)
    _fields_ = _COMMON + [("hwInfoBlobVersion", _Ver), ("contextBlobVersion", _Ver), ("hwInfoBlobSize", C.c_uint32),
                          ("hwInfoBlob", C.c_void_p), ("contextBlobSize", C.c_uint64), ("numContextTensors", C.c_uint32),
                          ("contextTensors", C.c_void_p), ("numGraphs", C.c_uint32), ("graphs", C.POINTER(_GraphInfo)),
                          ("platformInfo", C.POINTER(_Plat))]


class _BinV3(C.Structure):
    _fields_ = _COMMON + [("contextBlobVersion", _Ver), ("contextBlobSize", C.c_uint64), ("numContextTensors", C.c_uint32),
                          ("contextTensors", C.c_void_p), ("numGraphs", C.c_uint32), ("graphs", C.POINTER(_GraphInfo)),
                          ("platformInfo", C.POINTER(_Plat)), ("contextMetadataSize", C.c_uint32),
                          ("contextMetadata", C.c_void_p), ("socModel", C.c_uint32)]


class _BinInfo(C.Structure):
    _fields_ = [("version", C.c_uint32)]


class _SysFns(C.Structure):
    _fields_ = [("systemContextCreate", C.c_void_p), ("systemContextGetBinaryInfo", C.c_void_p),
                ("systemContextGetMetaData", C.c_void_p), ("systemContextFree", C.c_void_p)]


class _SysIface(C.Structure):
    _fields_ = [("backendId", C.c_uint32), ("providerName", C.c_char_p), ("systemApiVersion", _Ver), ("fns", _SysFns)]


def _ver(v):
    return f"{v.major}.{v.minor}.{v.patch}"


def qnn_system_info(path, lib_dir):
    """What QnnSystem says about a context binary; {'error': ...} when it cannot be read."""
    try:
        lib = C.CDLL(os.path.join(lib_dir, "libQnnSystem.so"))
        providers = C.POINTER(C.POINTER(_SysIface))()
        n = C.c_uint32()
        if lib.QnnSystemInterface_getProviders(C.byref(providers), C.byref(n)) != 0 or n.value < 1:
            return {"error": "QnnSystemInterface_getProviders failed"}
        fns = providers[0].contents.fns
        create = C.CFUNCTYPE(C.c_uint64, C.POINTER(C.c_void_p))(fns.systemContextCreate)
        get_info = C.CFUNCTYPE(C.c_uint64, C.c_void_p, C.c_void_p, C.c_uint64, C.POINTER(C.POINTER(_BinInfo)),
                               C.POINTER(C.c_uint64))(fns.systemContextGetBinaryInfo)
        free = C.CFUNCTYPE(C.c_uint64, C.c_void_p)(fns.systemContextFree)
        handle = C.c_void_p()
        if create(C.byref(handle)) != 0:
            return {"error": "QnnSystemContext_create failed"}
        try:
            with open(path, "rb") as f:
                # A private mapping: QNN wants a writable pointer, pages are read only as it touches them.
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            try:
                buf = (C.c_char * len(mm)).from_buffer(mm)
                info = C.POINTER(_BinInfo)()
                size = C.c_uint64()
                rc = get_info(handle, buf, len(mm), C.byref(info), C.byref(size))
                if rc != 0:
                    return {"error": f"QnnSystemContext_getBinaryInfo returned {rc & 0xFFFF}"}
                version = info.contents.version
                base = C.addressof(info.contents) + 8  # the union follows a 4-byte enum, 8-aligned
                b = (_BinV3 if version >= 3 else _BinV1).from_address(base)
                out = {
                    "binaryInfoVersion": version, "backendId": b.backendId,
                    "buildId": (b.buildId or b"").decode(), "coreApiVersion": _ver(b.coreApiVersion),
                    "backendApiVersion": _ver(b.backendApiVersion), "contextBlobSize": b.contextBlobSize,
                    "graphs": [(b.graphs[i].v.graphName or b"").decode() for i in range(b.numGraphs)],
                }
                if version >= 3:
                    out["socModel"] = b.socModel
                if version >= 2 and b.platformInfo:
                    p = b.platformInfo.contents
                    for i in range(p.v1.numHwDevices):
                        ext = p.v1.hwDevices[i].v1.ext
                        if ext:
                            out["device"] = {"socModel": ext.contents.onChip.socModel, "arch": ext.contents.onChip.arch,
                                             "vtcmMb": ext.contents.onChip.vtcmSize}
                return out
            finally:
                buf = None
                try:
                    mm.close()
                except BufferError:
                    pass
        finally:
            free(handle)
    except Exception as e:  # noqa: BLE001 - the report says why instead
        return {"error": f"{type(e).__name__}: {e}"}


_OPT_RE = {
    "socType": re.compile(rb"soc_type=([A-Za-z0-9]+);arch=(\d+);"),
    "vtcmBytes": re.compile(rb";vtcm_size=(\d+);"),
    "fp16Relaxed": re.compile(rb";relaxed_precision_flag=(true|false);"),
    "optLevel": re.compile(rb"OpO=(\d+);"),
}


def embedded_options(path):
    """The per-graph HTP options string inside the binary: soc_type, arch, vtcm_size, O level."""
    found = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        m = _OPT_RE["socType"].search(mm)
        if m:
            found["socType"], found["arch"] = m.group(1).decode(), int(m.group(2))
            found["graphsWithOptions"] = len(_OPT_RE["socType"].findall(mm))
        for key in ("vtcmBytes", "fp16Relaxed", "optLevel"):
            m = _OPT_RE[key].search(mm)
            if m:
                v = m.group(1).decode()
                found[key] = (v == "true") if key == "fp16Relaxed" else int(v)
    return found


def binary_info(path, lib_dir):
    return {"bytes": os.path.getsize(path), "qnnSystem": qnn_system_info(path, lib_dir), "embedded": embedded_options(path)}


# ---------------------------------------------------------------------------------------------
def wrapper_info(path):
    import onnx  # the wrappers carry no external data (onnx refuses hard-linked external data files)
    m = onnx.load(path, load_external_data=False)
    ctx_nodes, other = [], []
    for n in m.graph.node:
        if n.op_type == "EPContext":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            ctx_nodes.append({k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()})
        else:
            other.append(n.op_type)
    meta = {p.key: p.value for p in m.metadata_props}
    return m, ctx_nodes, other, meta


def repoint(path, old, new):
    """Point a wrapper's EPContext nodes at a renamed binary."""
    import onnx
    m = onnx.load(path, load_external_data=False)
    for n in m.graph.node:
        if n.op_type == "EPContext":
            for a in n.attribute:
                if a.name == "ep_cache_context" and a.s.decode() == old:
                    a.s = new.encode()
    onnx.save(m, path)


def log_reasons(log_path):
    """Why the EP rejected nodes / what it reported as errors (deduplicated, in order)."""
    reasons, errors = [], []
    with open(log_path, errors="replace") as f:
        for line in f:
            s = line.strip()
            if s.startswith("REASON :"):
                r = s[len("REASON :"):].strip()
                if r not in reasons:
                    reasons.append(r)
            elif "[E:" in s:
                e = re.sub(r"^.*?\] ", "", s.replace("\x1b[m", "")).strip()
                if e not in errors:
                    errors.append(e)
    return reasons[:10], errors[:10]


# Verbose QNN logging is ~80 % per-op validator chatter (14 MB for a 4-layer hidden-64 shard); it is
# dropped unless --full-log. Kept: ORT's own lines (node support and REASONs, tensor types of static
# tensors, errors) and QNN's info/warning/error lines.
_NOISE = re.compile(r"QnnLogging\] +(<V>|Validating|validate OpConfig|check |key found|<I> Qnn\w+ (started|done)|Add Graph (tensor|Node) with)|^ name=\S+ id=\d+ version=\d+ type=QNN_TENSOR_TYPE_(NATIVE|APP)|^ type=QNN_PARAMTYPE")


_FILTER = """
import re, sys
noise = re.compile(sys.argv[2])
full = sys.argv[3] == "1"
with open(sys.argv[1], "w", errors="replace") as out:
    for line in sys.stdin.buffer:
        text = line.decode("utf-8", "replace")
        if full or not noise.search(text):
            out.write(text)
            out.flush()
"""


class LogSink:
    """A filter process (not a thread: compile may hold the GIL while QNN writes) that copies the
    lines written to its pipe into the log file."""

    def __init__(self, path, full):
        import subprocess
        self.proc = subprocess.Popen([sys.executable, "-c", _FILTER, path, _NOISE.pattern, "1" if full else "0"],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.write_fd = self.proc.stdin.fileno()
        self.closed = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        sys.stdout.flush()
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def stem(path):
    b = os.path.basename(path)
    return b[:-5] if b.endswith(".onnx") else b


def main():
    global _stderr_fd, _log
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="*")
    ap.add_argument("--info", help="read a context binary and print what it says about itself")
    ap.add_argument("--out")
    ap.add_argument("--name", help="context name: the binary is <out>/<name>.bin")
    ap.add_argument("--soc-model", type=int)
    ap.add_argument("--htp-arch", type=int, help="expected arch (QNN ignores it when soc_model is set; checked against the binary)")
    ap.add_argument("--vtcm-mb", type=int, default=8)
    ap.add_argument("--opt", type=int, default=3, help="htp_graph_finalization_optimization_mode 0-3")
    ap.add_argument("--fp16", dest="fp16", action="store_true", default=True)
    ap.add_argument("--no-fp16", dest="fp16", action="store_false")
    ap.add_argument("--separate", action="store_true", help="one context per graph, no weight sharing")
    ap.add_argument("--allow-cpu-fallback", action="store_true")
    ap.add_argument("--log-level", type=int, default=0, help="ORT severity for compile.log (0 = verbose)")
    ap.add_argument("--full-log", action="store_true", help="keep QNN's per-op validation chatter in compile.log")
    a = ap.parse_args()

    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except Exception as e:  # noqa: BLE001
        fail(f"onnxruntime-qnn is not importable in {sys.executable} ({type(e).__name__}: {e}); "
             "install the pinned pair: pip install onnxruntime==1.29.0 onnxruntime-qnn==2.7.0", 3)
    lib_dir = os.path.dirname(onnxruntime_qnn.get_library_path())
    for lib in ("libonnxruntime_providers_qnn.so", "libQnnHtp.so", "libQnnSystem.so"):
        if not os.path.exists(os.path.join(lib_dir, lib)):
            fail(f"{lib} is missing from {lib_dir}: this onnxruntime-qnn wheel has no x86_64 HTP compiler", 3)

    if a.info:
        print(json.dumps({"bin": os.path.abspath(a.info), **binary_info(a.info, lib_dir)}))
        return
    if not a.graphs or not a.out or not a.name or a.soc_model is None:
        fail("need --out, --name, --soc-model and at least one graph (see --help)", 2)
    for g in a.graphs:
        if not os.path.isfile(g):
            fail(f"graph not found: {g}", 2)
    if len({stem(g) for g in a.graphs}) != len(a.graphs):
        fail("graph file names must differ (each gets <name>_ctx.onnx)", 2)
    expect_soc = SOCS.get(a.soc_model)
    if a.htp_arch is not None and expect_soc and expect_soc[1] != a.htp_arch:
        fail(f"soc_model {a.soc_model} is {expect_soc[0]} (v{expect_soc[1]}), not v{a.htp_arch}: QNN would build for "
             f"v{expect_soc[1]} and ignore htp_arch", 2)

    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    wrappers = [os.path.join(out, stem(g) + "_ctx.onnx") for g in a.graphs]
    for p in wrappers + [os.path.join(out, stem(g) + "_ctx_qnn.bin") for g in a.graphs]:
        if os.path.exists(p):
            os.remove(p)
    log_path = os.path.join(out, "compile.log")

    # ORT (and QNN through it) logs to fd 2, and libQnnHtp prints to fd 1: both go through a filter
    # into compile.log; our own stdout (the report) and stderr (`fail`) are kept aside.
    sys.stdout.flush()
    sys.stderr.flush()
    _stderr_fd = os.dup(2)
    stdout_fd = os.dup(1)
    log = _log = LogSink(log_path, full=a.full_log)
    os.dup2(log.write_fd, 1)
    os.dup2(log.write_fd, 2)

    ort.set_default_logger_severity(min(a.log_level, 2))
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    if not devices:
        fail("the QNN plugin EP registered but offers no device", 3)
    provider = {
        "backend_path": onnxruntime_qnn.get_qnn_htp_path(),
        "soc_model": str(a.soc_model),
        "vtcm_mb": str(a.vtcm_mb),
        "htp_graph_finalization_optimization_mode": str(a.opt),
        "enable_htp_fp16_precision": "1" if a.fp16 else "0",
    }
    if a.htp_arch is not None:
        provider["htp_arch"] = str(a.htp_arch)

    t0 = time.time()
    per_graph = []
    for i, g in enumerate(a.graphs):
        so = ort.SessionOptions()
        so.log_severity_level = a.log_level
        so.add_provider_for_devices(devices, provider)
        so.add_session_config_entry("ep.context_embed_mode", "0")
        if not a.separate and len(a.graphs) > 1:
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            if i == len(a.graphs) - 1:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        t = time.time()
        print(f"[qnn_compile] graph {i + 1}/{len(a.graphs)}: {g}", file=sys.stderr, flush=True)
        try:
            ort.ModelCompiler(so, g).compile_to_file(wrappers[i])
        except Exception as e:  # noqa: BLE001
            reasons, errors = log_reasons(log_path)
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            fail(f"compiling {os.path.basename(g)} failed: {detail}" + (f" [log: {errors[-1]}]" if errors else "")
                 + f" (full log: {log_path})")
        per_graph.append(round(time.time() - t, 3))
    compile_seconds = round(time.time() - t0, 3)

    # What came out: one binary (or one per graph), every wrapper all-EPContext and pointing at it.
    graphs = []
    for g, w in zip(a.graphs, wrappers):
        if not os.path.exists(w):
            fail(f"no wrapper written for {g} (full log: {log_path})")
        _, ctx_nodes, other, meta = wrapper_info(w)
        graphs.append({"graph": os.path.abspath(g), "wrapper": w, "ctx": ctx_nodes, "cpu": other, "meta": meta})
    reasons, errors = log_reasons(log_path)
    for gi in graphs:
        if not gi["ctx"]:
            fail(f"{os.path.basename(gi['graph'])}: nothing was compiled for the HTP (no EPContext node; the graph stayed "
                 f"on CPU): {'; '.join(errors or reasons) or 'see log'} (full log: {log_path})")
        if gi["cpu"] and not a.allow_cpu_fallback:
            counts = {}
            for op in gi["cpu"]:
                counts[op] = counts.get(op, 0) + 1
            ops = ", ".join(f"{k} x{v}" for k, v in counts.items())
            fail(f"{os.path.basename(gi['graph'])}: {len(gi['cpu'])} nodes stayed on CPU ({ops}): "
                 f"{'; '.join(reasons) or 'see log'} (full log: {log_path})")

    bins = []
    if a.separate or len(a.graphs) == 1:
        for gi in graphs:
            old = gi["ctx"][0]["ep_cache_context"]
            new = f"{a.name}.bin" if len(a.graphs) == 1 else f"{stem(gi['graph'])}.bin"
            os.replace(os.path.join(out, old), os.path.join(out, new))
            repoint(gi["wrapper"], old, new)
            bins.append(new)
    else:
        olds = {n["ep_cache_context"] for gi in graphs for n in gi["ctx"]}
        if len(olds) != 1:
            fail(f"weight sharing gave {len(olds)} binaries ({sorted(olds)}), expected one (full log: {log_path})")
        old = olds.pop()
        if not os.path.exists(os.path.join(out, old)):
            fail(f"the wrappers point at {old}, which was not written (full log: {log_path})")
        new = f"{a.name}.bin"
        os.replace(os.path.join(out, old), os.path.join(out, new))
        for gi in graphs:
            repoint(gi["wrapper"], old, new)
        bins.append(new)

    infos = {b: binary_info(os.path.join(out, b), lib_dir) for b in bins}
    target = {}
    for b, info in infos.items():
        qs, emb = info["qnnSystem"], info["embedded"]
        soc = qs.get("socModel")
        arch = emb.get("arch") or (qs.get("device") or {}).get("arch")
        if soc is not None and soc != a.soc_model:
            fail(f"{b} targets soc_model {soc}, not the requested {a.soc_model}")
        want_arch = a.htp_arch or (expect_soc[1] if expect_soc else None)
        if arch is not None and want_arch is not None and arch != want_arch:
            fail(f"{b} targets HTP v{arch}, not the requested v{want_arch}")
        target = {"socModel": soc, "socType": emb.get("socType"), "arch": arch, "dspArch": f"v{arch}" if arch else None,
                  "vtcmBytes": emb.get("vtcmBytes"), "fp16Relaxed": emb.get("fp16Relaxed"), "optLevel": emb.get("optLevel")}

    first_ctx = graphs[0]["ctx"][0]
    sdk = first_ctx.get("ep_sdk_version", "")
    m = re.match(r"v?(\d+\.\d+\.\d+)", sdk)
    main_bin = bins[0]
    report = {
        "bin": os.path.join(out, main_bin),
        "bytes": infos[main_bin]["bytes"],
        "bins": [{"path": os.path.join(out, b), "bytes": infos[b]["bytes"], "graphs": infos[b]["qnnSystem"].get("graphs")} for b in bins],
        "shared": not a.separate and len(a.graphs) > 1,
        "wrappers": [{"graph": gi["graph"], "path": gi["wrapper"], "bin": wrapper_info(gi["wrapper"])[1][0]["ep_cache_context"],
                      "qnnGraph": gi["ctx"][0].get("partition_name"), "cpuNodes": gi["cpu"]} for gi in graphs],
        "epSdkVersion": sdk,
        "qairtVersion": m.group(1) if m else None,
        "onnxruntime": ort.__version__,
        "onnxruntimeQnn": getattr(onnxruntime_qnn, "__version__", None),
        "qnnVersionOfWheel": getattr(getattr(onnxruntime_qnn, "build_and_package_info", None), "qnn_version", None),
        "compatibility": graphs[0]["meta"].get("ep_compatibility_info.QNNExecutionProvider"),
        "target": target,
        "binaryInfo": infos[main_bin]["qnnSystem"],
        "requested": {"socModel": a.soc_model, "htpArch": a.htp_arch, "vtcmMb": a.vtcm_mb, "opt": a.opt, "fp16": a.fp16},
        "compileSeconds": compile_seconds,
        "graphSeconds": per_graph,
        "peakRssBytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "log": log_path,
        "logReasons": reasons,
    }
    log.close()
    os.write(stdout_fd, (json.dumps(report) + "\n").encode())


if __name__ == "__main__":
    main()
