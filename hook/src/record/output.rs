//! The trace file's writes, done by a thread of their own, so that a write the disk holds up
//! (page-cache writeback, a journal commit: tens of milliseconds now and then, measured) never
//! keeps the flusher from draining the rings. The flusher hands over each encoded buffer; a
//! bounded queue lets it get ahead of the disk by [`QUEUED`] buffers, then waits (and the rings,
//! if they fill meanwhile, drop and count). Where no thread can be started, and on Windows
//! (whose exit stops every other thread before the exit handlers run: a thread holding the last
//! buffers would never write them), writes are made in place.
//!
//! The thread also keeps the trace's share of the OS's page cache small ([`CachedTail`]).

use std::fs::File;
use std::io::{self, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use crate::base::os;

/// Buffers the flusher may be ahead of the disk by.
const QUEUED: usize = 16;
/// The trace's last bytes that its pages stay cached for (what `ggml-viz live` reads next).
const KEEP_CACHED: u64 = 32 << 20;
/// How long the last flush waits for the writes before it.
const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

enum Job {
    Write(Vec<u8>),
    /// Everything before is written: answer on the channel.
    Sync(SyncSender<()>),
}

pub struct Output {
    to_thread: Option<SyncSender<Job>>,
    /// Emptied buffers coming back from the thread, for reuse.
    spare: Option<Receiver<Vec<u8>>>,
    /// Where no thread runs: the file itself.
    direct: Option<File>,
    /// The first write error, set by whoever made the write.
    failed: Arc<Mutex<Option<io::Error>>>,
}

impl Output {
    pub fn new(file: File) -> Output {
        let failed = Arc::new(Mutex::new(None));
        let (to_thread, jobs) = sync_channel::<Job>(QUEUED);
        let (give_back, spare) = sync_channel::<Vec<u8>>(QUEUED);
        let thread_failed = failed.clone();
        // The file is moved to the thread only if it starts.
        let file = Arc::new(Mutex::new(Some(file)));
        let thread_file = file.clone();
        let spawned = if cfg!(windows) {
            Err(io::Error::from(io::ErrorKind::Unsupported))
        } else {
            std::thread::Builder::new()
                .name("ggml-viz-write".into())
                .spawn(move || {
                    let Some(mut file) = thread_file
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take()
                    else {
                        return;
                    };
                    write_jobs(&mut file, jobs, give_back, &thread_failed);
                })
        };
        match spawned {
            Ok(_) => Output {
                to_thread: Some(to_thread),
                spare: Some(spare),
                direct: None,
                failed,
            },
            Err(_) => Output {
                to_thread: None,
                spare: None,
                direct: file.lock().unwrap_or_else(PoisonError::into_inner).take(),
                failed,
            },
        }
    }

    /// An empty buffer, one the thread gave back when there is one, else a new one of
    /// `capacity` bytes (the size of the last one handed over: grown from nothing instead, a
    /// buffer is copied a dozen times on its way to that size).
    pub fn buffer(&self, capacity: usize) -> Vec<u8> {
        self.spare
            .as_ref()
            .and_then(|s| s.try_recv().ok())
            .unwrap_or_else(|| Vec::with_capacity(capacity))
    }

    /// Queues `buf` to be written after what was queued before; the first error of an earlier
    /// write, if any (then nothing more is written).
    pub fn write(&mut self, buf: Vec<u8>) -> io::Result<()> {
        self.error()?;
        match (&self.to_thread, &mut self.direct) {
            (Some(to_thread), _) => {
                if to_thread.send(Job::Write(buf)).is_err() {
                    return Err(io::Error::other("the trace's writer thread is gone"));
                }
                Ok(())
            }
            (None, Some(file)) => {
                let written = os::without_sigxfsz(|| file.write_all(&buf));
                if let Err(err) = &written {
                    self.set_error(copy(err));
                }
                written
            }
            (None, None) => Err(io::Error::other("the trace file is gone")),
        }
    }

    /// Waits until everything queued is written (at most [`SYNC_WAIT`]: a disk that stalls
    /// longer must not hang the host's exit); the first error, if any.
    pub fn sync(&mut self) -> io::Result<()> {
        if let Some(to_thread) = &self.to_thread {
            let (done, wait) = sync_channel(1);
            if to_thread.send(Job::Sync(done)).is_ok() && wait.recv_timeout(SYNC_WAIT).is_err() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the disk took too long to take the trace's last writes",
                ));
            }
        }
        self.error()
    }

    fn error(&self) -> io::Result<()> {
        match &*self.failed.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(err) => Err(copy(err)),
            None => Ok(()),
        }
    }

    fn set_error(&self, err: io::Error) {
        let mut failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
        failed.get_or_insert(err);
    }
}

/// The same error again (io::Error is not Clone): the OS error where there is one.
fn copy(err: &io::Error) -> io::Error {
    err.raw_os_error().map_or_else(
        || io::Error::new(err.kind(), err.to_string()),
        io::Error::from_raw_os_error,
    )
}

