//! `ggml-viz`: inspect GGMLVIZ traces. Run `ggml-viz --help`.

mod diff;
mod dump;
mod export;
mod info;
#[cfg(windows)]
mod inject;
mod input;
mod live;
mod ops;
mod record;
mod report;
mod rpc;
mod say;
mod summary;
mod view;
#[cfg(target_os = "linux")]
mod vulkan_layer;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use say::Failure;

/// Where your GGML inference time goes: read and summarize GGMLVIZ v1 traces.
#[derive(Parser)]
#[command(name = "ggml-viz", version, about, long_about = None)]
// Examples first, after the one line of what it is.
#[command(
    help_template = "{about-with-newline}\n{usage-heading} {usage}\n\nExamples:\n  ggml-viz record -- llama-simple -m model.gguf -n 32 \"Hello\"\n  ggml-viz ops trace.ggmlviz\n  ggml-viz report trace.ggmlviz -o report.html\n  ggml-viz info trace.ggmlviz\n  ggml-viz dump --to jsonl trace.ggmlviz | head\n\n{all-args}{after-help}"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Record(record::RecordArgs),
    Info(info::InfoArgs),
    Ops(ops::OpsArgs),
    Summary(summary::SummaryArgs),
    Diff(diff::DiffArgs),
    Export(export::ExportArgs),
    Live(live::LiveArgs),
    Report(report::ReportArgs),
    Rpc(rpc::RpcArgs),
    Dump(dump::DumpArgs),
}

fn main() -> ExitCode {
    quiet_panics();
    shrinking_files_are_errors();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            // `record PROGRAM` without `--`: say what it takes.
            let mut args = std::env::args().skip(1);
            if err.kind() == clap::error::ErrorKind::UnknownArgument
                && args.next().as_deref() == Some("record")
                && !args.any(|a| a == "--")
            {
                eprintln!(
                    "ggml-viz: put `--` before the program to record: ggml-viz record [OPTIONS] -- PROGRAM [ARGS]"
                );
            }
            return if err.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Record(args) => record::run(args),
        Command::Info(args) => info::run(args).map(|()| 0),
        Command::Ops(args) => ops::run(args).map(|()| 0),
        Command::Summary(args) => summary::summary(args).map(|()| 0),
        Command::Diff(args) => diff::diff(args).map(|()| 0),
        Command::Export(args) => export::export(args).map(|()| 0),
        Command::Report(args) => report::run(args).map(|()| 0),
        Command::Live(args) => live::run(args).map(|()| 0),
        Command::Rpc(args) => rpc::run(args).map(|()| 0),
        Command::Dump(args) => dump::run(args).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Failure::Usage(msg)) => {
            eprintln!("ggml-viz: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Output(err)) if err.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(Failure::Output(err)) => {
            eprintln!("ggml-viz: cannot write output: {err}");
            ExitCode::from(2)
        }
        Err(Failure::Data(msg)) => {
            let _ = io::stdout().flush();
            eprintln!("ggml-viz: error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// A mapped file that another program truncates raises SIGBUS on the pages past its new end.
/// Files our hook is writing are read rather than mapped (see `input`); for anything else, the
/// signal becomes a clear error and exit status 2 instead of a crash.
fn shrinking_files_are_errors() {
    #[cfg(unix)]
    extern "C" fn on_sigbus(_: libc::c_int) {
        let msg = b"ggml-viz: error: the input file shrank while it was being read (truncated by another program?)\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(2);
        }
    }
    // SAFETY: installing a handler that only calls async-signal-safe functions.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGBUS, on_sigbus as *const () as libc::sighandler_t)
    };
}

/// A bug must still not show a Rust backtrace to a user: one line, then exit status 101.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("ggml-viz: internal error (please report it): {msg}");
    }));
}
