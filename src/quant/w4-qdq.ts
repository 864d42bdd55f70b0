// W4 in the QAIRT converter's form: the W4 codes and scales of quant/w4.ts (the same numbers on the
// CPU as MatMulNBits(bits=4)), as an ONNX int4 initializer [N, K] → DequantizeLinear(axis 1,
// block_size 32, no zero point: symmetric) → Gemm(transB=1). The graph is opset 21, IR 10.
//
// Why this form and not an encodings file (--quantization_overrides): the converter takes a
// weight's encoding from the DequantizeLinear in front of it (what forge's W8 QDQ form relies on), and
// the QAIRT converters read ONNX up to opset 22 with a quantized model's tensors keeping their
// precision (QAIRT 2.39 docs, "Qairt Converter": "Current ONNX Conversion supports upto ONNX Opset
// 22"; "The source model can either be float model or quantized model ... retaining the precision
// and datatype of the tensors"). The AIMET 1.0.0 encoding spec (quic/aimet Docs, "Encoding Format
// Specification" §5: enc_type PER_BLOCK, bw, is_sym, block_size, scale/offset flattened
// [out · in/block]) says the same thing in JSON, but as a second copy: one float a block (125 M
// values, gigabytes of JSON, per graph at 4B) beside the graph's own, and which tensor name an
// override attaches to once the converter has folded the DequantizeLinear is not documented. One
// copy, in the graph, is what the converter and ONNX Runtime both read; the converter keeps it
// 4-bit with --float_fallback (no calibration: every other tensor stays float, fp16 with
// --float_bitwidth 16), the flags the W8 QDQ form already gets. AIMET's blockwise docs also say
// why the activations stay float: "Layers with weights running with Blockwise quantization must
// themselves be running with floating-point quantized activations" (Docs/torch_docs/
// blockwise_quantization.rst), and that the Qualcomm runtime blocks along the input channels only,
// with block size 1 along the output channels: axis 1 of a [out, in] weight, as here.
//
// Not verified against a real SDK (there is none where this was written): the tests run the
// stand-in (test/fixtures/fake-qairt), which checks this form's invariants, not QNN's handling of
// it. Open: whether a given QAIRT release lowers per-block int4 to the HTP's native block encoding
// or to LPBQ (QNN's blockwise expansion: per-channel float scales times 4-bit integer block
// scales, onnxruntime-qnn PR #307 converts one to the other); LPBQ cannot hold forge's free fp32
// block scales exactly, so there the HTP's numbers would differ from the CPU's by that rounding.

/** The default-domain opset of a graph holding this form: int4 and DequantizeLinear's block_size are opset 21. */
export const W4_QDQ_OPSET = 21;

/**
 * MatMulNBits' packed W4 codes (unsigned q + 8, low nibble first) as ONNX int4 (two's complement
 * q, low nibble first), in place: q + 8 ↦ q is a flip of each nibble's top bit, so the layout and
 * everything else stay byte for byte.
 */
export function toOnnxInt4(packed: Uint8Array): Uint8Array {
  for (let i = 0; i < packed.length; i++) packed[i] ^= 0x88;
  return packed;
}

/** The signed codes of an ONNX int4 tensor's bytes, in element order. */
export function int4Codes(bytes: Uint8Array): Int8Array {
  const out = new Int8Array(bytes.length * 2);
  for (let i = 0; i < out.length; i++) {
    const nib = i & 1 ? bytes[i >> 1] >> 4 : bytes[i >> 1] & 15;
    out[i] = nib >= 8 ? nib - 16 : nib;
  }
  return out;
}
