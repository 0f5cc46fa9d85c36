//! The one ggml-viz configuration, shared by the hook and the CLI.
//!
//! Sources, highest precedence first:
//! 1. overrides: the CLI's flags (`ggml-viz record --max-events …`), which reach a preloaded hook
//!    through the environment variable [`OVERRIDES_ENV`] (a JSON object of setting names);
//! 2. the JSON file named by `--config FILE` or `GGML_VIZ_CONFIG`;
//! 3. the `GGML_VIZ_*` environment variables;
//! 4. the defaults.
//!
//! A bad value is an error that names the setting and where it came from.
//!
//! ```
//! use ggml_viz_config::{Config, Sources};
//!
//! let env = [("GGML_VIZ_MAX_EVENTS", "5000"), ("GGML_VIZ_BUFFER_SIZE", "1024")];
//! let config = Config::load(&Sources::from_pairs(env)).unwrap();
//! assert_eq!(config.max_events, 5000);
//! assert_eq!(config.buffer_size, 1024);
//!
//! let bad = Config::load(&Sources::from_pairs([("GGML_VIZ_BUFFER_SIZE", "1000")])).unwrap_err();
//! assert!(bad.to_string().contains("GGML_VIZ_BUFFER_SIZE"));
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::PathBuf;

use serde_json::{Map, Value};

mod settings;
mod sources;

pub use settings::{CONFIG_FILE_ENV, OVERRIDES_ENV};
use settings::{SETTINGS, read_variables};
pub use sources::Sources;

/// The largest ring a thread may get, in events (768 MiB per thread).
pub const MAX_BUFFER_SIZE: u64 = 1 << 24;

/// How the hook times the nodes of a graph (`GGML_VIZ_OP_TIMING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpTiming {
    /// `threads` where the CPU backend's per-op functions can be reached, else `sched`.
    Auto,
    /// Each worker thread's call of a CPU per-op function is a span; barrier waits too. Nothing
    /// of the run changes.
    Threads,
    /// The scheduler's eval callback: every node computed and synchronized on its own (ggml's
    /// only way for non-CPU backends; it turns op fusion off and adds a sync per node).
    Sched,
    /// Graph times only.
    Off,
}

impl OpTiming {
    /// The setting's spelling, as `to_json` writes it and `parse` reads it.
    pub fn name(self) -> &'static str {
        match self {
            OpTiming::Auto => "auto",
            OpTiming::Threads => "threads",
            OpTiming::Sched => "sched",
            OpTiming::Off => "off",
        }
    }

    /// `auto|threads|sched|off`; `1`/`true` mean `auto` and `0`/`false` mean `off`, as before
    /// there were modes.
    fn parse(v: &Value) -> Result<OpTiming, String> {
        if let Value::String(s) = v {
            match s.trim().to_ascii_lowercase().as_str() {
                "auto" => return Ok(OpTiming::Auto),
                "threads" => return Ok(OpTiming::Threads),
                "sched" => return Ok(OpTiming::Sched),
                _ => {}
            }
        }
        match boolean(v) {
            Ok(true) => Ok(OpTiming::Auto),
            Ok(false) => Ok(OpTiming::Off),
            Err(_) => Err(format!(
                "expected auto, threads, sched or off (1 = auto, 0 = off), got {v}"
            )),
        }
    }
}

