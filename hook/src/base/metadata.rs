//! Who wrote a trace: the payload of its first record.

use ggml_viz_config::Config;
use ggml_viz_format::ext::{Distributed, Metadata, Setting};

/// The metadata of this process, with `ggml_version` from the ggml it loaded (if readable) and
/// the op-timing mode that runs and why (`auto` decided), beside the settings.
pub fn collect(config: &Config, ggml_version: Option<String>, op_mode: (&str, &str)) -> Metadata {
    let mut metadata = Metadata {
        writer: concat!("ggml-viz-hook ", env!("CARGO_PKG_VERSION")).into(),
        pid: std::process::id(),
        host: host_name(),
        command_line: command_line(),
        ggml_version,
        n_cpus: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
        cpu_model: cpu_model(),
        settings: config.to_json(),
        distributed: distributed(|name| std::env::var(name).ok()),
    };
    metadata.set(Setting::OpTimingMode, op_mode.0);
    metadata.set(Setting::OpTimingWhy, op_mode.1);
    metadata
}

use super::os::host_name;

fn command_line() -> Vec<String> {
    // /proc is Linux's (under Wine it names Wine's own server); elsewhere the process's arguments.
    let proc_cmdline = if cfg!(target_os = "linux") {
        std::fs::read("/proc/self/cmdline")
    } else {
        Err(std::io::ErrorKind::Unsupported.into())
    };
    match proc_cmdline {
        Ok(raw) => raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        Err(_) => std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| {
            l.starts_with("model name") || l.starts_with("Model") || l.starts_with("cpu model")
        })
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The distributed identity from the launcher's environment: torchrun, then Open MPI, then
/// Slurm. Values that do not fit together (a rank not below the world size) are ignored, and the
/// defaults of TelemetryEvent v2 hold: rank 0, local rank = rank, world size 1.
pub fn distributed(var: impl Fn(&str) -> Option<String>) -> Distributed {
    let num = |name: &str| var(name).and_then(|v| v.trim().parse::<u32>().ok());
    let launchers = [
        ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"),
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "",
        ),
        (
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "SLURM_NTASKS",
            "SLURM_JOB_ID",
        ),
    ];
    for (rank, local, world, job) in launchers {
        let Some(rank) = num(rank) else { continue };
        let world_size = num(world).unwrap_or(1);
        let local_rank = num(local).unwrap_or(rank);
        if world_size >= 1 && rank < world_size && local_rank < world_size {
            let job_id = var(job)
                .filter(|j| !j.trim().is_empty())
                .or_else(|| var("SLURM_JOB_ID"));
            return Distributed {
                job_id,
                rank,
                local_rank,
                world_size,
            };
        }
    }
    Distributed {
        job_id: var("SLURM_JOB_ID").filter(|j| !j.trim().is_empty()),
        ..Distributed::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Distributed {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        distributed(|name| map.get(name).cloned())
    }

    /// Every setting a reader acts on is in the metadata this writer makes, under the key the
    /// format names, as its configuration has it (the GPU's way of timing comes only with a
    /// GPU): the configuration's own names and the format's agree.
    #[test]
    fn the_metadata_carries_every_setting_readers_read() {
        let config = Config {
            op_sample: 3,
            skip_graphs: 2,
            max_graphs: 5,
            buffer_size: 1024,
            memory_bandwidth_mb_s: 7000,
            ..Config::default()
        };
        let m = collect(&config, None, ("threads", "asked for"));
        let missing: Vec<_> = (Setting::ALL.iter())
            .filter(|&&s| s != Setting::GpuOpTiming && m.setting(s).is_none())
            .collect();
        assert!(missing.is_empty(), "not in the metadata: {missing:?}");
        let numbers = [
            Setting::OpSample,
            Setting::SkipGraphs,
            Setting::MaxGraphs,
            Setting::BufferSize,
            Setting::MemoryBandwidthMbS,
        ]
        .map(|s| m.setting_u64(s));
        assert_eq!(numbers, [3, 2, 5, 1024, 7000].map(Some));
        assert_eq!(
            m.setting_str(Setting::OpTiming),
            Some(config.op_timing.name())
        );
        assert_eq!(m.setting_str(Setting::OpTimingMode), Some("threads"));
        assert_eq!(m.setting_str(Setting::OpTimingWhy), Some("asked for"));
    }

    #[test]
    fn launchers_in_order_with_schema_defaults() {
        assert_eq!(from(&[]), Distributed::default());
        let torch = from(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("TORCHELASTIC_RUN_ID", "job7"),
        ]);
        assert_eq!(
            torch,
            Distributed {
                job_id: Some("job7".into()),
                rank: 3,
                local_rank: 1,
                world_size: 8
            }
        );
        let mpi = from(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        assert_eq!(
            mpi,
            Distributed {
                job_id: None,
                rank: 2,
                local_rank: 2,
                world_size: 4
            }
        );
        let slurm = from(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NTASKS", "6"),
            ("SLURM_JOB_ID", "991"),
        ]);
        assert_eq!(
            slurm,
            Distributed {
                job_id: Some("991".into()),
                rank: 5,
                local_rank: 1,
                world_size: 6
            }
        );
        // A rank that does not fit its world is not believed.
        assert_eq!(
            from(&[("RANK", "4"), ("WORLD_SIZE", "4")]),
            Distributed::default()
        );
    }
}
