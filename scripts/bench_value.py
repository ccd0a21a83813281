"""The ~1 KiB layer config the object benchmarks broadcast
(examples/object_bench.rs sends the same fields from Rust)."""

VALUE = {
    "name": "transformer.blocks.12.attn.qkv_proj",
    "step": 123456,
    "learning_rate": 3e-4,
    "shape": [4096, 12288],
    "dtype": "bfloat16",
    "tags": ["tensor_parallel", "sequence_parallel"],
    "quantized": True,
    "scales": [1.0 / (i + 3.0) for i in range(112)],
}
