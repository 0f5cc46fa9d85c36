//! The end-to-end tests, one binary: the built hook preloaded into real programs (llama.cpp
//! shared and static, Python ctypes hosts, Windows under Wine), the built CLI on their traces,
//! the report in headless Chromium, the live view in tmux.

mod ctypes;
mod live;
mod llama;
mod ops;
mod record;
mod report;
mod windows;
