#!/usr/bin/env python3
"""Experiments around the QNN HTP toolchain (onnxruntime-qnn), kept so their evidence can be re-run.

    python oracles/qnn_probe.py simulate --ctx X_ctx.onnx --src X.onnx --soc-model 69 [--trace DIR]
        Runs an EPContext wrapper on this machine's HTP (the x86_64 simulator in libQnnHtp.so) and
        the source graph on the CPU EP with the same inputs; prints cosines per output. Inputs come
        from an oracle trace (teacher-forced, as src/families/kv-decoder.ts builds them) when
        --trace is given, else zeros with a valid mask. The QNN session runs in a child process, so a
        crash of the simulator is reported ({"ok": false, "error": "... signal 11 ..."}) instead of
        killing the probe.

    python oracles/qnn_probe.py forms --out DIR [--soc-models 69,87] [--n 2048]
        Compiles one N x N linear layer in each candidate weight form and reports, per form and
        SoC: the context binary size, the nodes the QNN EP left on CPU (and why), and the QNN data
        type of the weight tensor from the compile log. fp16 weights cost 2 bytes a parameter;
        int8 weights 1.

    python oracles/qnn_probe.py nbits --out DIR GRAPH.onnx [GRAPH.onnx ...]
        Rewrites forge's W8 form (DequantizeLinear(int8 [N,K], per-row scale, axis=0) -> Gemm(transB=1))
        into com.microsoft MatMulNBits(bits=8) on a rank-3 activation, the form the HTP takes as
        weight-only int8 (same numbers: the per-row scale repeated per block, q + 128 as uint8; block
        size the largest power of two <= 256 dividing K, since ORT's CPU MatMulNBits takes 16..256). The
        graphs of one context share DIR/<first graph>.nbits.data.

Prints JSON. Exit 1 with one "qnn_probe:" line on stderr on failure.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MASKED = -65504.0


def fail(msg, code=1):
    print("qnn_probe: " + " ".join(str(msg).split()), file=sys.stderr)
    sys.exit(code)


def qnn():
    import onnxruntime as ort
    import onnxruntime_qnn
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    return ort, onnxruntime_qnn, devices


# ---------------------------------------------------------------------------------------------- simulate
def kv_feeds(sess, trace_dir, cases):
    """Teacher-forced inputs for a KV decoder shard from an oracle trace (see kvDecoderCases)."""
    from safetensors.numpy import load_file
    tr = load_file(os.path.join(trace_dir, "trace.safetensors"))
    meta = json.load(open(os.path.join(trace_dir, "trace.json")))
    C = meta["max_context"]
    ins = {i.name: i for i in sess.get_inputs()}
    n = ins["hidden_in"].shape[1]
    layers = sorted({int(k.split(".")[1]) for k in ins if k.startswith("past_k.")})
    first = layers[0]
    out = []
    for p, prompt in enumerate(meta["prompts"]):
        steps = prompt["steps"]
        plen = len(prompt["prompt_tokens"])
        calls = [(t, 1) for t in range(steps)] if n == 1 else [(s, min(n, plen - s)) for s in range(0, plen, n)]
        for start, valid in calls:
            f = {}
            hid = np.zeros((1, n, ins["hidden_in"].shape[2]), np.float32)
            for r in range(valid):
                hid[0, r] = tr[f"p{p}/s{start + r}/h.{first}"]
            f["hidden_in"] = hid
            f["position"] = np.array([min(start + r, C - 1) for r in range(n)], np.int32)
            m = np.full((1, 1, n, C + n), MASKED, np.float32)
            for r in range(n):
                m[0, 0, r, :start] = 0
                m[0, 0, r, C:C + min(r + 1, valid)] = 0
            f["attn_mask"] = m
            for i in layers:
                for w in "kv":
                    shape = ins[f"past_{w}.{i}"].shape
                    c = np.zeros(shape, np.float32)
                    for t in range(start):
                        c[0, :, t, :] = tr[f"p{p}/s{t}/{w}.{i}"]
                    f[f"past_{w}.{i}"] = c
            out.append(({"prompt": p, "start": start, "valid": valid}, f))
            if len(out) >= cases:
                return out
    return out


def zero_feeds(sess):
    f = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        if i.type == "tensor(int32)":
            f[i.name] = np.zeros(shape, np.int32)
        elif i.type == "tensor(int64)":
            f[i.name] = np.zeros(shape, np.int64)
        elif i.name == "attn_mask":  # attend to the new tokens only
            m = np.full(shape, MASKED, np.float32)
            n, width = shape[-2], shape[-1]
            for r in range(n):
                m[..., r, width - n:width - n + r + 1] = 0
            f[i.name] = m
        else:
            f[i.name] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return [({"inputs": "random/zeros"}, f)]


def cos(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    d = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / d) if d > 0 else (1.0 if not a.any() and not b.any() else 0.0)


def simulate_child(a):
    ort, onnxruntime_qnn, devices = qnn()
    ref = ort.InferenceSession(a.src, providers=["CPUExecutionProvider"])
    cases = kv_feeds(ref, a.trace, a.cases) if a.trace else zero_feeds(ref)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": str(a.soc_model),
                                          "enable_htp_fp16_precision": "1"})
    t = time.time()
    try:
        sess = ort.InferenceSession(a.ctx, so)
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"ok": False, "stage": "load", "error": str(e).strip().splitlines()[0]}))
        return
    load = time.time() - t
    names = [o.name for o in sess.get_outputs()]
    results = []
    for info, feeds in cases:
        t = time.time()
        try:
            got = sess.run(None, feeds)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"ok": False, "stage": "run", "error": str(e).strip().splitlines()[0]}))
            return
        secs = time.time() - t
        want = ref.run(names, feeds)
        valid = info.get("valid")
        per = {}
        for name, g, w in zip(names, got, want):
            if valid is not None and name == "hidden_out":
                g, w = g[:, :valid], w[:, :valid]
            elif valid is not None and name.startswith("new_"):
                g, w = g[:, :, :valid], w[:, :, :valid]
            per[name] = round(cos(g, w), 6)
        results.append({**info, "seconds": round(secs, 3), "minCos": min(per.values()), "cos": per})
    print(json.dumps({"ok": True, "loadSeconds": round(load, 3), "cases": results,
                      "minCos": min(r["minCos"] for r in results)}))


def simulate(a):
    cmd = [sys.executable, os.path.abspath(__file__), "simulate-child", "--ctx", a.ctx, "--src", a.src,
           "--soc-model", str(a.soc_model), "--cases", str(a.cases)] + (["--trace", a.trace] if a.trace else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    line = next((s for s in reversed(r.stdout.splitlines()) if s.startswith("{")), None)
    if r.returncode != 0 or line is None:
        how = f"signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
        tail = " | ".join(s for s in r.stderr.strip().splitlines()[-3:] if "LIBNATIVE" not in s)
        print(json.dumps({"ok": False, "stage": "load-or-run", "error": f"the QNN session process died ({how})"
                          + (f": {tail}" if tail else "")}))
        return
    print(line)


# ---------------------------------------------------------------------------------------------- forms
def build_forms(n):
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((n, n)) * 0.02).astype(np.float32)  # [out, in]
    scale = (np.abs(W).max(axis=1) / 127).astype(np.float32)
    Wq = np.clip(np.round(W / scale[:, None]), -127, 127).astype(np.int8)

    def model(nodes, inits, rank3=False, ms=False, opset=17):
        shape = [1, 1, n] if rank3 else [1, n]
        g = h.make_graph(nodes, "linear", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                         [h.make_tensor_value_info("y", T.FLOAT, shape)], inits)
        ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
        m = h.make_model(g, opset_imports=ops)
        m.ir_version = 10 if opset >= 21 else 8
        return m

    def act_qdq(src, dst, tag):  # uint16 activation Q/DQ (com.microsoft), scale for |x| < 4
        s = nh.from_array(np.array(4 / 32768, np.float32), f"{tag}.scale")
        z = h.make_tensor(f"{tag}.zp", T.UINT16, [], [32768])
        return [h.make_node("QuantizeLinear", [src, s.name, z.name], [f"{tag}.q"], domain="com.microsoft"),
                h.make_node("DequantizeLinear", [f"{tag}.q", s.name, z.name], [dst], domain="com.microsoft")], [s, z]

    def nbits(bits, bs):
        blocks = W.reshape(n, n // bs, bs)
        s = np.abs(blocks).max(axis=2) / (2 ** (bits - 1) - 1)
        q = np.clip(np.round(blocks / s[:, :, None]), -(2 ** (bits - 1)) + 1, 2 ** (bits - 1) - 1).astype(np.int32) + 2 ** (bits - 1)
        q = q.astype(np.uint8)
        if bits == 4:
            q = (q[:, :, 0::2] | (q[:, :, 1::2] << 4)).astype(np.uint8)
        node = h.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", K=n, N=n, bits=bits, block_size=bs)
        return model([node], [nh.from_array(q, "B"), nh.from_array(s.astype(np.float32).reshape(-1), "S")], rank3=True, ms=True)

    wq, ws = nh.from_array(Wq, "Wq"), nh.from_array(scale, "Ws")
    wqt = nh.from_array(np.ascontiguousarray(Wq.T), "Wq")
    zp = nh.from_array(np.zeros(n, np.int8), "Wz")
    dq0 = h.make_node("DequantizeLinear", ["Wq", "Ws"], ["Wd"], axis=0)
    forms = {
        "fp32 Gemm (fp16 on HTP)": lambda: model([h.make_node("Gemm", ["x", "W"], ["y"], transB=1)], [nh.from_array(W, "W")]),
        "int8 DQ(axis=0) -> Gemm [forge W8 today]": lambda: model([dq0, h.make_node("Gemm", ["x", "Wd"], ["y"], transB=1)], [wq, ws]),
        "int8 DQ(axis=0, zp=0) -> Gemm": lambda: model([h.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=0),
                                                         h.make_node("Gemm", ["x", "Wd"], ["y"], transB=1)], [wq, ws, zp]),
        "int8 DQ(per-tensor) -> Gemm": lambda: model([h.make_node("DequantizeLinear", ["Wq", "Ws1"], ["Wd"]),
                                                       h.make_node("Gemm", ["x", "Wd"], ["y"], transB=1)],
                                                      [wq, nh.from_array(np.array(scale.max(), np.float32), "Ws1")]),
        "int8 [in,out] DQ(axis=1) -> MatMul": lambda: model([h.make_node("DequantizeLinear", ["Wq", "Ws"], ["Wd"], axis=1),
                                                              h.make_node("MatMul", ["x", "Wd"], ["y"])], [wqt, ws]),
        "DynamicQuantizeLinear -> MatMulInteger": lambda: model([
            h.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
            h.make_node("MatMulInteger", ["xq", "Wq", "xz"], ["acc"]), h.make_node("Cast", ["acc"], ["accf"], to=T.FLOAT),
            h.make_node("Mul", ["xs", "Ws"], ["cs"]), h.make_node("Mul", ["accf", "cs"], ["y"])], [wqt, ws]),
    }

    def qdq16(op):
        n1, i1 = act_qdq("x", "xd", "in")
        n2, i2 = act_qdq("yf", "y", "out")
        if op == "Gemm":
            core = [h.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=0), h.make_node("Gemm", ["xd", "Wd"], ["yf"], transB=1)]
            w = wq
        else:
            core = [h.make_node("DequantizeLinear", ["Wq", "Ws", "Wz"], ["Wd"], axis=1), h.make_node("MatMul", ["xd", "Wd"], ["yf"])]
            w = wqt
        return model(n1 + core + n2, i1 + i2 + [w, ws, zp], ms=True)
    forms["uint16 act QDQ + int8 DQ(axis=0) -> Gemm (W8A16)"] = lambda: qdq16("Gemm")
    forms["uint16 act QDQ + int8 DQ(axis=1) -> MatMul (W8A16)"] = lambda: qdq16("MatMul")
    for bs in (32, 128, n):
        forms[f"MatMulNBits bits=8 block={bs} (fp16 act)"] = (lambda b: lambda: nbits(8, b))(bs)
    forms["MatMulNBits bits=4 block=32 (fp16 act)"] = lambda: nbits(4, 32)
    return forms


def forms(a):
    import onnx
    ort, onnxruntime_qnn, devices = qnn()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for i, (name, make) in enumerate(build_forms(a.n).items()):
        src = os.path.join(a.out, f"form{i}.onnx")
        onnx.save(make(), src)
        for soc in a.soc_models.split(","):
            d = os.path.join(a.out, f"form{i}.{soc}")
            os.makedirs(d, exist_ok=True)
            extra = {"offload_graph_io_quantization": "0"} if "QDQ" in name else {}
            so = ort.SessionOptions()
            so.log_severity_level = 0
            so.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": soc,
                                                  "htp_graph_finalization_optimization_mode": "3",
                                                  "enable_htp_fp16_precision": "1", **extra})
            so.add_session_config_entry("ep.context_embed_mode", "0")
            log = os.path.join(d, "compile.log")
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            saved = os.dup(2)
            os.dup2(fd, 2)
            err = None
            t = time.time()
            try:
                ort.ModelCompiler(so, src).compile_to_file(os.path.join(d, "m_ctx.onnx"))
            except Exception as e:  # noqa: BLE001
                err = str(e).strip().splitlines()[0]
            finally:
                os.dup2(saved, 2)
                os.close(fd)
                os.close(saved)
            secs = time.time() - t
            binp = os.path.join(d, "m_ctx_qnn.bin")
            cpu = None
            if os.path.exists(os.path.join(d, "m_ctx.onnx")):
                cm = onnx.load(os.path.join(d, "m_ctx.onnx"), load_external_data=False)
                cpu = [nd.op_type for nd in cm.graph.node if nd.op_type != "EPContext"]
            text = open(log, errors="replace").read()
            reasons = sorted(set(re.findall(r"REASON : ([^\n]+)", text)))
            wtypes = sorted(set(re.findall(r"name=(?:Wq|W|B)\s+id=\d+ version=\d+ type=QNN_TENSOR_TYPE_STATIC dataFormat=\d+ dataType=(\w+)", text)))
            size = os.path.getsize(binp) if os.path.exists(binp) else None
            row = {"form": name, "socModel": int(soc), "binBytes": size, "bytesPerParam": round(size / a.n ** 2, 3) if size else None,
                   "cpuNodes": cpu, "reasons": reasons, "weightQnnType": wtypes, "error": err, "seconds": round(secs, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)


# ---------------------------------------------------------------------------------------------- nbits
def to_nbits(a):
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper as nh
    os.makedirs(a.out, exist_ok=True)
    data_name = os.path.basename(a.graphs[0])[:-5] + ".nbits.data"
    data_path = os.path.join(a.out, data_name)
    if os.path.exists(data_path):
        os.remove(data_path)
    written = {}  # initializer name -> (offset, length) in the shared data file
    outputs = []
    for src in a.graphs:
        m = onnx.load(src, load_external_data=False)
        base = os.path.dirname(os.path.abspath(src))
        g = m.graph
        inits = {i.name: i for i in g.initializer}
        prod = {o: n for n in g.node for o in n.output}

        def arr(name):
            t = onnx.TensorProto()
            t.CopyFrom(inits[name])
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                with open(os.path.join(base, info["location"]), "rb") as f:  # plain read: onnx refuses hard links
                    f.seek(int(info.get("offset", 0)))
                    raw = f.read(int(info["length"]))
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
                t.raw_data = raw
            return nh.to_array(t)

        def external(name, array):
            if name not in written:
                with open(data_path, "ab") as f:
                    off = f.tell()
                    f.write(array.tobytes())
                written[name] = (off, array.nbytes)
            t = nh.from_array(np.zeros((0,), array.dtype), name)
            t.ClearField("raw_data")
            t.dims[:] = list(array.shape)
            t.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", data_name), ("offset", str(written[name][0])), ("length", str(written[name][1]))):
                e = t.external_data.add()
                e.key, e.value = k, v
            return t

        axes = nh.from_array(np.array([0], np.int64), "nbits.axes0")
        nodes, new_inits, dropped, converted = [], [axes], set(), 0
        for n in g.node:
            dq = prod.get(n.input[1]) if n.op_type == "Gemm" and len(n.input) > 1 else None
            attrs = {x.name: h.get_attribute_value(x) for x in n.attribute} if n.op_type == "Gemm" else {}
            if dq is not None and dq.op_type == "DequantizeLinear" and attrs.get("transB") == 1 and len(n.input) == 2:
                w, s = arr(dq.input[0]), arr(dq.input[1])
                N, K = w.shape
                bs = 256  # the largest power of two <= 256 dividing K: ORT's CPU kernel takes 16..256 only
                while K % bs:
                    bs //= 2
                if bs < 16:
                    fail(f"{dq.input[0]}: K={K} has no power-of-two block size >= 16")
                wname = dq.input[0]
                new_inits.append(external(wname + ".nbits", (w.astype(np.int16) + 128).astype(np.uint8).reshape(N, K // bs, bs)))
                new_inits.append(external(wname + ".nbits_scale", np.repeat(s.astype(np.float32), K // bs)))
                dropped.add(dq.name)
                x3, y3 = n.output[0] + ".x3", n.output[0] + ".y3"
                nodes += [h.make_node("Unsqueeze", [n.input[0], axes.name], [x3]),
                          h.make_node("MatMulNBits", [x3, wname + ".nbits", wname + ".nbits_scale"], [y3], domain="com.microsoft",
                                      K=K, N=N, bits=8, block_size=bs),
                          h.make_node("Squeeze", [y3, axes.name], [n.output[0]])]
                converted += 1
            else:
                nodes.append(n)
        nodes = [n for n in nodes if not (n.op_type == "DequantizeLinear" and n.name in dropped)]
        used = {i for n in nodes for i in n.input}
        keep = []
        for i in list(g.initializer) + new_inits:
            if i.name in used and i.name not in {k.name for k in keep}:
                if i.data_location == onnx.TensorProto.EXTERNAL and i.name in inits:
                    i = external(i.name, arr(i.name))  # everything into the one new data file
                keep.append(i)
        del g.node[:]
        g.node.extend(nodes)
        del g.initializer[:]
        g.initializer.extend(keep)
        if not any(o.domain == "com.microsoft" for o in m.opset_import):
            m.opset_import.append(h.make_opsetid("com.microsoft", 1))
        dst = os.path.join(a.out, os.path.basename(src))
        onnx.save(m, dst)
        outputs.append({"graph": dst, "converted": converted})
    print(json.dumps({"graphs": outputs, "data": data_path}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("simulate", "simulate-child"):
        s = sub.add_parser(name)
        s.add_argument("--ctx", required=True)
        s.add_argument("--src", required=True)
        s.add_argument("--soc-model", type=int, required=True)
        s.add_argument("--trace")
        s.add_argument("--cases", type=int, default=3)
    s = sub.add_parser("forms")
    s.add_argument("--out", required=True)
    s.add_argument("--soc-models", default="69,87")
    s.add_argument("--n", type=int, default=2048)
    s = sub.add_parser("nbits")
    s.add_argument("--out", required=True)
    s.add_argument("graphs", nargs="+")
    a = ap.parse_args()
    try:
        {"simulate": simulate, "simulate-child": simulate_child, "forms": forms, "nbits": to_nbits}[a.cmd](a)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        fail(f"{a.cmd}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
