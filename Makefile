# Two commands: `make run` (run every step, record its output, build the guide) and `make test` (all checks).
# Both set up what they need: the .venv virtualenv, the pinned packages, every step built and installed.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := run

PYTHON ?= python3
TORCH := 2.13.0
# uv installs the pinned packages: it hard-links them from its cache (torch: a second, where pip takes a minute)
UV := 0.13.9
DEVICE ?= auto

# Caches live outside the clone so that a fresh clone (CI) reuses earlier work. torch-sys does not rebuild
# when the installed torch changes, so its build is keyed on the torch release.
CACHE := $(HOME)/.cache/gemma4-walkthrough
export CARGO_TARGET_DIR ?= $(CACHE)/cargo-torch-$(TORCH)
export PIP_CACHE_DIR ?= $(HOME)/.cache/pip
# the same folder for the tools and tests that keep things there (llama.cpp's builds, the copies' virtualenvs)
export GEMMA4_CACHE ?= $(CACHE)
# torch-sys finds libtorch by asking `python` for the installed torch: point it at the venv.
export VIRTUAL_ENV := $(CURDIR)/.venv
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)
export LIBTORCH_USE_PYTORCH := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export NO_MKDOCS_2_WARNING := 1

# The AVX2 stand-in: with these, torch's dispatch, oneDNN and MKL use no more of the CPU than an AVX2-only CPU has (no
# bf16 matmul hardware), and so does step 08's kernel choice. MKL reads neither of the first two: without its own
# variable its float32 products (attention in float32, the default there) keep their AVX-512 code, and their bits
# differ from an AVX2 Intel CPU's (QEMU's Haswell gives the bits MKL_ENABLE_INSTRUCTIONS=AVX2 gives). `make test`
# runs AVX2_TESTS under it a second time.
AVX2_LIMIT := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
# The AVX512-BF16 stand-in: oneDNN kept from AMX, and so step 08's choice of panels — on an AMX Xeon, what an Intel
# CPU with AVX512-BF16 and no AMX runs (dot4's prompt chunks by float32 panels). `make test` runs step 08's tests under
# it a third time; `make bench-avx512` records the peer comparison under it.
AVX512_LIMIT := ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16
# The stand-in for an Intel CPU with AVX-512 and no AVX512-BF16 (Skylake to Ice Lake): torch keeps its bf16 fast
# path, which oneDNN then emulates in float32, in sums that depend on a product's row count; step 08 runs fma4, its
# short prompts in 16 lanes (fma16). `make test` runs step 04's bf16 parity tests and step 08's tests under it.
AVX512_NO_BF16_LIMIT := ONEDNN_MAX_CPU_ISA=AVX512_CORE
# `make test` runs each of its limited tiers (and the emulated CPUs') only on a CPU with what the tier keeps torch or
# step 08 from: elsewhere it changes nothing (on an AVX2-only CPU, ATEN_CPU_CAPABILITY=avx2 is what torch picks
# anyway, and no AVX-512 instruction can run), and the copies' tests above already ran on this CPU as it is.
# $(call where_cpu_has,<a /proc/cpuinfo flag>,<commands>)
where_cpu_has = if grep -qw '$(1)' /proc/cpuinfo; then $(2); else echo "   skipped: this CPU has no $(1), so the tests \
	above already ran as this tier would run them"; fi
AVX2_TESTS := steps/03_model/tests/test_engine.py steps/03_model/tests/test_attention_dtype.py \
	steps/03_model/tests/test_records.py steps/03_model/tests/test_stream.py steps/04_parity/tests/test_parity.py \
	steps/05_tpu/tests/test_baseline.py steps/07_int4/tests steps/08_cpu_kernels/tests

