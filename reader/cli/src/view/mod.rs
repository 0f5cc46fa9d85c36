//! The live view, which the `live` command and `record --live` show: follow a trace while it is
//! written and refresh a view of it about once a second. Only new records are read on each poll
//! (the `Follower`); the figures come from [`figures::LiveStats`].

mod figures;

use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use figures::{LiveStats, Snapshot};
use ggml_viz_reader::{Follower, Layout};

use crate::say::Failure;
use crate::say::fmt_ns;

/// How often the file is polled for new records.
const POLL: Duration = Duration::from_millis(100);

/// How the view looks; shared by `live` and `record --live`.
#[derive(Args, Clone)]
pub struct ViewOpts {
    /// Seconds the rolling figures (p50/p99 of graph time, top ops) cover.
    #[arg(long, default_value_t = 10)]
    window: u32,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Op types listed.
    #[arg(long, default_value_t = 8)]
    top: usize,
    /// One plain line per refresh, even on a terminal (the default when stdout is not one).
    #[arg(long)]
    plain: bool,
}

impl ViewOpts {
    /// Whether the view redraws a terminal screen (and reads keys), rather than printing lines.
    pub fn interactive(&self) -> bool {
        !self.plain && io::stdout().is_terminal()
    }
}

/// How to know that no more records will come.
pub enum WriterGone<'a> {
    /// No process holds the trace's lock (and nothing new arrived).
    Unlocked,
    /// The recorded program, started at the given time, exited (`record --live`): the function
    /// says how, once it has.
    Exited(std::time::SystemTime, &'a mut dyn FnMut() -> Option<String>),
}

/// Why the view stopped.
pub enum Stop {
    Quit,
    WriterDone,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Follows `path` until `q`, Ctrl-C or the writer is done; prints a last summary line.
pub fn watch(
    path: &Path,
    opts: &ViewOpts,
    layout: Option<Layout>,
    mut gone: WriterGone<'_>,
) -> Result<Stop, Failure> {
    let interactive = opts.interactive();
    let mut keys = if interactive { Keys::open() } else { None };
    INTERRUPTED.store(false, Ordering::Relaxed);
    // SAFETY: the handler only stores to an atomic.
    let old = unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    // Under `record`, plain lines go to stderr: the program's stdout stays its own.
    let to_stderr = matches!(gone, WriterGone::Exited(..));
    let mut screen = Screen::new(path, opts, interactive, to_stderr);
    let result = follow(path, opts, layout, &mut gone, &mut keys, &mut screen);
    // SAFETY: restoring the disposition we replaced.
    unsafe { libc::signal(libc::SIGINT, old) };
    result
}

fn quit_requested(keys: &Option<Keys>) -> bool {
    INTERRUPTED.load(Ordering::Relaxed) || keys.as_ref().is_some_and(Keys::quit_pressed)
}

/// Waits one poll interval, on the keyboard when there is one (so that `q` acts at once).
fn pause(keys: &Option<Keys>) {
    match keys {
        Some(k) => k.wait(POLL),
        None => std::thread::sleep(POLL),
    }
}

fn follow(
    path: &Path,
    opts: &ViewOpts,
    layout: Option<Layout>,
    gone: &mut WriterGone<'_>,
    keys: &mut Option<Keys>,
    screen: &mut Screen,
) -> Result<Stop, Failure> {
    let mut exited: Option<String> = None;
    let writer_done = |gone: &mut WriterGone<'_>, exited: &mut Option<String>| match gone {
        WriterGone::Unlocked => !crate::input::being_written(path),
        WriterGone::Exited(_, check) => {
            if exited.is_none() {
                *exited = check();
            }
            exited.is_some()
        }
    };
    // The trace appears when the program first calls ggml; `record --live` waits for a file
    // written since the program started, so that one left by an earlier run is not taken for it.
    let mut last_draw = Instant::now();
    loop {
        // `live FILE` waits for the file however long it takes; `record --live` until the
        // program exits. Whether it had, before looking for the file: it may write and exit.
        let program_done = matches!(gone, WriterGone::Exited(..)) && writer_done(gone, &mut exited);
        let ready = match gone {
            // A writer creates the file before it locks it: an empty one nobody holds is one
            // that a writer is about to take (or that no trace was ever written to), not a
            // finished trace of nothing.
            WriterGone::Unlocked => std::fs::metadata(path)
                .is_ok_and(|m| m.len() > 0 || crate::input::being_written(path)),
            WriterGone::Exited(started, _) => std::fs::metadata(path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= *started),
        };
        if ready {
            break;
        }
        if quit_requested(keys) {
            *keys = None; // the terminal given back: plain lines follow
            screen.finish(
                "quit",
                None,
                &mut LiveStats::new(1),
                Instant::now(),
                opts.top,
            );
            return Ok(Stop::Quit);
        }
        if program_done {
            let why = exited.clone().unwrap_or_else(|| "no writer".into());
            *keys = None;
            eprintln!(
                "ggml-viz: {why}; no trace at {}: the program called no interposed ggml function (or tracing was off)",
                path.display()
            );
            return Ok(Stop::WriterDone);
        }
        if last_draw.elapsed().as_secs_f64() >= opts.interval {
            // `live FILE`: nothing starts the writer but the user.
            screen.waiting(matches!(gone, WriterGone::Unlocked).then_some(path));
            last_draw = Instant::now();
        }
        pause(keys);
    }

