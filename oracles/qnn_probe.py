#!/usr/bin/env python3
"""Experiments around the QNN HTP toolchain (onnxruntime-qnn), kept so their evidence can be re-run.

    python oracles/qnn_probe.py forms --out DIR [--soc-models 69,87] [--n 2048] [--only REGEX]
        Compiles one N x N linear layer in each candidate weight form and reports, per form and
        SoC: the context binary size, the nodes the QNN EP left on CPU (and why), and the QNN data
        type of the weight tensor from the compile log. fp16 weights cost 2 bytes a parameter;
        int8 weights 1.

Prints JSON. Exit 1 with one "qnn_probe:" line on stderr on failure.
"""
import argparse
import json
import os
import re
import sys
import time

import numpy as np


def fail(msg, code=1):
    print("qnn_probe: " + " ".join(str(msg).split()), file=sys.stderr)
    sys.exit(code)


def qnn():
    import onnxruntime as ort
    import onnxruntime_qnn
    ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    return ort, onnxruntime_qnn, devices


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
    for bs in (32, 64, 128):
        forms[f"MatMulNBits bits=4 block={bs} (fp16 act)"] = (lambda b: lambda: nbits(4, b))(bs)
    return forms


def forms(a):
    import onnx
    ort, onnxruntime_qnn, devices = qnn()
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for i, (name, make) in enumerate(build_forms(a.n).items()):
        if a.only and not re.search(a.only, name):
            continue
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("forms")
    s.add_argument("--out", required=True)
    s.add_argument("--soc-models", default="69,87")
    s.add_argument("--n", type=int, default=2048)
    s.add_argument("--only", help="a regular expression: only the forms whose name it matches")
    a = ap.parse_args()
    try:
        {"forms": forms}[a.cmd](a)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        fail(f"{a.cmd}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
