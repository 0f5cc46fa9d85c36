//! Link arguments of the preloaded library, per target OS.
//!
//! Linux: `-Bsymbolic` binds the library's own references to its own exported functions (the
//! tables of our wrappers, which the inline hooks write jumps to) at link time. Without it each
//! is a symbol relocation that the dynamic loader resolves through the whole global scope when
//! the library is loaded (123 of them for the per-op wrappers: about 0.1 M instructions in every
//! process), and an executable exporting ggml's names ahead of us would have them point at its
//! own functions instead of our wrappers.
//!
//! macOS: the interpose table names ggml's functions, which the hook is not linked against; they
//! are found at load time in whichever image defines them (weakly: see `src/interpose.rs`).
fn main() {
    match std::env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("linux") => println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic"),
        Ok("macos") => {
            println!("cargo:rustc-cdylib-link-arg=-undefined");
            println!("cargo:rustc-cdylib-link-arg=dynamic_lookup");
        }
        _ => {}
    }
}
