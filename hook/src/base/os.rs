//! What differs between operating systems, below the capture path: thread ids and names, the
//! host name, the clocks, opening the trace exclusively, process-wide exit/fork handlers,
//! zeroed memory for large tables, and pages backed ahead of their first write. Everything above
//! this module is the same on Linux, macOS and Windows.

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::ptr::NonNull;

/// A slice of `T`s that starts all zero, in pages of its own where the OS gives fresh pages
/// (Unix: an anonymous mapping), so that a table of thousands of slots costs nothing until its
/// slots are used: no loop initialising each, no `memset` (glibc's `calloc` clears memory it
/// reuses from the heap, which it does for large blocks once the process has freed some).
pub struct Zeroed<T> {
    ptr: NonNull<T>,
    len: usize,
    /// Mapped pages (else the global allocator's block).
    mapped: bool,
}

// SAFETY: `Zeroed` owns its `T`s like a `Box<[T]>` does.
unsafe impl<T: Send> Send for Zeroed<T> {}
// SAFETY: as for `Box<[T]>`: shared access hands out `&T` only.
unsafe impl<T: Sync> Sync for Zeroed<T> {}

impl<T> Zeroed<T> {
    /// `len` zeroed `T`s; `None` when the memory cannot be had.
    ///
    /// # Safety
    /// All-zero bytes are a valid `T` (an atomic integer or pointer).
    pub unsafe fn new(len: usize) -> Option<Zeroed<T>> {
        let layout = std::alloc::Layout::array::<T>(len).ok()?;
        if layout.size() == 0 {
            return None;
        }
        if let Some(ptr) = map_zeroed(layout.size()) {
            return Some(Zeroed {
                ptr: ptr.cast(),
                len,
                mapped: true,
            });
        }
        // SAFETY: a layout of non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Zeroed {
            ptr: ptr.cast(),
            len,
            mapped: false,
        })
    }

    /// Has the pages backed for writing now (see [`populate_for_writing`]): their first write
    /// then faults no more, and a read before it maps no shared zero page that a write would
    /// have to replace (a second fault, which flushes the TLBs of the process's other CPUs).
    pub fn back_for_writing(&self) {
        populate_for_writing(self.ptr.as_ptr().cast(), std::mem::size_of_val(&**self));
    }
}

