"""The ways worker.py runs, by name. Nothing imported: the worker reads them under another interpreter too
(`--compile-python`), where only this package is installed, not step 04's (which ways.py imports for llama.cpp)."""

WAYS = ["rust-fused", "rust-eager", "python-compile", "python-eager"]
# Ways of later steps, run only when asked for: "rust-int4" is step 07's engine (torchtpu_int4), linears 4-bit,
# multiplied by the kernel it picks for this CPU; "rust-int4-aten" the same with ATen's int4 kernel, to compare.
OPTIONAL = ["rust-int4", "rust-int4-aten"]
