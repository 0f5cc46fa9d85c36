//! Installers of inline hooks, for ggml the dynamic loader cannot put our wrappers in front of:
//! a ggml linked into the executable itself (Linux: at load, from the executable's symbol table)
//! and ggml's DLLs (Windows: when our DLL is injected, and for DLLs loaded later).

#[cfg(target_os = "linux")]
mod static_exe;
#[cfg(windows)]
mod windows_dll;