STEPS := $(patsubst %/,%,$(sort $(dir $(wildcard steps/*/pyproject.toml))))
RUST_STEPS := $(patsubst %/,%,$(sort $(dir $(wildcard steps/*/Cargo.toml))))
# what a step installs: its Rust crate and its Python package (not its tests, scripts' build output or targets)
STEP_SOURCES := $(shell find steps \( -name tests -o -name target -o -name build -o -name '*.egg-info' \) -prune -o \
	-type f \( -name '*.rs' -o -name 'Cargo.*' -o -name pyproject.toml -o -name '*.py' -o -name '*.pyi' \
	-o -name '*.json' -o -name '*.safetensors' -o -name '*.cpp' -o -name '*.h' \) -print)

.PHONY: run test bench bench-avx2 bench-avx512 peer bench-peer train setup clean distclean
setup: .venv/.steps

.venv/.deps: pyproject.toml Makefile
	@echo "== the walkthrough environment (.venv): pinned packages from pyproject.toml"
	test -x .venv/bin/python || $(PYTHON) -m venv .venv
	pip install --quiet --upgrade pip uv==$(UV)
	uv pip install ".[docs,test]"
	touch $@

# Each step is its own package; Rust steps build with maturin into the shared CARGO_TARGET_DIR.
# No build isolation: torch-sys must see the venv's torch while it compiles.
.venv/.steps: .venv/.deps $(STEP_SOURCES)
	@echo "== building and installing the steps: $(notdir $(STEPS))"
	@echo "   (the first build compiles torch-sys' C++ wrapper: about 3 minutes on 2 cores)"
	for s in $(STEPS); do pip install --no-build-isolation --no-deps --force-reinstall "./$$s"; done
	touch $@

run: setup
	python tools/record.py --device $(DEVICE)
	mkdocs build --strict --site-dir site

test: setup
	ruff check .
	for s in $(RUST_STEPS); do cargo test --release --quiet --manifest-path "$$s/Cargo.toml"; done
	python -m pytest train
	@echo "== each step copied out of the repository, installed into its own fresh virtualenv, its tests run there"
	@echo "   (the only run of the steps' tests in make test: \`python -m pytest\` runs them in place too)"
	python -m pytest tests/copy
	@echo "== the tests whose expectations depend on the CPU's defaults, again with torch and oneDNN kept to AVX2:"
	@echo "   what an AVX2-only CPU runs (float32 attention, step 08's fma4 kernel), on any machine"
	$(call where_cpu_has,avx512f,$(AVX2_LIMIT) cargo test --release --quiet --manifest-path steps/08_cpu_kernels/Cargo.toml \
		&& $(AVX2_LIMIT) python -m pytest -q -p no:cacheprovider $(AVX2_TESTS))
	@echo "== step 08's tests again with oneDNN kept from AMX: what an Intel CPU with AVX512-BF16 and no AMX runs"
	$(call where_cpu_has,amx_tile,$(AVX512_LIMIT) cargo test --release --quiet --manifest-path steps/08_cpu_kernels/Cargo.toml \
		&& $(AVX512_LIMIT) python -m pytest -q -p no:cacheprovider steps/08_cpu_kernels/tests)
	@echo "== step 04's bf16 parity tests and step 08's tests with oneDNN, and so step 08, kept from AVX512-BF16: an"
	@echo "   Intel CPU with AVX-512 and no AVX512-BF16 (Skylake to Ice Lake): oneDNN emulates bf16, step 08 runs fma4"
	$(call where_cpu_has,avx512_bf16,$(AVX512_NO_BF16_LIMIT) python -m pytest -q -p no:cacheprovider \
		steps/04_parity/tests/test_parity.py -k bfloat16 \
		&& $(AVX512_NO_BF16_LIMIT) python -m pytest -q -p no:cacheprovider steps/08_cpu_kernels/tests)
	@echo "== step 08's Rust tests on two emulated AVX2-only CPUs (QEMU), where no AVX-512 instruction can run"
	$(call where_cpu_has,avx512f,tools/emulated-avx2.sh)
	mkdocs build --strict --site-dir site
	if [ -n "$${CI:-}" ] && ! command -v chromium >/dev/null; then apt-get update -qq && apt-get install -y -qq chromium; fi
	python -m pytest tests/site

