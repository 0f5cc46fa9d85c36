//! How a trace's nodes were timed, from its writer's settings (the metadata record): the mode
//! that ran and what to tell a reader of it.

use crate::format::ext::{Metadata, Setting};

/// The op timing mode that ran (`threads`, `sched`, `off`), from the writer's settings:
/// `op_timing_mode`, or, from a writer that had no modes, the boolean `op_timing` (on = the eval
/// callback); `None` when the trace does not say.
pub fn op_timing_mode(meta: &Metadata) -> Option<&str> {
    match meta.setting_str(Setting::OpTimingMode) {
        Some(mode) => Some(mode),
        None => match meta.setting(Setting::OpTiming)?.as_bool()? {
            true => Some("sched"),
            false => Some("off"),
        },
    }
}

/// Whether a trace's settings leave some graph computes without op timing: `op_sample` above 1,
/// or a capture window (`skip_graphs`, `max_graphs`).
pub fn leaves_graphs_untimed(meta: &Metadata) -> bool {
    let number = |setting| meta.setting_u64(setting).unwrap_or(0);
    number(Setting::OpSample) > 1
        || number(Setting::SkipGraphs) > 0
        || number(Setting::MaxGraphs) > 0
}

/// What a reader should be told about how op timings were taken, from the writer's settings
/// (`op_timing`, `op_sample` of the metadata record); `None` when the trace does not say.
/// The mode is [`op_timing_mode`]'s; `op_timing_why` says why it ran; `gpu_op_timing`, how a
/// GPU's nodes were timed, where one was.
pub fn op_timing_note(meta: &Metadata) -> Option<String> {
    let mode = op_timing_mode(meta)?;
    let sample = meta.setting_u64(Setting::OpSample).unwrap_or(1);
    let what = match mode {
        "off" => return Some("off: graph times only".into()),
        "threads" => "threads: each worker thread's share of each node, as the run computed it \
             (nothing of the run changed)"
            .to_string(),
        "sched" => "sched: each node computed and synchronized on its own by the scheduler's \
             eval callback, no op fusion (small nodes read slower than they run)"
            .to_string(),
        other => other.to_string(),
    };
    let mut note = match sample {
        0 | 1 => what,
        n => format!("{what}; 1 graph compute in {n}"),
    };
    if let Some(why) = meta.setting_str(Setting::OpTimingWhy) {
        note.push_str(&format!(" [{why}]"));
    }
    if let Some(gpu) = meta.setting_str(Setting::GpuOpTiming) {
        note.push_str(&format!("; on the GPU, {gpu}"));
    }
    Some(note)
}
