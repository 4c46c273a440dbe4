//! Link the extension against the libtorch that `import torch` loads, and record what it was built with.
use std::process::Command;

fn main() {
    // Where this virtualenv's torch keeps libtorch. torch-sys reports a path too (DEP_TCH_LIBTORCH_LIB), but its
    // build is cached in the cargo target dir that every clone shares, so that path names whichever virtualenv
    // built it first; ask the interpreter torch-sys uses (`python` in a virtualenv, else `python3`) instead.
    let lib = ask_python("import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))");
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    println!("cargo:rustc-link-search=native={lib}");
    // Link arguments are not inherited from dependencies: without these only libtorch_cpu gets linked, and
    // the loader would not find libtorch at run time outside Python.
    println!("cargo:rustc-link-arg=-Wl,-rpath={lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    // The CUDA build of torch leaves symbols for its nvidia-* libraries unresolved; executables
    // (cargo test) must accept that, the Python extension (a shared library) already does.
    println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");

    // torch's oneDNN switch, which tch does not wrap (see src/onednn.rs), against this torch's headers.
    let include = ask_python("import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))");
    cc::Build::new().cpp(true).std("c++17").include(&include).warnings(false).file("src/onednn.cpp").compile("onednn");
    println!("cargo:rerun-if-changed=src/onednn.cpp");
    // ATen's vector ISA for this process (see src/cpu.rs).
    cc::Build::new().cpp(true).std("c++17").include(&include).warnings(false).file("src/cpu.cpp").compile("aten_isa");
    println!("cargo:rerun-if-changed=src/cpu.cpp");
    // This step's int4 kernels (see src/dot4.rs). They split their rows with at::parallel_for, which ATen's headers
    // implement with OpenMP: compiled with -fopenmp, they run on torch's own thread pool (torch's libgomp, found
    // through the rpath above), so torch.set_num_threads sets their threads too. Each function says the
    // instructions it uses (`target` attributes), so the files build for any x86-64 and run where cpu.rs says.
    let mut kernels = cc::Build::new();
    kernels.cpp(true).std("c++17").include(&include).warnings(false).opt_level(3).flag("-fopenmp");
    kernels
        .file("src/dot4.cpp")
        .file("src/amx4.cpp")
        .file("src/fma4.cpp")
        .file("src/attend.cpp")
        .file("src/norm.cpp")
        .file("src/argmax.cpp")
        .file("src/tanh.cpp")
        .file("src/panels.cpp")
        .file("src/peak.cpp")
        .compile("kernels");
    println!("cargo:rustc-link-lib=gomp");
    println!("cargo:rerun-if-changed=src/dot4.cpp");
    println!("cargo:rerun-if-changed=src/amx4.cpp");
    println!("cargo:rerun-if-changed=src/fma4.cpp");
    println!("cargo:rerun-if-changed=src/peak.cpp");
    println!("cargo:rerun-if-changed=src/attend.cpp");
    println!("cargo:rerun-if-changed=src/norm.cpp");
    println!("cargo:rerun-if-changed=src/argmax.cpp");
    println!("cargo:rerun-if-changed=src/tanh.cpp");
    println!("cargo:rerun-if-changed=src/panels.cpp");
    println!("cargo:rerun-if-changed=src/bf16.h");
    println!("cargo:rerun-if-changed=src/gelu.h");
    println!("cargo:rerun-if-changed=src/blocks.h");

    // The tch version Cargo resolved (pinned with `=` in Cargo.toml), read from the lock file.
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let tch = lock.split("[[package]]").find(|p| p.contains("name = \"tch\"\n"));
    let tch = tch.and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")));
    println!("cargo:rustc-env=TCH_VERSION={}", tch.unwrap_or("\"unknown\"").trim_matches('"'));
    println!("cargo:rerun-if-changed=Cargo.lock");

    // The torch this crate is built against (torch-sys refused any release but the one tch pins).
    println!("cargo:rustc-env=BUILT_WITH_TORCH={}", ask_python("import torch; print(torch.__version__)"));

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc).arg("--version").output().expect("cannot run rustc --version");
    println!(
        "cargo:rustc-env=RUSTC_VERSION={}",
        String::from_utf8_lossy(&version.stdout).trim().trim_start_matches("rustc ")
    );
}

/// What a line of Python prints, run by the interpreter torch-sys uses.
fn ask_python(code: &str) -> String {
    let python = if std::env::var_os("VIRTUAL_ENV").is_some() { "python" } else { "python3" };
    let out = Command::new(python).args(["-c", code]).output().expect("cannot run python to ask about torch");
    assert!(out.status.success(), "python could not import torch: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
