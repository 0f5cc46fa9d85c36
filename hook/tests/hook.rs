//! The hook's integration tests, one binary: the recording core driven directly (no preloading),
//! the layer rule of the source tree, and the macOS objects' interpose table.

mod core;
mod layers;
mod macos_interpose;
