//! Link the extension against the libtorch that `import torch` loads, and record what it was built with.
use std::process::Command;

fn main() {
    // torch-sys tells us (via its `links = "tch"` key) where the pip-installed libtorch lives.
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not report DEP_TCH_LIBTORCH_LIB");
    // Link arguments are not inherited from dependencies: without these only libtorch_cpu gets linked, and
    // the loader would not find libtorch at run time outside Python.
    println!("cargo:rustc-link-arg=-Wl,-rpath={lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    // The CUDA build of torch leaves symbols for its nvidia-* libraries unresolved; executables
    // (cargo test) must accept that, the Python extension (a shared library) already does.
    println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");

    // The tch version Cargo resolved (pinned with `=` in Cargo.toml), read from the lock file.
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let tch = lock.split("[[package]]").find(|p| p.contains("name = \"tch\"\n"));
    let tch = tch.and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")));
    println!("cargo:rustc-env=TCH_VERSION={}", tch.unwrap_or("\"unknown\"").trim_matches('"'));
    println!("cargo:rerun-if-changed=Cargo.lock");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc).arg("--version").output().expect("cannot run rustc --version");
    println!(
        "cargo:rustc-env=RUSTC_VERSION={}",
        String::from_utf8_lossy(&version.stdout).trim().trim_start_matches("rustc ")
    );
}
