//! Windows: starting a program with the hook DLL loaded into it. The program is created
//! suspended; the DLL's path is written into it and `LoadLibraryW` run there on a remote thread
//! (the DLL hooks ggml as it loads: see the hook's `windows.rs`); then its threads are resumed.

use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::io::AsRawHandle;
use std::os::windows::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE, INVALID_HANDLE_VALUE};
use windows_sys::Win32::System::Diagnostics::Debug::WriteProcessMemory;
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
};
use windows_sys::Win32::System::LibraryLoader::{GetModuleHandleA, GetProcAddress};
use windows_sys::Win32::System::Memory::{
    MEM_COMMIT, MEM_RELEASE, MEM_RESERVE, PAGE_READWRITE, VirtualAllocEx, VirtualFreeEx,
};
use windows_sys::Win32::System::Threading::{
    CREATE_SUSPENDED, CreateRemoteThread, GetExitCodeThread, INFINITE, LPTHREAD_START_ROUTINE,
    OpenThread, ResumeThread, THREAD_SUSPEND_RESUME, WaitForSingleObject,
};

/// Spawns `cmd` with `dll` loaded into it before its first instruction runs.
pub fn start_injected(cmd: &mut Command, dll: &Path) -> io::Result<Child> {
    cmd.creation_flags(CREATE_SUSPENDED);
    let mut child = cmd.spawn()?;
    let result = load_library(&child, dll).and_then(|()| resume(child.id()));
    if let Err(err) = result {
        let _ = child.kill();
        return Err(err);
    }
    Ok(child)
}

/// Runs `LoadLibraryW(dll)` in the child and waits for it.
fn load_library(child: &Child, dll: &Path) -> io::Result<()> {
    let process = child.as_raw_handle() as HANDLE;
    let path: Vec<u16> = dll.as_os_str().encode_wide().chain([0]).collect();
    let size = path.len() * 2;
    // SAFETY: a live process handle with full access (we created it); the remote buffer is
    // written with exactly `size` bytes from `path`, and freed after the remote thread ended.
    unsafe {
        let remote = VirtualAllocEx(
            process,
            std::ptr::null(),
            size,
            MEM_COMMIT | MEM_RESERVE,
            PAGE_READWRITE,
        );
        if remote.is_null() {
            return Err(io::Error::last_os_error());
        }
        let done = (|| {
            if WriteProcessMemory(
                process,
                remote,
                path.as_ptr().cast(),
                size,
                std::ptr::null_mut(),
            ) == 0
            {
                return Err(io::Error::last_os_error());
            }
            // kernel32 is mapped at the same address in every process of a boot session.
            let load = GetProcAddress(
                GetModuleHandleA(c"kernel32.dll".as_ptr().cast()),
                c"LoadLibraryW".as_ptr().cast(),
            )
            .ok_or_else(io::Error::last_os_error)?;
            let start: LPTHREAD_START_ROUTINE = Some(std::mem::transmute::<
                unsafe extern "system" fn() -> isize,
                unsafe extern "system" fn(*mut std::ffi::c_void) -> u32,
            >(load));
            let thread = CreateRemoteThread(
                process,
                std::ptr::null(),
                0,
                start,
                remote,
                0,
                std::ptr::null_mut(),
            );
            if thread.is_null() {
                return Err(io::Error::last_os_error());
            }
            WaitForSingleObject(thread, INFINITE);
            let mut module = 0u32;
            GetExitCodeThread(thread, &mut module);
            CloseHandle(thread);
            if module == 0 {
                return Err(io::Error::other(format!(
                    "LoadLibraryW({}) failed in the program",
                    dll.display()
                )));
            }
            Ok(())
        })();
        VirtualFreeEx(process, remote, 0, MEM_RELEASE);
        done
    }
}

/// Resumes every thread of process `pid` (a suspended new process has one).
fn resume(pid: u32) -> io::Result<()> {
    // SAFETY: the snapshot handle is closed below; THREADENTRY32 is plain data whose size field
    // is set before use; thread handles are closed after use.
    unsafe {
        let snapshot = CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0);
        if snapshot == INVALID_HANDLE_VALUE {
            return Err(io::Error::last_os_error());
        }
        let mut entry: THREADENTRY32 = std::mem::zeroed();
        entry.dwSize = std::mem::size_of::<THREADENTRY32>() as u32;
        let mut resumed = 0;
        let mut more = Thread32First(snapshot, &mut entry) != 0;
        while more {
            if entry.th32OwnerProcessID == pid {
                let thread = OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID);
                if !thread.is_null() {
                    if ResumeThread(thread) != u32::MAX {
                        resumed += 1;
                    }
                    CloseHandle(thread);
                }
            }
            more = Thread32Next(snapshot, &mut entry) != 0;
        }
        CloseHandle(snapshot);
        if resumed == 0 {
            return Err(io::Error::other("found no thread of the program to resume"));
        }
    }
    Ok(())
}
