//! Helpers shared by the end-to-end tests in `tests/tests/`: where the built hook, the CLI and
//! llama.cpp are, a tiny model, scratch directories, and trace checks.
//!
//! The tests need `cargo build --release --workspace` first and `GGML_VIZ_LLAMA_BUILD` pointing at
//! a llama.cpp build; `scripts/test.sh` does both.

mod places;
mod process;
mod programs;
mod traces;

pub use places::*;
pub use process::*;
pub use programs::*;
pub use traces::*;