/// The writer thread: writes each buffer in order and gives it back; after an error, writes
/// nothing more.
fn write_jobs(
    file: &mut File,
    jobs: Receiver<Job>,
    give_back: SyncSender<Vec<u8>>,
    failed: &Mutex<Option<io::Error>>,
) {
    let mut ok = true;
    let mut cached = CachedTail::at(file);
    for job in jobs {
        match job {
            Job::Write(mut buf) => {
                if ok && let Err(err) = os::without_sigxfsz(|| file.write_all(&buf)) {
                    ok = false;
                    failed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get_or_insert(err);
                }
                if ok {
                    cached.written(file, buf.len() as u64);
                }
                buf.clear();
                let _ = give_back.try_send(buf);
            }
            Job::Sync(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// The trace file's pages in the page cache: each write is sent to the disk at once, and the
/// pages more than [`KEEP_CACHED`] bytes behind the end leave the cache once they are on the
/// disk (Linux; elsewhere the OS keeps them as it sees fit). A trace of gigabytes then neither
/// pushes the host's own files (its model) out of memory nor takes a fresh page for every 4 KiB
/// it writes: the kernel reuses the ones let go of. Measured on this project's 2-core VM, where
/// a page the guest has not touched for a while is slow to take (the fourth 400 MB file written
/// in a row took 0.71 s of system time, the first three 0.07 s each): `llama-bench -t 2 -n 768`
/// on the 64x32 model with threads op timing (a 300 MB trace) took 0.35 s of system time and ran
/// at 330 tokens/s, and with this 0.19 s and 360 tokens/s (no hook: 402; medians of 6 rounds).
/// Nothing waits for the disk to be done: a page not yet written back when its turn comes stays
/// cached (as every page did before). Starting the writes can wait for a busy disk's queue (on
/// this VM at most 4.4 ms a call over the producer bench's 1,670 calls, `strace -T`); the writes
/// themselves took up to 28 ms a call there, before and after.
struct CachedTail {
    /// Where the next write lands.
    end: u64,
    /// The pages before this were let go of.
    let_go: u64,
}

impl CachedTail {
    /// The file's pages, written up to its position now (the header, written before the thread
    /// took the file).
    fn at(file: &mut File) -> CachedTail {
        let end = io::Seek::stream_position(file).unwrap_or(0);
        CachedTail { end, let_go: 0 }
    }

    /// `len` more bytes were written at the end.
    fn written(&mut self, file: &File, len: u64) {
        os::start_writeback(file, self.end, len);
        self.end += len;
        // Whole pages only: the page the cached part begins in stays.
        let until = self.end.saturating_sub(KEEP_CACHED) & !(PAGE - 1);
        if until > self.let_go {
            os::uncache(file, self.let_go, until - self.let_go);
            self.let_go = until;
        }
    }
}

/// The page size the cached tail is rounded to (a larger one rounds it within its own pages).
const PAGE: u64 = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_in_order_and_sync_waits_for_them() {
        let path = std::env::temp_dir().join(format!("ggml-viz-output-{}", std::process::id()));
        let mut out = Output::new(File::create(&path).unwrap());
        for part in [&b"one "[..], b"two ", b"three"] {
            let mut buf = out.buffer(16);
            buf.extend_from_slice(part);
            out.write(buf).unwrap();
        }
        out.sync().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one two three");
        std::fs::remove_file(path).unwrap();
    }

    /// The bytes of the file at `path` that are in the page cache (`mincore` of a mapping).
    #[cfg(target_os = "linux")]
    fn cached_bytes(path: &std::path::Path) -> u64 {
        use std::os::fd::AsRawFd;
        let file = File::open(path).unwrap();
        let len = file.metadata().unwrap().len() as usize;
        let pages = len.div_ceil(PAGE as usize);
        let mut resident = vec![0u8; pages];
        // SAFETY: a read-only shared mapping of a file we opened, `len` bytes long; `mincore`
        // writes one byte per page of it into `resident`, which has that many; the mapping is
        // unmapped before the file is closed and never read through.
        unsafe {
            let map = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(map, libc::MAP_FAILED);
            assert_eq!(libc::mincore(map, len, resident.as_mut_ptr()), 0);
            libc::munmap(map, len);
        }
        resident.iter().filter(|&&r| r & 1 == 1).count() as u64 * PAGE
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_the_traces_last_pages_stay_cached_once_on_the_disk() {
        // On the disk (tmpfs's pages are the file itself): the workspace's target folder.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("ggml-viz-cached-tail-{}", std::process::id()));
        let mut out = Output::new(File::create(&path).unwrap());
        let disk = File::open(&path).unwrap();
        let chunk = 2 << 20;
        let chunks = 3 * KEEP_CACHED / chunk;
        for i in 0..chunks {
            let mut buf = out.buffer(chunk as usize);
            buf.resize(chunk as usize, i as u8);
            out.write(buf).unwrap();
            // Written by the thread; then the writes to the disk it started are waited for
            // (none is started here), so that the pages the next write lets go of are clean.
            out.sync().unwrap();
            // SAFETY: a plain system call on an open descriptor.
            let waited = unsafe {
                libc::sync_file_range(
                    std::os::fd::AsRawFd::as_raw_fd(&disk),
                    0,
                    0,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE,
                )
            };
            assert_eq!(waited, 0);
        }
        let written = chunks * chunk;
        let cached = cached_bytes(&path);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(bytes.len() as u64, written);
        for i in 0..chunks {
            let at = (i * chunk) as usize;
            assert!(
                bytes[at..at + chunk as usize].iter().all(|&b| b == i as u8),
                "chunk {i}"
            );
        }
        assert!(
            cached <= KEEP_CACHED,
            "{cached} of {written} bytes written to {} still cached (at most the last {KEEP_CACHED})",
            path.display()
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_write_is_said_by_the_next_call() {
        // Every write to /dev/full fails with ENOSPC.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let mut out = Output::new(full);
        out.write(b"lost".to_vec()).unwrap();
        let err = out.sync().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert!(
            out.write(b"more".to_vec()).is_err(),
            "nothing is written after an error"
        );
    }
}
