//! The trace file's writes, done by a thread of their own, so that a write the disk holds up
//! (page-cache writeback, a journal commit: tens of milliseconds now and then, measured) never
//! keeps the flusher from draining the rings. The flusher hands over each encoded buffer; a
//! bounded queue lets it get ahead of the disk by [`QUEUED`] buffers, then waits (and the rings,
//! if they fill meanwhile, drop and count). Where no thread can be started, and on Windows
//! (whose exit stops every other thread before the exit handlers run: a thread holding the last
//! buffers would never write them), writes are made in place.

use std::fs::File;
use std::io::{self, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};

use crate::base::os;

/// Buffers the flusher may be ahead of the disk by.
const QUEUED: usize = 16;
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
                buf.clear();
                let _ = give_back.try_send(buf);
            }
            Job::Sync(done) => {
                let _ = done.send(());
            }
        }
    }
}

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
