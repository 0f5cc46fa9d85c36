//! macOS: the interpose table names ggml's functions, which the hook is not linked against; they
//! are found at load time in whichever image defines them (weakly: see `src/interpose.rs`).
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos") {
        println!("cargo:rustc-cdylib-link-arg=-undefined");
        println!("cargo:rustc-cdylib-link-arg=dynamic_lookup");
    }
}
