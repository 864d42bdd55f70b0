export * from './dtype.js';
export * from './builder.js';
export * from './writer.js';
export * from './reader.js';
export { checkModel } from './check.js';
export { onnx } from './proto.js';
