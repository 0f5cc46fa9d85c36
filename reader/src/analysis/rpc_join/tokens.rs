//! Where each token's time went on the client's clock, in one sweep per client.

use crate::telemetry::ProcessId;
use rustc_hash::FxHashMap as HashMap;

use super::model::{ClockOffset, RpcAnalysis, TokenTime};
use super::parts::{Part, RpcParts};

/// Total length of the union of `intervals` clipped to `[lo, hi)`, after merging them into
/// `covered` (kept sorted and disjoint).
fn cover(
    covered: &mut Vec<(u64, u64)>,
    intervals: impl Iterator<Item = (u64, u64)>,
    lo: u64,
    hi: u64,
) -> u64 {
    let before: u64 = covered.iter().map(|(a, b)| b - a).sum();
    covered.extend(
        intervals
            .map(|(a, b)| (a.max(lo), b.min(hi)))
            .filter(|(a, b)| a < b),
    );
    covered.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(covered.len());
    for &(a, b) in covered.iter() {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    *covered = merged;
    covered.iter().map(|(a, b)| b - a).sum::<u64>() - before
}

/// Intervals sorted by start, handed out window by window for windows that move forward: each
/// window gets those that overlap it. Each interval is taken in once and dropped once, so a
/// sweep costs the intervals plus their overlaps with the windows.
struct Sweep {
    sorted: Vec<(u64, u64)>,
    next: usize,
    active: Vec<(u64, u64)>,
}

impl Sweep {
    fn new(mut intervals: Vec<(u64, u64)>) -> Sweep {
        intervals.sort_unstable();
        Sweep {
            sorted: intervals,
            next: 0,
            active: Vec::new(),
        }
    }

    /// The intervals that overlap `[lo, hi)` (`lo` never below an earlier window's).
    fn window(&mut self, lo: u64, hi: u64) -> &[(u64, u64)] {
        self.active.retain(|&(_, end)| end > lo);
        while let Some(&(start, end)) = self.sorted.get(self.next) {
            if start >= hi {
                break;
            }
            if end > lo {
                self.active.push((start, end));
            }
            self.next += 1;
        }
        &self.active
    }
}

impl RpcAnalysis {
    /// The per-token breakdown of every client's decodes, in one sweep per client.
    pub fn tokens(&self, parts: &RpcParts) -> Vec<TokenTime> {
        let offsets: HashMap<ProcessId, &ClockOffset> = (self.offsets.iter())
            .map(|o| (o.server_process, o))
            .collect();
        let on_client_clock =
            |server: ProcessId, t: u64| offsets.get(&server).map_or(t, |o| o.on_client_clock(t));
        let mut clients: Vec<ProcessId> = self.links.iter().map(|l| l.client_process).collect();
        clients.sort_unstable();
        clients.dedup();
        let mut servers: Vec<ProcessId> = self.links.iter().map(|l| l.server_process).collect();
        servers.sort_unstable();
        servers.dedup();
        // Each server's graph computes on the client's clock.
        let mut computes: HashMap<ProcessId, Vec<(u64, u64)>> = HashMap::default();
        for j in &self.joined {
            let serve = parts.part(j.serve);
            if parts.is_graph_compute(serve.command) {
                let server = self.links[j.link].server_process;
                computes.entry(server).or_default().push((
                    on_client_clock(server, serve.start_ns),
                    on_client_clock(server, serve.end_ns),
                ));
            }
        }
        let mut decodes: Vec<(ProcessId, u64, u64)> = (parts.decodes.iter().copied())
            .filter(|(process, ..)| clients.binary_search(process).is_ok())
            .collect();
        decodes.sort_unstable();
        let mut out = Vec::with_capacity(decodes.len());
        for client in clients {
            let first = decodes.partition_point(|d| d.0 < client);
            let last = decodes.partition_point(|d| d.0 <= client);
            let Some(&(_, final_start, final_end)) = decodes[first..last].last() else {
                continue;
            };
            let own_parts = || (parts.parts.iter()).filter(move |p| p.process == client);
            // A token runs from one decode's start to the next one's: a decode returns once its
            // graphs are sent, before the servers have computed them. The last runs to the end
            // of its decode or of the client's last command, whichever is later.
            let final_hi = (own_parts())
                .filter(|p| p.start_ns >= final_start)
                .map(|p| p.end_ns)
                .max()
                .unwrap_or(final_end)
                .max(final_end);
            let mut server_sweeps: Vec<(ProcessId, Sweep)> = (servers.iter())
                .map(|&s| (s, Sweep::new(computes.get(&s).cloned().unwrap_or_default())))
                .collect();
            let mut own_sweep = Sweep::new(
                (parts.local_computes.iter())
                    .filter(|(p, ..)| *p == client)
                    .map(|&(_, a, b)| (a, b))
                    .collect(),
            );
            let moving = own_parts().filter(|p| p.part != Part::Serve);
            let mut moving_sweep = Sweep::new(moving.map(|p| (p.start_ns, p.end_ns)).collect());
            let windows = decodes[first..last]
                .iter()
                .enumerate()
                .map(
                    |(i, &(_, start, _))| match decodes[first..last].get(i + 1) {
                        Some(&(_, next_start, _)) => (start, next_start),
                        None => (start, final_hi),
                    },
                );
            for (lo, hi) in windows {
                let mut covered = Vec::new();
                let servers = (server_sweeps.iter_mut())
                    .map(|(s, sweep)| {
                        (
                            *s,
                            cover(&mut covered, sweep.window(lo, hi).iter().copied(), lo, hi),
                        )
                    })
                    .collect();
                let client_compute_ns = cover(
                    &mut covered,
                    own_sweep.window(lo, hi).iter().copied(),
                    lo,
                    hi,
                );
                let transfer_ns = cover(
                    &mut covered,
                    moving_sweep.window(lo, hi).iter().copied(),
                    lo,
                    hi,
                );
                let busy: u64 = covered.iter().map(|(a, b)| b - a).sum();
                out.push(TokenTime {
                    client_process: client,
                    start_ns: lo,
                    end_ns: hi,
                    servers,
                    client_compute_ns,
                    transfer_ns,
                    idle_ns: hi.saturating_sub(lo).saturating_sub(busy),
                });
            }
        }
        out
    }
}
