//! Running things in a test: scratch directories, commands and their output, bounded waits,
//! FIFOs, tmux sessions.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

/// `attempt`'s result, run again (at most `tries` times in all) until `whole` accepts it: for
/// llama.cpp programs whose logger thread may not have written their last lines when they exit
/// (llama.cpp #22142). The last result is returned either way: the caller asserts it whole.
pub fn until_whole<T>(tries: u32, mut attempt: impl FnMut() -> T, whole: impl Fn(&T) -> bool) -> T {
    let mut result = attempt();
    for _ in 1..tries {
        if whole(&result) {
            break;
        }
        result = attempt();
    }
    result
}

/// `attempt`'s result, run again every 100 ms until `done` accepts it or `limit` has passed: for
/// what a program writes in its own time (a server's trace, written as its client leaves). The
/// last result is returned either way: the caller asserts it done.
pub fn until_within<T>(
    limit: std::time::Duration,
    mut attempt: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let result = attempt();
        if done(&result) || std::time::Instant::now() >= deadline {
            return result;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Prefix of the scratch directories, followed by the test process's id.
const SCRATCH: &str = "ggml-viz-e2e-";

/// A fresh, empty directory for one test. Those of earlier test processes that have ended are
/// removed on the first call (a test leaves its files for a failure to be looked at, until the
/// next run).
pub fn scratch(name: &str) -> PathBuf {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(remove_ended_scratch);
    let dir = std::env::temp_dir().join(format!("{SCRATCH}{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Removes the scratch directories of test processes no longer running (`/proc/<pid>` gone).
fn remove_ended_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // Where there is no /proc (not Linux), nothing is known to have ended.
        let ended = cfg!(target_os = "linux") && !Path::new(&format!("/proc/{pid}")).exists();
        if pid != std::process::id() && ended {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

pub fn run(mut cmd: Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `tmux` with `args`, its stdout; it must succeed (a screen read from a server that is gone
/// would be empty, and prove nothing of what it lacks).
pub fn tmux(args: &[&str]) -> String {
    let o = run({
        let mut c = Command::new("tmux");
        c.args(args);
        c
    });
    assert!(
        o.status.success(),
        "tmux {args:?}: {}",
        text(&o.stderr).trim()
    );
    text(&o.stdout)
}

/// A tmux server at `socket` running `sh -c script` in a detached terminal of `cols` x `rows`.
pub fn tmux_session(socket: &str, cols: u32, rows: u32, script: &str) {
    let (cols, rows) = (cols.to_string(), rows.to_string());
    tmux(&[
        "-S",
        socket,
        "new-session",
        "-d",
        "-x",
        &cols,
        "-y",
        &rows,
        "sh",
        "-c",
        script,
    ]);
}

/// Waits for `path` to hold a complete line; its text.
pub fn wait_for_file(path: &Path, timeout: std::time::Duration) -> String {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{} did not appear", path.display());
}

/// A FIFO at `path` (`mkfifo`).
pub fn mkfifo(path: &Path) {
    let made = run({
        let mut c = Command::new("mkfifo");
        c.arg(path);
        c
    });
    assert!(made.status.success(), "{}", text(&made.stderr));
}

/// Runs `cmd` to its end, its output captured; one still running after `limit` is killed and
/// fails the test (`what` says what it hung on): a hang guard, not a timing.
pub fn run_within(mut cmd: Command, limit: std::time::Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("still running after {limit:?}: {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