impl<T> Deref for Zeroed<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` zeroed `T`s, valid per `new`'s contract, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Zeroed<T> {
    fn drop(&mut self) {
        // SAFETY: the `T`s are dropped in place first (atomics: nothing to do), then the memory
        // is given back the way it was had, with the layout `new` computed.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            let layout = std::alloc::Layout::array::<T>(self.len).expect("the layout `new` made");
            if self.mapped {
                unmap(self.ptr.cast(), layout.size());
            } else {
                std::alloc::dealloc(self.ptr.as_ptr().cast(), layout);
            }
        }
    }
}

#[cfg(unix)]
pub use unix::*;
#[cfg(windows)]
pub use windows::*;

#[cfg(unix)]
mod unix {
    use super::*;

    /// The OS thread id (as `gettid` / `pthread_threadid_np` give it).
    pub fn thread_id() -> u32 {
        #[cfg(target_os = "linux")]
        // SAFETY: gettid has no preconditions.
        return unsafe { libc::gettid() } as u32;
        #[cfg(not(target_os = "linux"))]
        {
            let mut id = 0u64;
            // SAFETY: a null thread means the calling thread; `id` is writable.
            unsafe { libc::pthread_threadid_np(0, &mut id) };
            id as u32
        }
    }

    pub fn thread_name() -> String {
        let mut buf = [0u8; 64];
        // SAFETY: the buffer is writable for its length; the name is NUL-terminated within it.
        if unsafe {
            libc::pthread_getname_np(libc::pthread_self(), buf.as_mut_ptr().cast(), buf.len())
        } != 0
        {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    pub fn host_name() -> String {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it or
        // fails.
        if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
            return "unknown".into();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    fn read(clock: libc::clockid_t) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only it.
        unsafe { libc::clock_gettime(clock, &mut ts) };
        (ts.tv_sec as u64)
            .wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64)
    }

    pub fn monotonic_ns() -> u64 {
        read(libc::CLOCK_MONOTONIC)
    }

    pub fn realtime_ns() -> u64 {
        read(libc::CLOCK_REALTIME)
    }

    /// The file, emptied and locked for us; `None` if another process holds its lock. A symlink
    /// at the path is refused (`O_NOFOLLOW`: one planted in a shared directory must not redirect
    /// the trace), a new file is readable by its owner only, and the descriptor does not leak
    /// into programs the host executes. The lock (`flock`) is what readers check to know that
    /// the trace is still being written.
    pub fn open_locked(path: &Path) -> io::Result<Option<File>> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking: a FIFO with no reader fails at once (ENXIO) instead of blocking the
        // host's ggml call until one comes; what opens is then checked to be a regular file.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
            .map_err(|err| match err.raw_os_error() {
                Some(libc::ENXIO | libc::EISDIR) => not_regular(),
                _ => err,
            })?;
        if !file.metadata()?.is_file() {
            return Err(not_regular());
        }
        // SAFETY: F_SETFL on a descriptor we own, with flags read from it less O_NONBLOCK.
        unsafe {
            let fd = file.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(err)) => return Err(err),
        }
        // A file that was there before is replaced only if it is ours, and then readable by us
        // alone like a new one (the trace holds the command line, host and tensor names): one
        // someone else created keeps neither their ownership nor their mode over our trace.
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        if file.metadata()?.uid() != unsafe { libc::geteuid() } {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "owned by another user",
            ));
        }
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.set_len(0)?;
        Ok(Some(file))
    }

    /// What an output that is not a regular file (a FIFO, a device, a directory) is refused with.
    fn not_regular() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
    }

    /// Runs `write` with SIGXFSZ blocked on this thread, so that a file-size limit (`ulimit -f`)
    /// makes our write fail with EFBIG instead of killing the host; a SIGXFSZ it raised is
    /// consumed before the thread's mask is restored.
    pub fn without_sigxfsz<T>(write: impl FnOnce() -> T) -> T {
        // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
        let mut xfsz: libc::sigset_t = unsafe { std::mem::zeroed() };
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sigset pointers; only this thread's mask changes, and it is restored.
        unsafe {
            libc::sigemptyset(&mut xfsz);
            libc::sigaddset(&mut xfsz, libc::SIGXFSZ);
            libc::pthread_sigmask(libc::SIG_BLOCK, &xfsz, &mut old);
        }
        let result = write();
        // SAFETY: valid sigset pointers, and this thread's mask is restored to what it was. The
        // signal is known to be pending, so consuming it returns at once.
        unsafe {
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            if libc::sigismember(&pending, libc::SIGXFSZ) == 1
                && libc::sigismember(&old, libc::SIGXFSZ) == 0
            {
                let mut signal = 0;
                libc::sigwait(&xfsz, &mut signal);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
        result
    }

    /// The descriptor of `file`, for [`close_in_child`].
    pub fn descriptor(file: &File) -> i64 {
        use std::os::fd::AsRawFd;
        i64::from(file.as_raw_fd())
    }

    /// In a child after `fork`: drops its copy of an inherited descriptor. The parent's copy
    /// keeps the file open, and its lock held (a lock belongs to the open file, shared by both
    /// copies, and goes when the last copy closes: so never unlock it here).
    pub fn close_in_child(descriptor: i64) {
        if let Ok(fd) = i32::try_from(descriptor) {
            // SAFETY: closing a descriptor this process inherited and no longer uses; nothing
            // in the child reads or writes through it (the parent's writer is never touched).
            unsafe { libc::close(fd) };
        }
    }

    /// `at_exit` runs at process exit; `after_fork` in the child of every fork.
    pub fn install_process_handlers(at_exit: extern "C" fn(), after_fork: extern "C" fn()) {
        // SAFETY: both handlers are `extern "C"` functions that never unwind.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(None, None, Some(after_fork));
        }
    }

    /// Has the kernel back the pages of `len` bytes from `start` with memory, writable, without
    /// writing them (Linux 5.14's `MADV_POPULATE_WRITE`): the first write to each page then does
    /// not stop for its page fault. The bytes are left as they are, so another thread may be
    /// writing them meanwhile. Elsewhere, or where the kernel cannot, nothing is done (the first
    /// writes fault as before).
    pub fn populate_for_writing(start: *const u8, len: usize) {
        #[cfg(target_os = "linux")]
        {
            use std::sync::atomic::{AtomicBool, Ordering};
            static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
            if len == 0 || UNSUPPORTED.load(Ordering::Relaxed) {
                return;
            }
            // SAFETY: reads a constant of the process.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;
            let from = start as usize & !(page - 1);
            let to = start as usize + len;
            // SAFETY: the advice changes no byte and no mapping's protection; pages outside a
            // mapping make the call fail, which is all.
            let done = unsafe {
                libc::madvise(
                    from as *mut libc::c_void,
                    to - from,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if done != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                UNSUPPORTED.store(true, Ordering::Relaxed);
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (start, len);
    }

    /// Which of the pages wholly inside the `len` bytes from `start` are backed by memory
    /// (`mincore`): for the tests of what backs pages ahead of their use.
    #[cfg(all(test, target_os = "linux"))]
    pub fn backed_pages(start: *const u8, len: usize) -> Vec<bool> {
        // SAFETY: reads a constant of the process.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let from = (start as usize).next_multiple_of(page);
        let to = (start as usize + len) / page * page;
        if to <= from {
            return Vec::new();
        }
        let mut pages = vec![0u8; (to - from) / page];
        // SAFETY: a page-aligned range of the caller's memory, one byte of `pages` per page.
        let done =
            unsafe { libc::mincore(from as *mut libc::c_void, to - from, pages.as_mut_ptr()) };
        assert_eq!(done, 0, "mincore: {}", io::Error::last_os_error());
        pages.iter().map(|p| p & 1 == 1).collect()
    }

    /// `bytes` of fresh anonymous pages, which the kernel gives zeroed.
    pub(super) fn map_zeroed(bytes: usize) -> Option<NonNull<u8>> {
        // SAFETY: a new private anonymous mapping; nothing else is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(ptr.cast())
    }

    /// Asks the kernel to start writing `file`'s bytes `offset..offset + len` to its disk now
    /// (Linux; elsewhere nothing), without waiting for it.
    pub fn start_writeback(file: &File, offset: u64, len: u64) {
        #[cfg(target_os = "linux")]
        // SAFETY: a plain system call on an open descriptor we own; it reads and writes none
        // of our memory. A failure (a file system that keeps no such pages) changes nothing.
        unsafe {
            libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(file),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (file, offset, len);
    }

    /// Tells the kernel that `file`'s bytes `offset..offset + len` will not be read again soon:
    /// the pages of them already on the disk leave the page cache (Linux; elsewhere nothing).
    /// Pages not yet written back stay, and nothing waits.
    pub fn uncache(file: &File, offset: u64, len: u64) {
        #[cfg(target_os = "linux")]
        // SAFETY: as in `start_writeback`: advice on an open descriptor we own.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(file),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (file, offset, len);
    }

    /// Gives back what [`map_zeroed`] mapped.
    ///
    /// # Safety
    /// `ptr` and `bytes` are a mapping [`map_zeroed`] made, no longer used.
    pub(super) unsafe fn unmap(ptr: NonNull<u8>, bytes: usize) {
        // SAFETY: per the contract.
        unsafe { libc::munmap(ptr.as_ptr().cast(), bytes) };
    }
}

#[cfg(windows)]
mod windows {
    use super::*;
    use std::sync::OnceLock;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    #[link(name = "kernel32")]
    unsafe extern "system" {
        fn GetCurrentThreadId() -> u32;
    }

    pub fn thread_id() -> u32 {
        // SAFETY: no preconditions.
        unsafe { GetCurrentThreadId() }
    }

    /// Thread names (`GetThreadDescription`) are left out: not every Windows has them.
    pub fn thread_name() -> String {
        String::new()
    }

    pub fn host_name() -> String {
        std::env::var("COMPUTERNAME").unwrap_or_else(|_| "unknown".into())
    }

    /// Nanoseconds from the first reading (QueryPerformanceCounter, through `Instant`).
    pub fn monotonic_ns() -> u64 {
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    pub fn realtime_ns() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }

    /// The file, emptied, opened so that others may read it but not write it; `None` if another
    /// process has it open for writing (a sharing violation). No byte-range lock: on Windows one
    /// would keep readers (`ggml-viz live`) out.
    pub fn open_locked(path: &Path) -> io::Result<Option<File>> {
        use std::os::windows::fs::OpenOptionsExt;
        const FILE_SHARE_READ: u32 = 1;
        const ERROR_SHARING_VIOLATION: i32 = 32;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .share_mode(FILE_SHARE_READ)
            .open(path);
        match file {
            Ok(file) => {
                file.set_len(0)?;
                Ok(Some(file))
            }
            Err(err) if err.raw_os_error() == Some(ERROR_SHARING_VIOLATION) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Nothing on Windows (see the Unix one); Windows writes in place, without the writer's thread.
    pub fn start_writeback(_file: &File, _offset: u64, _len: u64) {}

    /// Nothing on Windows (see the Unix one).
    pub fn uncache(_file: &File, _offset: u64, _len: u64) {}

    /// No signals on Windows: a write beyond a quota fails as an error.
    pub fn without_sigxfsz<T>(write: impl FnOnce() -> T) -> T {
        write()
    }

    /// Windows has no fork: nothing is ever inherited this way.
    pub fn descriptor(_file: &File) -> i64 {
        -1
    }

    pub fn close_in_child(_descriptor: i64) {}

    /// `at_exit` runs at process exit; Windows has no fork.
    pub fn install_process_handlers(at_exit: extern "C" fn(), _after_fork: extern "C" fn()) {
        unsafe extern "C" {
            fn atexit(f: extern "C" fn()) -> i32;
        }
        // SAFETY: the handler is an `extern "C"` function that never unwinds.
        unsafe { atexit(at_exit) };
    }

    /// Nothing to do here: the first writes to a page take its fault.
    pub fn populate_for_writing(_start: *const u8, _len: usize) {}

    /// No mapping of our own here: [`Zeroed`] takes the global allocator's zeroed memory.
    pub(super) fn map_zeroed(_bytes: usize) -> Option<NonNull<u8>> {
        None
    }

    /// Never called: [`map_zeroed`] maps nothing.
    ///
    /// # Safety
    /// None needed.
    pub(super) unsafe fn unmap(_ptr: NonNull<u8>, _bytes: usize) {}
}