/// Every setting, with its value in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Trace path; `%p` becomes the pid, `%h` the host name.
    pub output: String,
    pub verbose: bool,
    /// Preloaded but inert: every call goes straight to ggml.
    pub disable: bool,
    /// Events recorded at most; later ones are counted, not recorded.
    pub max_events: u64,
    /// How nodes are timed (`GGML_VIZ_OP_TIMING`).
    pub op_timing: OpTiming,
    /// With op timing: time the ops of one recorded graph compute in this many.
    pub op_sample: u64,
    pub memory_tracking: bool,
    pub thread_tracking: bool,
    pub tensor_names: bool,
    /// Milliseconds between flushes of the per-thread rings.
    pub flush_interval_ms: u64,
    /// Events per thread ring; a power of two, at most [`MAX_BUFFER_SIZE`].
    pub buffer_size: u64,
    /// Graph computes to skip before recording (warm-up).
    pub skip_graphs: u64,
    /// Graph computes to record after the skipped ones; 0 means no limit.
    pub max_graphs: u64,
    /// Event layout the hook writes: `packed` (the spec's) or `padded` (the C++ tool's).
    pub layout: String,
    /// The host's memory bandwidth, MB/s, as `ggml-viz record` measured it before starting the
    /// program (0: not measured); kept in the trace for the ops' share of it.
    pub memory_bandwidth_mb_s: u64,
    /// Where the CUPTI capture of a CUDA run goes (empty: none): the kernels, copies and sets
    /// CUPTI timed, the launches and CUDA graph nodes behind them, and the ggml graphs' nodes,
    /// as JSON lines, for working out which node ran which kernel.
    pub cupti_capture: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            output: "ggml-viz-%p.ggmlviz".into(),
            verbose: false,
            disable: false,
            max_events: 10_000_000,
            op_timing: OpTiming::Auto,
            op_sample: 1,
            memory_tracking: false,
            thread_tracking: false,
            tensor_names: true,
            flush_interval_ms: 100,
            buffer_size: 65536,
            skip_graphs: 0,
            max_graphs: 0,
            layout: "packed".into(),
            memory_bandwidth_mb_s: 0,
            cupti_capture: String::new(),
        }
    }
}

/// Where a value came from, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    Default,
    Env(&'static str),
    File(PathBuf),
    Override,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => f.write_str("the defaults"),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::File(path) => write!(f, "config file {}", path.display()),
            Origin::Override => write!(f, "command-line flag (via {OVERRIDES_ENV})"),
        }
    }
}

