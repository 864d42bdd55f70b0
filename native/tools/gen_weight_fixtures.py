"""Writes native/test/fixtures/weights/*.onnx: tiny graphs whose weights live in external data files
that test_shared_weights.cpp writes at test time (so no weight bytes are committed).

  python native/tools/gen_weight_fixtures.py   (needs the `onnx` package, e.g. forge's venv)

Shapes follow forge's linear layers (Gemm(transB=1) on a [out, in] weight):
  decode.onnx / prefill.onnx  x[1|8, K] -> Gemm(x, W, B)             W f32 [N,K] @0, B f32 [N] @K*N*4 in weights.data
  cast_bf16.onnx              x[1, K]   -> Gemm(x, Cast(Wb -> f32))  Wb bf16 [N,K] @0 in weights_bf16.data
                                         (the fp32 reference graphs' form over checkpoint bf16 bytes)
  cast_f16.onnx               the same over Wh f16 in weights_f16.data (the W8 bundle's fp16 lm-head)
  misaligned.onnx             decode.onnx with W at offset 2 (not a multiple of 4)
"""
import os

import onnx
from onnx import TensorProto, helper

K, N = 2048, 4096
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'test', 'fixtures', 'weights')


def external(name, dtype, dims, location, offset, length):
    t = TensorProto(name=name, data_type=dtype, dims=dims, data_location=TensorProto.EXTERNAL)
    for k, v in (('location', location), ('offset', str(offset)), ('length', str(length))):
        t.external_data.add(key=k, value=v)
    return t


def save(fname, rows, nodes, inits):
    graph = helper.make_graph(nodes, fname.removesuffix('.onnx'),
                              [helper.make_tensor_value_info('x', TensorProto.FLOAT, [rows, K])],
                              [helper.make_tensor_value_info('y', TensorProto.FLOAT, [rows, N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 21)], producer_name='gen_weight_fixtures')
    model.ir_version = 10
    onnx.save(model, os.path.join(HERE, fname))


def gemm_graph(fname, rows, w_offset):
    save(fname, rows, [helper.make_node('Gemm', ['x', 'W', 'B'], ['y'], transB=1)],
         [external('W', TensorProto.FLOAT, [N, K], 'weights.data', w_offset, N * K * 4),
          external('B', TensorProto.FLOAT, [N], 'weights.data', N * K * 4, N * 4)])


os.makedirs(HERE, exist_ok=True)
gemm_graph('decode.onnx', 1, 0)
gemm_graph('prefill.onnx', 8, 0)
gemm_graph('misaligned.onnx', 1, 2)
for fname, name, dtype, data in (('cast_bf16.onnx', 'Wb', TensorProto.BFLOAT16, 'weights_bf16.data'),
                                  ('cast_f16.onnx', 'Wh', TensorProto.FLOAT16, 'weights_f16.data')):
    save(fname, 1, [helper.make_node('Cast', [name], ['W'], to=TensorProto.FLOAT),
                    helper.make_node('Gemm', ['x', 'W'], ['y'], transB=1)],
         [external(name, dtype, [N, K], data, 0, N * K * 2)])