    let mut follower = Follower::open(path, layout)
        .map_err(|e| Failure::Data(format!("cannot open {}: {e}", path.display())))?;
    let mut stats = LiveStats::new((opts.window as f64 / opts.interval).ceil().max(1.0) as usize);
    let mut bucket_start = Instant::now();
    screen.draw(&stats.snapshot(opts.top), "following");
    loop {
        // Whether the writer was done before this poll: then the poll saw its last bytes.
        let done = writer_done(gone, &mut exited);
        let poll = follower
            .poll()
            .map_err(|e| Failure::Data(format!("cannot read {}: {e}", path.display())))?;
        let got = !poll.events.is_empty();
        for e in &poll.events {
            stats.add(e);
        }
        if let Some(d) = poll.damage {
            stats.damage = Some(d);
        }
        if std::fs::metadata(path).is_ok_and(|m| m.len() < follower.offset()) {
            *keys = None; // the terminal given back: plain lines follow
            screen.finish("stopped", None, &mut stats, bucket_start, opts.top);
            return Err(Failure::Data(format!(
                "{} shrank below the {} bytes already read: it was truncated or replaced by a new run",
                path.display(),
                follower.offset()
            )));
        }
        if bucket_start.elapsed().as_secs_f64() >= opts.interval {
            stats.tick(bucket_start.elapsed());
            bucket_start = Instant::now();
            let state = if exited.is_some() {
                "program exited"
            } else {
                "following"
            };
            screen.draw(&stats.snapshot(opts.top), state);
        }
        if stats.damage.as_ref().is_some_and(|d| !d.is_truncation()) {
            let d = stats.damage.clone().expect("checked");
            *keys = None; // the terminal given back: plain lines follow
            screen.finish(
                "stopped",
                exited.as_deref(),
                &mut stats,
                bucket_start,
                opts.top,
            );
            return Err(Failure::Data(format!("{}: {d}", path.display())));
        }
        if quit_requested(keys) {
            *keys = None; // the terminal given back: plain lines follow
            screen.finish(
                "quit",
                exited.as_deref(),
                &mut stats,
                bucket_start,
                opts.top,
            );
            return Ok(Stop::Quit);
        }
        if done && !got {
            let why = exited
                .clone()
                .unwrap_or_else(|| "the writer finished".into());
            stats.all_read();
            *keys = None; // the terminal given back: plain lines follow
            screen.finish(&why, None, &mut stats, bucket_start, opts.top);
            if follower.pending() > 0 {
                eprintln!(
                    "ggml-viz: warning: {}: the writer stopped in the middle of a record: {} byte(s) after byte offset {} are incomplete",
                    path.display(),
                    follower.pending(),
                    follower.offset()
                );
            }
            return Ok(Stop::WriterDone);
        }
        if !got {
            pause(keys);
        }
    }
}

/// The keyboard in raw mode (keys one at a time, no echo, Ctrl-C a key rather than a signal),
/// through crossterm: the same on every platform; restored on drop.
struct Keys;

impl Keys {
    fn open() -> Option<Keys> {
        if !io::stdin().is_terminal() {
            return None;
        }
        crossterm::terminal::enable_raw_mode().ok()?;
        Some(Keys)
    }

    /// Waits up to `timeout` for a key.
    fn wait(&self, timeout: Duration) {
        let _ = crossterm::event::poll(timeout);
    }

