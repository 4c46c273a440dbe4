"""llama.cpp, the peer: where `make peer` put it, which build and setting a way names, and whether it can run.

    build, quant, repack = peer.parse_way("llamacpp-avx2-q4_0-norepack")   # ("avx2", "q4_0", False)
    why = peer.missing("llamacpp-q4_0")    # None when that way can run here, else a one-line reason

A way is `llamacpp[-avx512|-avx2]-<quant>[-norepack]`: the build (the native one, `-DGGML_NATIVE=ON`; the one kept
to AVX-512 without AMX, what an AMD EPYC Zen 4 runs; or the one kept to AVX2), the GGUF's format (q4_0, q8_0,
bf16), and whether llama.cpp may repack the weights into its CPU "extra buffer types" at load (its default;
`use_extra_bufts` in the model params). `make peer` (tools/peer.sh) writes
`builds.json` in its cache: the converter's folder and each build's library folder, which a way's process loads
through `LLAMA_CPP_LIB_PATH` (llama-cpp-python's own switch), so every build serves one installed package.
Nothing here imports llama_cpp or torch: a comparison or a bench asks before it starts a process. Step 04 uses the
peer as a second reference (`llama.py`); step 05 benches it beside the engine (torchtpu_ways' llama.cpp ways).
"""
import importlib.util
import json
import os
from pathlib import Path

VERSION = "0.3.36"  # the pinned llama-cpp-python (tools/peer.sh)
QUANTS = ("q4_0", "q8_0", "bf16")
BUILDS = ("native", "avx512", "avx2")
PREFIX = "llamacpp-"
WAY_FORM = f"llamacpp[-avx512|-avx2]-<{'|'.join(QUANTS)}>[-norepack]"  # how a llama.cpp way is spelled
MAKE_PEER = "run `make peer` (builds llama.cpp from PyPI's llama-cpp-python source, 6-12 minutes a build on 2 cores)"


def cache() -> Path:
    """The peer's cache (tools/peer.sh): outside the clone, shared by every clone on this machine."""
    root = Path(os.environ.get("GEMMA4_CACHE", Path.home() / ".cache" / "gemma4-walkthrough"))
    return root / f"llama-cpp-python-{VERSION}"


def is_peer(way: str) -> bool:
    return way.startswith(PREFIX)


def parse_way(way: str) -> tuple[str, str, bool]:
    """(build, quant, repack) of a llama.cpp way; ValueError naming the way when it is not one."""
    parts = way.removeprefix(PREFIX).split("-") if is_peer(way) else []
    build = parts.pop(0) if parts and parts[0] in BUILDS else "native"
    repack = not (parts and parts[-1] == "norepack")
    parts = parts[:-1] if not repack else parts
    if len(parts) != 1 or parts[0] not in QUANTS:
        raise ValueError(f"way {way!r}: a llama.cpp way is {WAY_FORM}")
    return build, parts[0], repack


def name(way: str) -> str:
    """`llama.cpp Q4_0 (native build, repacked)`: how tables and charts name a llama.cpp way."""
    build, quant, repack = parse_way(way)
    return f"llama.cpp {quant.upper()} ({build} build, {'repacked' if repack else 'no repack'})"


def manifest() -> dict | None:
    """builds.json of `make peer`, or None when it has not run."""
    path = cache() / "builds.json"
    return json.loads(path.read_text()) if path.is_file() else None


def missing(way: str) -> str | None:
    """Why `way` cannot run here (the peer not installed, that build not made), or None."""
    build, _, _ = parse_way(way)
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python {VERSION} is not installed: {MAKE_PEER}"
    built = (manifest() or {}).get("builds", {})
    if build not in built or not Path(built[build]["lib"]).is_dir():
        return f"llama.cpp's {build} build is not in {cache()}: {MAKE_PEER}"
    return None


def build_info(build: str) -> dict:
    """{"lib": folder of libllama.so, "cmake_args": how it was built} of a build `make peer` made."""
    built = (manifest() or {}).get("builds", {})
    if build not in built:
        raise FileNotFoundError(f"llama.cpp's {build} build is not in {cache()}: {MAKE_PEER}")
    return built[build]


def any_build() -> dict:
    """build_info of the native build, or where `make peer` made only others (`make bench-avx2` makes only the AVX2
    one), of the first of them: for work whose result is the same in every build, as the quantizer's (Q4_0, Q8_0
    and Q4_0's Q6_K token table come from ggml-base's plain C code; a build's CPU flags reach only ggml-cpu)."""
    built = (manifest() or {}).get("builds", {})
    for build in BUILDS:
        if build in built:
            return built[build]
    raise FileNotFoundError(f"no llama.cpp build is in {cache()}: {MAKE_PEER}")


def converter() -> Path:
    """The folder holding the sdist's convert_hf_to_gguf.py, conversion/ and gguf-py/."""
    folder = Path((manifest() or {}).get("converter", cache() / "converter"))
    if not (folder / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"{folder}: llama.cpp's converter is missing: {MAKE_PEER}")
    return folder


def env(way: str) -> dict:
    """The environment of a llama.cpp way's process: llama-cpp-python loads its build's library."""
    out = dict(os.environ)
    out["LLAMA_CPP_LIB_PATH"] = build_info(parse_way(way)[0])["lib"]
    return out
