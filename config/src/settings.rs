//! The settings' names: each one's key (as the CLI's overrides and `Config::to_json` name it),
//! its environment variable and its path in the JSON file; and the two variables that hold no
//! single setting.

/// Environment variable through which `ggml-viz record` hands its flags to the hook: a JSON
/// object with the same keys as [`Config::to_json`](crate::Config::to_json). It outranks the JSON file.
pub const OVERRIDES_ENV: &str = "GGML_VIZ_OVERRIDES";
/// Environment variable naming the JSON configuration file.
pub const CONFIG_FILE_ENV: &str = "GGML_VIZ_CONFIG";

/// The setting names, their environment variables, and their paths in the seed's JSON file.
pub(crate) struct Setting {
    pub(crate) key: &'static str,
    pub(crate) env: &'static str,
    /// Path in the JSON file (`["instrumentation", "max_events"]`); the flat key works too.
    pub(crate) file_path: &'static [&'static str],
}

pub(crate) const SETTINGS: &[Setting] = &[
    Setting {
        key: "output",
        env: "GGML_VIZ_OUTPUT",
        file_path: &["instrumentation", "output_file"],
    },
    Setting {
        key: "verbose",
        env: "GGML_VIZ_VERBOSE",
        file_path: &["cli", "verbose"],
    },
    Setting {
        key: "disable",
        env: "GGML_VIZ_DISABLE",
        file_path: &["instrumentation", "disable"],
    },
    Setting {
        key: "max_events",
        env: "GGML_VIZ_MAX_EVENTS",
        file_path: &["instrumentation", "max_events"],
    },
    Setting {
        key: "op_timing",
        env: "GGML_VIZ_OP_TIMING",
        file_path: &["instrumentation", "enable_op_timing"],
    },
    Setting {
        key: "op_sample",
        env: "GGML_VIZ_OP_SAMPLE",
        file_path: &["instrumentation", "op_sample"],
    },
    Setting {
        key: "memory_tracking",
        env: "GGML_VIZ_MEMORY_TRACKING",
        file_path: &["instrumentation", "enable_memory_tracking"],
    },
    Setting {
        key: "thread_tracking",
        env: "GGML_VIZ_THREAD_TRACKING",
        file_path: &["instrumentation", "enable_thread_tracking"],
    },
    Setting {
        key: "tensor_names",
        env: "GGML_VIZ_TENSOR_NAMES",
        file_path: &["instrumentation", "tensor_names"],
    },
    Setting {
        key: "flush_interval_ms",
        env: "GGML_VIZ_FLUSH_INTERVAL",
        file_path: &["instrumentation", "flush_interval_ms"],
    },
    Setting {
        key: "buffer_size",
        env: "GGML_VIZ_BUFFER_SIZE",
        file_path: &["instrumentation", "buffer_size"],
    },
    Setting {
        key: "skip_graphs",
        env: "GGML_VIZ_SKIP_GRAPHS",
        file_path: &["instrumentation", "skip_graphs"],
    },
    Setting {
        key: "max_graphs",
        env: "GGML_VIZ_MAX_GRAPHS",
        file_path: &["instrumentation", "max_graphs"],
    },
    Setting {
        key: "layout",
        env: "GGML_VIZ_LAYOUT",
        file_path: &["instrumentation", "layout"],
    },
    Setting {
        key: "memory_bandwidth_mb_s",
        env: "GGML_VIZ_MEMORY_BANDWIDTH",
        file_path: &["host", "memory_bandwidth_mb_s"],
    },
    Setting {
        key: "cupti_capture",
        env: "GGML_VIZ_CUPTI_CAPTURE",
        file_path: &["instrumentation", "cupti_capture"],
    },
];

/// The variables [`Config::load`](crate::Config::load) reads, each with the setting it holds (the two that hold no
/// single setting stand for themselves).
pub(crate) fn read_variables() -> impl Iterator<Item = (&'static str, &'static str)> {
    SETTINGS
        .iter()
        .map(|s| (s.key, s.env))
        .chain([CONFIG_FILE_ENV, OVERRIDES_ENV].map(|e| (e, e)))
}
