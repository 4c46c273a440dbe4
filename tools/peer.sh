#!/usr/bin/env bash
# `make peer`: llama.cpp, the peer of step 05's bench, built from PyPI's llama-cpp-python source distribution.
# Everything lands in a cache outside the clone, keyed on the version and the build flags (and, for the native
# build, the CPU: -march=native code is this CPU's), so a fresh clone reuses a build the machine already made:
#   $PEER/sdist/         the pinned sdist, as pip downloaded it
#   $PEER/converter/     its vendor/llama.cpp converter: convert_hf_to_gguf.py, conversion/, gguf-py/
#   $PEER/<build>-<key>/ the wheel, its unpacked llama_cpp/lib (what LLAMA_CPP_LIB_PATH points at), cmake-args
#   $PEER/builds.json    which folder each build is in: step 05's ways read it to pick a build
# The native build is installed into .venv (its Python code is the same for every build; only the library differs),
# or, where it was not made, the first build asked for.
# Usage: tools/peer.sh [native|avx512|avx2]...   (default: all three)
set -euo pipefail

VERSION=0.3.36
CACHE=${GEMMA4_CACHE:-$HOME/.cache/gemma4-walkthrough}
PEER=$CACHE/llama-cpp-python-$VERSION
PY=${PYTHON:-.venv/bin/python}
# No multimodal library (mtmd): the bench never loads it, and it is a third of the compile.
COMMON="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
declare -A FLAGS=(
  [native]="-DGGML_NATIVE=ON"
  # The AVX2 stand-in: what an AVX2-only CPU would run (no AVX-512, so no AMX or AVX512-BF16 either).
  # The AVX-512 stand-in: what an AMD EPYC Zen 4 runs (AVX-512 with VNNI, VBMI and BF16; no AMX). On an AMX Xeon it
  # is llama.cpp's fastest build that runs: the native one repacks for AMX and crashes on these models.
  [avx512]="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  [avx2]="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
for b in ${@:-}; do  # before any download or build: a name FLAGS lacks would stop it half way
  if [ -z "${FLAGS[$b]+known}" ]; then
    echo "usage: tools/peer.sh [native|avx512|avx2]...   (no build named '$b')" >&2
    exit 2
  fi
done

mkdir -p "$PEER/sdist"
SDIST=$PEER/sdist/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
  # --no-binary for this one package only: `:all:` would also build cmake itself from source.
  "$PY" -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$PEER/sdist.tmp"
  mv "$PEER/sdist.tmp/llama_cpp_python-$VERSION.tar.gz" "$SDIST" && rm -rf "$PEER/sdist.tmp"
fi

if [ ! -f "$PEER/converter/convert_hf_to_gguf.py" ]; then
  rm -rf "$PEER/converter.tmp" && mkdir -p "$PEER/converter.tmp"
  tar -xzf "$SDIST" -C "$PEER/converter.tmp" --strip-components=3 \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/convert_hf_to_gguf.py" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/conversion" \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/gguf-py"
  rm -rf "$PEER/converter" && mv "$PEER/converter.tmp" "$PEER/converter"
fi

key() {  # version + flags (+ the CPU for -march=native): 12 hex digits
  local cpu=""
  [ "$1" = native ] && cpu=$(grep -m1 -E '^(model name|flags)' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo)
  printf '%s\n%s %s\n%s' "$VERSION" "$COMMON" "${FLAGS[$1]}" "$cpu" | sha256sum | cut -c1-12
}

for build in "${@:-native avx512 avx2}"; do
  for b in $build; do
    dir=$PEER/$b-$(key "$b")
    if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
      echo "== building llama-cpp-python $VERSION ($b): $COMMON ${FLAGS[$b]} (6-12 minutes on 2 cores)"
      rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
      # pip builds in an isolated environment with PyPI's scikit-build-core and cmake (+ ninja) wheels.
      CMAKE_ARGS="$COMMON ${FLAGS[$b]}" CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-$(nproc)} \
        "$PY" -m pip wheel --no-deps --wheel-dir "$dir.tmp" "$SDIST"
      "$PY" -m zipfile -e "$dir.tmp"/llama_cpp_python-*.whl "$dir.tmp/unpacked"
      mv "$dir.tmp/unpacked/llama_cpp/lib" "$dir.tmp/lib" && rm -rf "$dir.tmp/unpacked"
      echo "$COMMON ${FLAGS[$b]}" > "$dir.tmp/cmake-args"
      rm -rf "$dir" && mv "$dir.tmp" "$dir"
    fi
  done
done

# builds.json: every build made so far for this version, by name (the newest folder of each name wins)
"$PY" - "$PEER" "$VERSION" <<'EOF'
import json, pathlib, sys
peer, version = pathlib.Path(sys.argv[1]), sys.argv[2]
builds = {}
for d in sorted(peer.glob("*-*/cmake-args"), key=lambda p: p.stat().st_mtime):
    name = d.parent.name.split("-")[0]
    builds[name] = {"lib": str(d.parent / "lib"), "cmake_args": d.read_text().strip()}
manifest = {"version": version, "converter": str(peer / "converter"), "builds": builds}
(peer / "builds.json").write_text(json.dumps(manifest, indent=1) + "\n")
EOF

# what .venv gets (see the top; `make bench-avx2` makes only the AVX2 build): a way loads its build's library by
# LLAMA_CPP_LIB_PATH, whichever wheel installed the Python code
wheel=$(ls "$PEER"/native-"$(key native)"/llama_cpp_python-*.whl 2>/dev/null || true)
for b in ${@:-}; do
  [ -n "$wheel" ] || wheel=$(ls "$PEER/$b-$(key "$b")"/llama_cpp_python-*.whl 2>/dev/null || true)
done
if [ -n "$wheel" ]; then
  "$PY" -m pip install --quiet --no-deps --force-reinstall "$wheel"
  # its run-time needs (numpy is already the project's); diskcache and jinja2 are imported by llama_cpp
  "$PY" -m pip install --quiet "diskcache>=5.6.1" "jinja2>=2.11.3" "typing-extensions>=4.5.0"
fi
echo "== the peer: $PEER ($(du -sh "$PEER" | cut -f1))"
