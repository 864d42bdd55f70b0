#!/usr/bin/env python3
"""Experiments around the QNN HTP toolchain (onnxruntime-qnn), kept so their evidence can be re-run.

    python oracles/qnn_probe.py forms --out DIR [--soc-models 69,87] [--n 2048] [--only REGEX]
        Compiles one N x N linear layer in each candidate weight form and reports, per form and
        SoC: the context binary size, the nodes the QNN EP left on CPU (and why), and the QNN data
        type of the weight tensor from the compile log. fp16 weights cost 2 bytes a parameter;
        int8 weights 1.

    python oracles/qnn_probe.py padded --out DIR [--soc-models 69,87] [--n 64] [--k 120,150] [--simulate]
        A linear [n, k] whose in-features k no MatMulNBits block divides, in the forms that could
        take it (zero-padded weight with the input padded by Pad or Concat, MatMulNBits on the ragged
        k, fp16 Gemm), bits 8 and 4: per form and SoC what --forms reports, its ORT CPU error and,
        with --simulate, its x86 HTP simulator cosine against x @ dequant(W)^T unpadded (quant/pad.ts).

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


def compile_form(ort, onnxruntime_qnn, devices, src, d, soc, extra=None):
    """Compiles one model offline for one soc_model; the row of what came out."""
    import onnx
    os.makedirs(d, exist_ok=True)
    so = ort.SessionOptions()
    so.log_severity_level = 0
    so.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": soc,
                                          "htp_graph_finalization_optimization_mode": "3",
                                          "enable_htp_fp16_precision": "1", **(extra or {})})
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
    return {"socModel": int(soc), "binBytes": size, "cpuNodes": cpu, "reasons": reasons, "weightQnnType": wtypes,
            "error": err, "seconds": round(secs, 2)}


def forms(a):
    import onnx
    ort, onnxruntime_qnn, devices = qnn()
    os.makedirs(a.out, exist_ok=True)
    for i, (name, make) in enumerate(build_forms(a.n).items()):
        if a.only and not re.search(a.only, name):
            continue
        src = os.path.join(a.out, f"form{i}.onnx")
        onnx.save(make(), src)
        for soc in a.soc_models.split(","):
            extra = {"offload_graph_io_quantization": "0"} if "QDQ" in name else {}
            row = compile_form(ort, onnxruntime_qnn, devices, src, os.path.join(a.out, f"form{i}.{soc}"), soc, extra)
            row = {"form": name, **row, "bytesPerParam": round(row["binBytes"] / a.n ** 2, 3) if row["binBytes"] else None}
            print(json.dumps(row), flush=True)


# --------------------------------------------------------------------------------------------- padded
def build_padded_forms(out, k, tokens, bits):
    """A linear [out, k] whose in-features k no MatMulNBits block divides, in the forms that could
    take it: the weight zero-padded to k' (the block's next multiple) with the input padded by a
    Pad(constant 0) or a Concat with zeros, MatMulNBits on the ragged k itself (its last block
    short), and fp32 Gemm (fp16 on the HTP). Returns forms, x, and the unpadded dequantized weight."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(1)
    W = (rng.standard_normal((out, k)) * 0.1).astype(np.float32)
    x = rng.standard_normal((1, tokens, k)).astype(np.float32)
    # W4: forge's block 32; W8: padded to a multiple of 16, then forge's block (w8BlockSize: the
    # largest power of two up to 256 dividing k')
    kp = -(-k // (32 if bits == 4 else 16)) * (32 if bits == 4 else 16)
    bs = 32 if bits == 4 else next(b for b in (256, 128, 64, 32, 16) if kp % b == 0)
    Wp = np.zeros((out, kp), np.float32)
    Wp[:, :k] = W
    blocks = Wp.reshape(out, kp // bs, bs)
    qmax = 2 ** (bits - 1) - 1
    s = np.abs(blocks).max(axis=2) / qmax
    s[s == 0] = 1
    s = s.astype(np.float32)
    q = np.clip(np.round(blocks / s[:, :, None]), -qmax, qmax).astype(np.int32)
    deq = (q * s[:, :, None]).reshape(out, kp)[:, :k].astype(np.float32)
    codes = (q + 2 ** (bits - 1)).astype(np.uint8)
    if bits == 4:
        codes = (codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)).astype(np.uint8)

    def model(nodes, inits):
        g = h.make_graph(nodes, "linear", [h.make_tensor_value_info("x", T.FLOAT, [1, tokens, k])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, tokens, out])], inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
        m.ir_version = 8
        return m

    def nbits(inp, K, B, S, block):
        return h.make_node("MatMulNBits", [inp, "B", "S"], ["y"], domain="com.microsoft", K=K, N=out, bits=bits, block_size=block)

    inits = [nh.from_array(codes, "B"), nh.from_array(s.reshape(-1), "S")]
    pads = nh.from_array(np.array([0, 0, 0, 0, 0, kp - k], np.int64), "pads")
    zeros = nh.from_array(np.zeros((1, tokens, kp - k), np.float32), "zeros")
    forms = {
        f"bits={bits} K={k} padded {kp}: Pad(constant 0) -> MatMulNBits block {bs}": lambda: model(
            [h.make_node("Pad", ["x", "pads"], ["xp"], mode="constant"), nbits("xp", kp, "B", "S", bs)], inits + [pads]),
        f"bits={bits} K={k} padded {kp}: Concat(x, zeros) -> MatMulNBits block {bs}": lambda: model(
            [h.make_node("Concat", ["x", "zeros"], ["xp"], axis=2), nbits("xp", kp, "B", "S", bs)], inits + [zeros]),
        f"bits={bits} K={k} ragged: MatMulNBits K={k} block {bs} (last block short)": lambda: model(
            [nbits("x", k, "B", "S", bs)], inits),
        f"K={k} fp32 Gemm (fp16 on HTP)": lambda: model(
            [h.make_node("MatMul", ["x", "Wt"], ["y"])], [nh.from_array(np.ascontiguousarray(W.T), "Wt")]),
    }
    return forms, x, deq, W


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def padded(a):
    """Per form and SoC: compiled size and CPU nodes; per form on the CPU (ORT) and, with
    --simulate, on the x86 HTP simulator: how far its output is from x @ dequant(W)^T unpadded."""
    import onnx
    ort, onnxruntime_qnn, devices = qnn()
    os.makedirs(a.out, exist_ok=True)
    for k in [int(v) for v in a.k.split(",")]:
        for bits in (8, 4):
            made, x, deq, W = build_padded_forms(a.n, k, a.tokens, bits)
            want = (x.astype(np.float64) @ deq.T.astype(np.float64))
            for i, (name, make) in enumerate(made.items()):
                if a.only and not re.search(a.only, name):
                    continue
                tag = f"k{k}.b{bits}.f{i}"
                src = os.path.join(a.out, f"{tag}.onnx")
                onnx.save(make(), src)
                ref = want if "Gemm" not in name else x.astype(np.float64) @ W.T.astype(np.float64)
                row = {"form": name}
                try:
                    cpu = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
                    row["cpuMaxAbsErr"] = float(np.abs(cpu - ref).max())
                except Exception as e:  # noqa: BLE001
                    row["cpuError"] = str(e).strip().splitlines()[0]
                for soc in a.soc_models.split(","):
                    d = os.path.join(a.out, f"{tag}.{soc}")
                    c = compile_form(ort, onnxruntime_qnn, devices, src, d, soc)
                    if a.simulate and c["binBytes"] and c["cpuNodes"] == []:
                        so = ort.SessionOptions()
                        so.log_severity_level = 3
                        so.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": soc,
                                                              "enable_htp_fp16_precision": "1"})
                        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
                        try:
                            y = ort.InferenceSession(os.path.join(d, "m_ctx.onnx"), so).run(["y"], {"x": x})[0]
                            c["simCosine"] = round(cosine(y, ref), 8)
                            c["simMaxAbsErr"] = float(np.abs(y - ref).max())
                        except Exception as e:  # noqa: BLE001
                            c["simError"] = str(e).strip().splitlines()[0]
                    print(json.dumps({**row, **c}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("forms")
    s.add_argument("--out", required=True)
    s.add_argument("--soc-models", default="69,87")
    s.add_argument("--n", type=int, default=2048)
    s.add_argument("--only", help="a regular expression: only the forms whose name it matches")
    p = sub.add_parser("padded")
    p.add_argument("--out", required=True)
    p.add_argument("--soc-models", default="69,87")
    p.add_argument("--n", type=int, default=64, help="out-features")
    p.add_argument("--k", default="120,150", help="in-features, comma-separated")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--simulate", action="store_true", help="also run each fully compiled form on the x86 HTP simulator")
    p.add_argument("--only", help="a regular expression: only the forms whose name it matches")
    a = ap.parse_args()
    try:
        {"forms": forms, "padded": padded}[a.cmd](a)
    except SystemExit:
        raise
    except Exception as e:  # noqa: BLE001
        fail(f"{a.cmd}: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
