//! Test and demo support for npu-alloc: a simulated device, the `.trace` parser and the replayer.
