#!/usr/bin/env bash
# `make test`'s check on CPUs without AVX-512: step 08's Rust tests run on two AVX2-only CPUs that QEMU emulates
# (user mode, TCG), an Intel Haswell and an AMD EPYC Rome. QEMU's TCG has no AVX-512 at all, so the CPU reports
# none (torch, oneDNN and MKL pick their AVX2 code by themselves, as on a real one) and an AVX-512 instruction
# that strayed into an AVX2 path would stop the run with SIGILL: what the AVX2 limit (the Makefile's AVX2_LIMIT)
# cannot show on a CPU that has AVX-512. Emulation is slow; its timings mean nothing.
# Needs QEMU's user mode (Debian: qemu-user): where the CI variable is set (the project's CI) this script installs it,
# elsewhere the check says how and skips.
set -euo pipefail

if ! command -v qemu-x86_64 >/dev/null; then
  if [ -n "${CI:-}" ]; then
    apt-get update -qq && apt-get install -y -qq qemu-user >/dev/null
  else
    echo "skipped: no qemu-x86_64 here (apt-get install qemu-user)"
    exit 0
  fi
fi

# the test binary cargo test built (the same profile: nothing is compiled again)
binary=$(cargo test --release --no-run --message-format=json --manifest-path steps/08_cpu_kernels/Cargo.toml 2>/dev/null |
  python -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | head -1)

# One test is left to the native runs: QEMU's user mode takes madvise as the hint it is and drops it, so no map of
# an emulated process is advised or on 2 MB pages (pages.rs's test found neither under it).
native_only=pages::tests::its_whole_pages_are_advised_huge_and_granted_where_linux_can
for cpu in Haswell EPYC-Rome; do
  echo "== step 08's Rust tests on QEMU's $cpu (AVX2, FMA, F16C; no AVX-512)"
  # QEMU warns about host features TCG lacks (pcid, x2apic, ...): not the CPU the tests see
  TORCHTPU_EXPECT_ISA=avx2 qemu-x86_64 -cpu "$cpu" "$binary" -q --skip "$native_only" \
    2> >(grep -v "TCG doesn't support requested feature" >&2)
done