    /// Whether `q` or Ctrl-C was pressed since the last look (other input is dropped).
    fn quit_pressed(&self) -> bool {
        use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
        while crossterm::event::poll(Duration::ZERO).unwrap_or(false) {
            let Ok(Event::Key(key)) = crossterm::event::read() else {
                continue;
            };
            let ctrl_c =
                key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
            let q = matches!(key.code, KeyCode::Char('q' | 'Q'));
            if key.kind != KeyEventKind::Release && (q || ctrl_c) {
                return true;
            }
        }
        false
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// Where the view goes: a redrawn terminal screen, or one line per refresh.
struct Screen {
    name: String,
    window: u32,
    interactive: bool,
    to_stderr: bool,
    started: Instant,
    drawn: bool,
}

/// The three op types with the most time in the window, with their shares (`-`: none).
fn top_three(s: &Snapshot) -> String {
    let top: Vec<String> = s
        .top_ops
        .iter()
        .take(3)
        .map(|o| format!("{} {:.1}%", o.name, 100.0 * o.share))
        .collect();
    if top.is_empty() {
        "-".into()
    } else {
        top.join(", ")
    }
}

/// A batching server's figures, where the trace has its batches: `12 batches (3.0/s), 3.82
/// sequences per batch, token latency p50 649.005 µs p99 18.559 ms` (the rate `per_s`, the rest
/// over the window).
fn serving(s: &Snapshot, per_s: f64) -> Option<String> {
    (s.batches > 0).then(|| {
        format!(
            "{} batches ({per_s:.1}/s), {} sequences per batch, token latency p50 {} p99 {}",
            s.batches,
            s.sequences_per_batch
                .map_or("-".into(), |v| format!("{v:.2}")),
            opt_ns(s.p50_token_ns),
            opt_ns(s.p99_token_ns)
        )
    })
}

/// The ops as `info` counts them: `N ops`, and where a node is several op events (threads
/// mode: each worker thread's share of it is one), `N ops (M op spans)`; numbers as `fmt` has
/// them.
fn ops_and_spans(s: &Snapshot, fmt: fn(u64) -> String) -> String {
    if s.nodes > 0 && s.nodes < s.ops {
        format!("{} ops ({} op spans)", fmt(s.nodes), fmt(s.ops))
    } else {
        format!("{} ops", fmt(s.ops))
    }
}

fn opt_ns(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".into(), |n| fmt_ns(n as f64))
}

fn count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Screen {
    fn new(path: &Path, opts: &ViewOpts, interactive: bool, to_stderr: bool) -> Screen {
        Screen {
            name: path.display().to_string(),
            window: opts.window,
            interactive,
            to_stderr,
            started: Instant::now(),
            drawn: false,
        }
    }

    /// Waiting for the trace to appear; `how_to_start`: the file a recording would write, said
    /// with how to start one.
    fn waiting(&mut self, how_to_start: Option<&Path>) {
        let hint = how_to_start.map_or_else(String::new, |path| {
            format!(
                " (if no program is recording it: `ggml-viz record -o {} -- PROGRAM`)",
                path.display()
            )
        });
        if self.interactive {
            let mut out = io::stdout().lock();
            let _ = write!(
                out,
                "\x1b[H\x1b[2Jggml-viz live  {}\r\nwaiting for the trace to be written…   (q or Ctrl-C to quit)\r\n{hint}\r\n",
                self.name
            );
            let _ = out.flush();
        } else {
            let line = format!(
                "live {:>5.1}s waiting for {}{hint}",
                self.started.elapsed().as_secs_f64(),
                self.name
            );
            if self.to_stderr {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
        }
    }

    fn draw(&mut self, s: &Snapshot, state: &str) {
        // A closed output (a pager quit) ends nothing: the trace is still followed to its end.
        let _ = if self.interactive {
            let mut out = io::stdout().lock();
            self.draw_screen(&mut out, s, state)
                .and_then(|()| out.flush())
        } else if self.to_stderr {
            self.draw_line(&mut io::stderr().lock(), s, state)
        } else {
            let mut out = io::stdout().lock();
            self.draw_line(&mut out, s, state)
                .and_then(|()| out.flush())
        };
    }

    fn draw_line(&self, out: &mut impl Write, s: &Snapshot, state: &str) -> io::Result<()> {
        let top = top_three(s);
        let serving = serving(s, s.batches_per_s).map_or_else(String::new, |f| format!(" | {f}"));
        writeln!(
            out,
            "live {:>5.1}s {state}: graphs {} ({:.1}/s) latest {} p50 {} p99 {} | events {} ({:.0}/s) lost {}{serving} | top {}",
            self.started.elapsed().as_secs_f64(),
            s.graphs,
            s.graphs_per_s,
            opt_ns(s.latest_graph_ns),
            opt_ns(s.p50_graph_ns),
            opt_ns(s.p99_graph_ns),
            s.events,
            s.events_per_s,
            s.lost,
            top
        )
    }

    fn draw_screen(&mut self, out: &mut impl Write, s: &Snapshot, state: &str) -> io::Result<()> {
        // Home, then each line cleared to its end; the first draw clears the screen.
        if !self.drawn {
            write!(out, "\x1b[2J")?;
            self.drawn = true;
        }
        let window = s.window.as_secs_f64().min(self.window as f64);
        let mut lines = vec![
            format!(
                "ggml-viz live  {}  [{state}]{}",
                self.name,
                if state == "ended" {
                    ""
                } else {
                    "   q or Ctrl-C to quit"
                }
            ),
            String::new(),
            format!(
                "graph computes  {:>12}   {:>8.1}/s   latest {:>11}   p50 {:>11}   p99 {:>11}   (last {:.0} s: {})",
                count(s.graphs),
                s.graphs_per_s,
                opt_ns(s.latest_graph_ns),
                opt_ns(s.p50_graph_ns),
                opt_ns(s.p99_graph_ns),
                window,
                count(s.window_graphs)
            ),
            format!(
                "events          {:>12}   {:>8.0}/s   lost {}   {}",
                count(s.events),
                s.events_per_s,
                count(s.lost),
                ops_and_spans(s, count)
            ),
        ];
        if let Some(note) = &s.note {
            lines.push(format!("note: {note}"));
        }
        if s.batches > 0 {
            lines.push(format!(
                "batches         {:>12}   {:>8.1}/s   sequences/batch {}   token latency p50 {}   p99 {}   (last {:.0} s)",
                count(s.batches),
                s.batches_per_s,
                s.sequences_per_batch.map_or("-".into(), |v| format!("{v:.2}")),
                opt_ns(s.p50_token_ns),
                opt_ns(s.p99_token_ns),
                window
            ));
        }
        lines.extend([
            String::new(),
            format!(
                "top ops by node wall time (first thread's start to last thread's end), last {window:.0} s:"
            ),
        ]);
        if s.ops == 0 {
            lines.push("  (no op events: record with GGML_VIZ_OP_TIMING=1)".into());
        } else if s.top_ops.is_empty() {
            lines.push(
                "  (none yet: a graph compute's nodes are joined a refresh after it ends)".into(),
            );
        }
        for o in &s.top_ops {
            lines.push(format!(
                "  {:<20} {:>6.1}%   {:>11}   {:>10} nodes",
                o.name,
                100.0 * o.share,
                fmt_ns(o.total_ns as f64),
                count(o.count)
            ));
        }
        write!(out, "\x1b[H")?;
        for l in lines {
            write!(out, "{l}\x1b[K\r\n")?;
        }
        write!(out, "\x1b[J")
    }

    /// The end: the final screen on a terminal, and a last line on stderr (so that it stays after
    /// a redrawn screen and apart from the data) with the totals and the rolling figures of the
    /// last window, the bucket begun at `bucket_start` included.
    fn finish(
        &mut self,
        why: &str,
        exited: Option<&str>,
        stats: &mut LiveStats,
        bucket_start: Instant,
        top: usize,
    ) {
        stats.tick(bucket_start.elapsed());
        let s = &stats.snapshot(top);
        if self.interactive {
            // The screen stays as the last thing seen: with the final totals.
            self.draw(s, "ended");
        }
        let why = exited.map_or_else(|| why.to_string(), |e| format!("{why} ({e})"));
        let top = top_three(s);
        // Over the trace's own time: a trace read at once, after its program ended, covers
        // seconds of it in a moment of the view's.
        let serving =
            serving(s, s.window_batches_per_s).map_or_else(String::new, |f| format!("; {f}"));
        eprintln!(
            "ggml-viz: live view ended: {why}; {} events, {} graph computes, {}, {} lost; last {} of the trace: graph p50 {} p99 {}, top ops {}{serving}",
            s.events,
            s.graphs,
            ops_and_spans(s, |n| n.to_string()),
            s.lost,
            fmt_ns(s.window_trace_ns as f64),
            opt_ns(s.p50_graph_ns),
            opt_ns(s.p99_graph_ns),
            top
        );
        // Under `record --live` (lines to stderr), the recording's own summary says it.
        if let Some(note) = s.note.as_ref().filter(|_| !self.to_stderr) {
            eprintln!("ggml-viz: note: {note}");
        }
    }
}
