//! The end-to-end tests, one binary: the built hook preloaded into real programs (llama.cpp
//! shared and static, whisper.cpp, Python ctypes hosts, C programs built here, Windows under Wine), the built CLI on their traces,
//! the report in headless Chromium, the live view in tmux.

mod c_hosts;
mod ctypes;
mod export;
mod live;
mod llama;
mod ops;
mod record;
mod report;
mod rpc;
mod scripts;
mod server;
mod source;
mod threads;
mod vulkan;
mod whisper;
mod windows;
