//! The hook's integration tests, one binary: the recording core driven directly (no preloading),
//! its manifest's dependencies, and the macOS objects' interpose table.

mod core;
mod macos_interpose;
mod manifest;