/// A configuration that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting, as named in the JSON (`buffer_size`), or the file.
    pub setting: String,
    pub origin: Origin,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "setting `{}` from {}: {}",
            self.setting, self.origin, self.problem
        )
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Resolves every setting from `sources` by precedence.
    pub fn load(sources: &Sources) -> Result<Config, ConfigError> {
        // A variable of ours that is not text, where one is read (an unknown one never is).
        let read = |var: &String| read_variables().find(|&(_, env)| env == var.as_str());
        if let Some((setting, env)) = sources.not_text.iter().find_map(read) {
            return Err(ConfigError {
                setting: setting.into(),
                origin: Origin::Env(env),
                problem: "not UTF-8 text".into(),
            });
        }
        let mut values: BTreeMap<&'static str, (Value, Origin)> = BTreeMap::new();
        for s in SETTINGS {
            if let Some(raw) = sources.env.get(s.env) {
                // Environment values are text; the setters parse text and JSON alike.
                values.insert(
                    s.key,
                    (Value::String(raw.trim().to_string()), Origin::Env(s.env)),
                );
            }
        }
        if let Some(path) = &sources.config_file {
            let file = read_config_file(path)?;
            for s in SETTINGS {
                if let Some(v) = lookup(&file, s.file_path).or_else(|| file.get(s.key)) {
                    values.insert(s.key, (v.clone(), Origin::File(path.clone())));
                }
            }
        }
        let overrides = match sources.env.get(OVERRIDES_ENV) {
            Some(raw) => parse_object(raw).map_err(|problem| ConfigError {
                setting: OVERRIDES_ENV.into(),
                origin: Origin::Override,
                problem,
            })?,
            None => Map::new(),
        };
        for (key, v) in overrides.iter().chain(&sources.overrides) {
            let Some(s) = SETTINGS.iter().find(|s| s.key == key) else {
                return Err(ConfigError {
                    setting: key.clone(),
                    origin: Origin::Override,
                    problem: "unknown setting".into(),
                });
            };
            values.insert(s.key, (v.clone(), Origin::Override));
        }

        let mut config = Config::default();
        for (key, (value, origin)) in values {
            config.set(key, &value).map_err(|problem| ConfigError {
                setting: key.into(),
                origin,
                problem,
            })?;
        }
        Ok(config)
    }

    fn set(&mut self, key: &str, v: &Value) -> Result<(), String> {
        match key {
            "output" => self.output = string(v)?,
            "verbose" => self.verbose = boolean(v)?,
            "disable" => self.disable = boolean(v)?,
            "max_events" => self.max_events = integer(v)?,
            "op_timing" => self.op_timing = OpTiming::parse(v)?,
            "op_sample" => {
                self.op_sample = integer(v)?;
                if self.op_sample == 0 {
                    return Err("must be at least 1 (1 times every graph compute's ops)".into());
                }
            }
            "memory_tracking" => self.memory_tracking = boolean(v)?,
            "thread_tracking" => self.thread_tracking = boolean(v)?,
            "tensor_names" => self.tensor_names = boolean(v)?,
            "flush_interval_ms" => {
                self.flush_interval_ms = integer(v)?;
                if self.flush_interval_ms == 0 {
                    return Err("must be at least 1 (milliseconds)".into());
                }
            }
            "buffer_size" => {
                let n = integer(v)?;
                if !n.is_power_of_two() || n < 2 {
                    return Err(format!(
                        "{n} is not a power of two (try {})",
                        n.max(2).next_power_of_two()
                    ));
                }
                if n > MAX_BUFFER_SIZE {
                    return Err(format!(
                        "{n} events is more than the {MAX_BUFFER_SIZE} a thread's ring may hold \
                         (each event takes 48 bytes, in every recording thread)"
                    ));
                }
                self.buffer_size = n;
            }
            "skip_graphs" => self.skip_graphs = integer(v)?,
            "max_graphs" => self.max_graphs = integer(v)?,
            "layout" => {
                self.layout = string(v)?;
                if !matches!(self.layout.as_str(), "packed" | "padded") {
                    return Err(format!(
                        "{:?} is not a layout: use packed or padded",
                        self.layout
                    ));
                }
            }
            "memory_bandwidth_mb_s" => self.memory_bandwidth_mb_s = integer(v)?,
            // Empty: no capture (the default).
            "cupti_capture" => {
                self.cupti_capture = match v {
                    Value::String(s) => s.clone(),
                    other => return Err(format!("expected a file name, got {other}")),
                }
            }
            other => unreachable!("setting {other} has no field"),
        }
        Ok(())
    }

    /// Every setting by its key: what the trace's metadata record stores, and the format of
    /// [`OVERRIDES_ENV`].
    pub fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("output".into(), self.output.clone().into());
        m.insert("verbose".into(), self.verbose.into());
        m.insert("disable".into(), self.disable.into());
        m.insert("max_events".into(), self.max_events.into());
        m.insert("op_timing".into(), self.op_timing.name().into());
        m.insert("op_sample".into(), self.op_sample.into());
        m.insert("memory_tracking".into(), self.memory_tracking.into());
        m.insert("thread_tracking".into(), self.thread_tracking.into());
        m.insert("tensor_names".into(), self.tensor_names.into());
        m.insert("flush_interval_ms".into(), self.flush_interval_ms.into());
        m.insert("buffer_size".into(), self.buffer_size.into());
        m.insert("skip_graphs".into(), self.skip_graphs.into());
        m.insert("max_graphs".into(), self.max_graphs.into());
        m.insert("layout".into(), self.layout.clone().into());
        m.insert(
            "memory_bandwidth_mb_s".into(),
            self.memory_bandwidth_mb_s.into(),
        );
        m.insert("cupti_capture".into(), self.cupti_capture.clone().into());
        m
    }
}

fn read_config_file(path: &PathBuf) -> Result<Map<String, Value>, ConfigError> {
    let err = |problem: String| ConfigError {
        setting: "config file".into(),
        origin: Origin::File(path.clone()),
        problem,
    };
    // Looked at before it is opened: a FIFO would block the read (at a host's start, for the
    // hook), a device or `/dev/stdin` would read what is not ours to read.
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(err("it is not a regular file".into()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(err(format!(
            "it is {} bytes; a configuration file is at most {MAX_CONFIG_BYTES}",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| err(format!("cannot read it: {e}")))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(err(format!(
            "it grew past {MAX_CONFIG_BYTES} bytes while read"
        )));
    }
    parse_object(&text).map_err(err)
}

/// The largest configuration file read (a few settings take a few hundred bytes).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

fn parse_object(text: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("must be a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}

fn lookup<'a>(root: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(root.get(*first)?, |v, key| v.get(key))
}

fn string(v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        other => Err(format!("expected a non-empty string, got {other}")),
    }
}

fn boolean(v: &Value) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
        Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err(format!("expected 0 or 1 (or true/false), got {s:?}")),
        },
        other => Err(format!("expected 0 or 1 (or true/false), got {other}")),
    }
}

