/// Rebuild when bpf-linker changes (it links this crate): a new linker must
/// produce a new object.
fn main() {
    match which::which("bpf-linker") {
        Ok(p) => println!("cargo:rerun-if-changed={}", p.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found on PATH: {e}"),
    }
}