# The CPU record at full E2B size (random weights): makes the 9 GB checkpoint once, then runs for a long while.
bench: setup
	python tools/record.py --list tools/bench.txt --folder cpu-e2b --device cpu

# The same E2B bench with torch and oneDNN kept to AVX2 on this CPU: how the AVX2-only CPUs many readers have fare
# (no bf16 matmul hardware). On a CPU with AVX-512 a stand-in, labeled as such in its record's header (a real AVX2 chip
# has its own clocks and caches); on an AVX2-only CPU the limit changes nothing. Beside llama.cpp's build kept to AVX2,
# which it makes first where the machine has none (6-12 minutes, once).
bench-avx2: setup
	tools/peer.sh avx2
	$(AVX2_LIMIT) python tools/record.py --list tools/bench-avx2.txt --folder cpu-e2b-avx2 --device cpu

# llama.cpp, the benches' peer (step 04's second reference, step 05's llama.cpp ways): PyPI's llama-cpp-python,
# pinned, built from its source distribution with the cmake wheel, three times — native (-march=native), kept to
# AVX-512 without AMX (an EPYC Zen 4's; on an AMX Xeon the fastest that runs) and kept to AVX2 (the stand-in's) —
# into $(CACHE)/llama-cpp-python-<version>/, keyed on the flags, beside its converter; the native build is installed
# into .venv. 6-12 minutes a build on 2 cores, 220 MB of cache. Never part of `make test`: the tests that need it
# skip without it.
peer: setup
	tools/peer.sh native avx512 avx2

# Step 05's E2B bench with the two Rust ways the peer is compared with and every llama.cpp way, and step 06's with
# Rust int4 beside llama.cpp's fastest Q4_0 ways at 512, 4,081 and 32,761 tokens (tools/bench-peer.txt).
bench-peer: peer
	python tools/record.py --list tools/bench-peer.txt --folder cpu-e2b --device cpu

# The same comparison at 19, 512 and 4,081 tokens with oneDNN kept from AMX: on an AMX Xeon, how an Intel CPU with
# AVX512-BF16 and no AMX fares beside llama.cpp. A stand-in, labeled as such in its record; elsewhere the same as
# bench-peer's.
bench-avx512: peer
	$(AVX512_LIMIT) python tools/record.py --list tools/bench-peer.txt --folder cpu-e2b-amx-avx512 --device cpu \
		05_tpu-peer 06_longprompt-peer

# The default model, trained again from scratch (about 85 minutes on 2 cores; resumes if interrupted),
# exported, measured, and compared with the files step 03 ships. `make train SHIP=1` also replaces the shipped
# files and their records in docs/runs/train/.
TRAINED := .cache/train
train: setup
	python train/train.py --out $(TRAINED)/run
	python train/export.py --weights $(TRAINED)/run/model.pt --out $(TRAINED)/export $(if $(SHIP),--ship)
	python train/evaluate.py --weights $(TRAINED)/run/model.pt --export $(TRAINED)/export \
		--json $(TRAINED)/evaluate.json --chart $(TRAINED)/accuracy.png --against docs/runs/train/evaluate.json \
		| tee $(TRAINED)/evaluate.txt
	python train/curves.py $(TRAINED)/run/log.json $(TRAINED)/loss.png | tee $(TRAINED)/training.txt
	$(if $(SHIP),cp $(TRAINED)/run/log.json $(TRAINED)/evaluate.* $(TRAINED)/training.txt $(TRAINED)/*.png docs/runs/train/)

# .cache/train (an hour of training) survives `make clean`; `make distclean` removes it too.
clean:
	rm -rf .venv site .cache/checkpoints test-artifacts build *.egg-info steps/*/build steps/*/*.egg-info
	find steps tests tools -name __pycache__ -prune -exec rm -rf {} +

# Also drops the caches shared by every clone: the next build compiles torch-sys again.
distclean: clean
	rm -rf .cache $(CARGO_TARGET_DIR)