fn integer(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("expected a non-negative integer, got {n}")),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| format!("expected a non-negative integer, got {s:?}")),
        other => Err(format!("expected a non-negative integer, got {other}")),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn write_temp(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("ggml-viz-config-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Only a regular file of at most [`MAX_CONFIG_BYTES`] is read: a directory (or a FIFO,
    /// which would block the read) and a larger file are refused, each with the reason.
    #[test]
    fn a_config_file_is_a_small_regular_file() {
        let dir = std::env::temp_dir();
        let big = write_temp("big.json", &" ".repeat(MAX_CONFIG_BYTES as usize + 1));
        for (path, why) in [
            (dir, "not a regular file"),
            (big, "a configuration file is at most"),
        ] {
            let mut sources = Sources::from_pairs::<&str, &str>([]);
            sources.config_file = Some(path.clone());
            let e = Config::load(&sources).unwrap_err();
            assert!(e.to_string().contains(why), "{}: {e}", path.display());
        }
    }

    #[test]
    fn precedence_is_override_then_file_then_env_then_default() {
        let file = write_temp(
            "prec.json",
            r#"{"instrumentation": {"max_events": 200, "output_file": "file.ggmlviz"}}"#,
        );
        let mut sources = Sources::from_pairs([
            ("GGML_VIZ_MAX_EVENTS", "100"),
            ("GGML_VIZ_OUTPUT", "env.ggmlviz"),
            ("GGML_VIZ_FLUSH_INTERVAL", "7"),
            (OVERRIDES_ENV, r#"{"output": "flag.ggmlviz"}"#),
        ]);
        sources.config_file = Some(file.clone());
        let c = Config::load(&sources).unwrap();
        assert_eq!(c.output, "flag.ggmlviz");
        assert_eq!(c.max_events, 200);
        assert_eq!(c.flush_interval_ms, 7);
        assert_eq!(c.buffer_size, Config::default().buffer_size);
        std::fs::remove_file(file).unwrap();
    }

    #[test]
    fn variables_that_are_not_text_stop_nothing_but_our_own_setting() {
        use std::os::unix::ffi::OsStringExt;
        let var = |k: &str, v: &[u8]| (OsString::from(k), OsString::from_vec(v.to_vec()));
        // The host's own variable, not UTF-8: ignored; ours still read.
        let sources = Sources::from_os_pairs([
            var("SOME_PATH", b"/srv/caf\xe9"),
            var("GGML_VIZ_FLUSH_INTERVAL", b"7"),
        ]);
        assert_eq!(Config::load(&sources).unwrap().flush_interval_ms, 7);
        // One of ours, not UTF-8: said, naming it.
        let sources = Sources::from_os_pairs([var("GGML_VIZ_OUTPUT", b"/srv/caf\xe9.ggmlviz")]);
        let err = Config::load(&sources).unwrap_err();
        assert_eq!(err.setting, "output");
        assert_eq!(err.origin, Origin::Env("GGML_VIZ_OUTPUT"));
        assert!(err.to_string().contains("not UTF-8 text"), "{err}");
        // An unknown one of ours is never read, text or not.
        let sources = Sources::from_os_pairs([var("GGML_VIZ_NO_SUCH", b"\xff")]);
        assert!(Config::load(&sources).is_ok());
    }

    #[test]
    fn a_variable_like_a_setting_is_named_with_the_setting() {
        let sources = Sources::from_pairs([
            ("GGML_VIZ_FLUSH_INTERVAL_MS", "5"),
            ("GGML_VIZ_OP_TIMNG", "threads"),
            ("GGML_VIZ_OUTPUTS", "t.ggmlviz"),
            ("GGML_VIZ_OUTPUT", "t.ggmlviz"),
            ("GGML_VIZ_CONFG", "c.json"),
            ("GGML_VIZ_BUFER_SIZ", "4096"),
            // Three edits from GGML_VIZ_LAYOUT: too far to guess.
            ("GGML_VIZ_LAYER", "packed"),
            // What this project's own scripts set: no setting's name.
            ("GGML_VIZ_LLAMA_BUILD", "/b"),
            ("GGML_VIZ_LLAMA_THREADPOOL_BUILD", "/b"),
            ("GGML_VIZ_FAULT", "resolve"),
            ("GGML_VIZ_BENCH_EVENTS", "10"),
            ("GGML_VIZ_BENCH_SECONDS", "1"),
            ("GGML_VIZ_CACHE", "/c"),
            ("GGML_VIZ_HOOK", "/h.so"),
            ("GGML_VIZ_MACOS_OBJECTS", "/o"),
            ("GGML_VIZ_WINE_PREFIX", "/w"),
            ("GGML_VIZ_WINDOWS_TARGET", "/t"),
            ("GGML_VIZ_", ""),
        ]);
        assert_eq!(
            sources.misspelt(),
            [
                ("GGML_VIZ_BUFER_SIZ", "GGML_VIZ_BUFFER_SIZE"),
                ("GGML_VIZ_CONFG", "GGML_VIZ_CONFIG"),
                ("GGML_VIZ_FLUSH_INTERVAL_MS", "GGML_VIZ_FLUSH_INTERVAL"),
                ("GGML_VIZ_OP_TIMNG", "GGML_VIZ_OP_TIMING"),
                ("GGML_VIZ_OUTPUTS", "GGML_VIZ_OUTPUT"),
            ]
        );
    }

    #[test]
    fn errors_name_the_setting_and_the_source() {
        let file = write_temp("bad.json", r#"{"buffer_size": 3000}"#);
        let sources = Sources {
            config_file: Some(file.clone()),
            ..Sources::default()
        };
        let err = Config::load(&sources).unwrap_err();
        assert_eq!(err.setting, "buffer_size");
        assert_eq!(err.origin, Origin::File(file.clone()));
        assert!(
            err.to_string().contains("not a power of two (try 4096)"),
            "{err}"
        );
        std::fs::remove_file(file).unwrap();

        let err =
            Config::load(&Sources::from_pairs([("GGML_VIZ_OP_TIMING", "maybe")])).unwrap_err();
        assert!(err.to_string().contains("GGML_VIZ_OP_TIMING"), "{err}");
        let err =
            Config::load(&Sources::from_pairs([(OVERRIDES_ENV, r#"{"colour": 1}"#)])).unwrap_err();
        assert_eq!(err.problem, "unknown setting");
        let err = Config::load(&Sources::from_pairs([(
            CONFIG_FILE_ENV,
            "/nonexistent/c.json",
        )]))
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/c.json"), "{err}");
    }

    #[test]
    fn op_timing_modes_and_the_old_booleans() {
        let mode = |v: &str| {
            Config::load(&Sources::from_pairs([("GGML_VIZ_OP_TIMING", v)])).map(|c| c.op_timing)
        };
        assert_eq!(Config::default().op_timing, OpTiming::Auto);
        assert_eq!(mode("threads"), Ok(OpTiming::Threads));
        assert_eq!(mode("SCHED"), Ok(OpTiming::Sched));
        assert_eq!(mode("off"), Ok(OpTiming::Off));
        assert_eq!(mode("auto"), Ok(OpTiming::Auto));
        assert_eq!(mode("1"), Ok(OpTiming::Auto));
        assert_eq!(mode("0"), Ok(OpTiming::Off));
        let err = mode("thread").unwrap_err();
        assert!(err.problem.contains("auto, threads, sched or off"), "{err}");
        let json = Config {
            op_timing: OpTiming::Sched,
            ..Config::default()
        }
        .to_json();
        assert_eq!(json["op_timing"], "sched");
    }

    #[test]
    fn json_round_trips_through_overrides() {
        let c = Config {
            max_graphs: 3,
            verbose: true,
            ..Config::default()
        };
        let env = [(OVERRIDES_ENV, Value::Object(c.to_json()).to_string())];
        assert_eq!(Config::load(&Sources::from_pairs(env)).unwrap(), c);
    }

    #[test]
    fn a_ring_larger_than_the_bound_is_refused() {
        for n in [
            "1073741824",
            "4294967296",
            &(MAX_BUFFER_SIZE * 2).to_string(),
        ] {
            let err =
                Config::load(&Sources::from_pairs([("GGML_VIZ_BUFFER_SIZE", n)])).unwrap_err();
            assert!(
                err.to_string().contains("more than the 16777216"),
                "{n}: {err}"
            );
        }
        let max = MAX_BUFFER_SIZE.to_string();
        let c = Config::load(&Sources::from_pairs([(
            "GGML_VIZ_BUFFER_SIZE",
            max.as_str(),
        )]))
        .unwrap();
        assert_eq!(c.buffer_size, 1 << 24);
    }
}
