"""The ways worker.py runs, by name. Nothing imported: the worker reads them under another interpreter too
(`--compile-python`), where only this package is installed, not step 04's (which ways.py imports for llama.cpp)."""

WAYS = ["rust-fused", "rust-eager", "python-compile", "python-eager"]
# Ways of later steps, run only when asked for, each the engine of the step installed as its package:
# "rust-int4-aten" is step 07's (torchtpu_int4): step 03's engine with its linears kept 4-bit, multiplied by ATen's
# int4 kernel; "rust-int4" is step 08's (torchtpu_kernels): the same weights on this project's CPU kernels.
OPTIONAL = ["rust-int4", "rust-int4-aten"]
# The package each optional way's engine comes from, and the step that installs it.
PACKAGES = {"rust-int4": ("torchtpu_kernels", "step 08"), "rust-int4-aten": ("torchtpu_int4", "step 07")}
