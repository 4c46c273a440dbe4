// ATen's vector ISA for this process (what `torch.backends.cpu.get_cpu_capability()` says), exported unmangled so
// that cpu.rs can declare it: ATen's own answer, which honours ATEN_CPU_CAPABILITY as its dispatch does.
#include <ATen/Version.h>

#include <string>

// 0: no vector kernels (DEFAULT), 1: AVX2, 2: AVX512 (the ISA names ATen reports on x86)
extern "C" int torchtpu_aten_capability() {
  const std::string isa = at::get_cpu_capability();
  return isa == "AVX512" ? 2 : isa == "AVX2" ? 1 : 0;
}

// Whether the CPU is an Intel one (cpu.rs: where fma16 runs, dot4's prompt chunks go by float32 panels when AMX does
// not, and decode's dense mat-vecs go on oneDNN's).
extern "C" bool torchtpu_intel() { return __builtin_cpu_is("intel"); }
