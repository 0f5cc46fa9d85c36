//! How busy each GPU was: the nodes a device timed itself (on its queue's lane), against the
//! outermost graph computes that launched them. Each graph compute's period runs from its begin
//! to the next one's (the last: to its device's last node); in it, the device's busy time (the
//! union of its nodes), its idle time before its first node (the launch), between its nodes,
//! and after its last node until the next graph compute began (the GPU waiting for the CPU: at
//! batch size 1, sampling and the next launch).

use std::collections::BTreeMap;

/// One device's use, summed over the graph computes whose periods hold its nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceUse {
    /// The backend's name (`Vulkan0`).
    pub backend: String,
    pub nodes: u64,
    /// Graph computes with at least one of its nodes.
    pub computes: u64,
    /// The periods of those graph computes, summed.
    pub period_ns: u64,
    pub busy_ns: u64,
    pub idle_before_ns: u64,
    pub idle_between_ns: u64,
    pub idle_after_ns: u64,
}

impl DeviceUse {
    /// Its busy time's share of the graph computes' periods.
    pub fn busy_share(&self) -> f64 {
        if self.period_ns == 0 {
            0.0
        } else {
            self.busy_ns as f64 / self.period_ns as f64
        }
    }
}

/// Collects device nodes and graph compute begins as a trace is read.
#[derive(Default)]
pub struct DeviceUseCollector {
    compute_begins: Vec<u64>,
    /// By backend: each node's begin and end.
    nodes: BTreeMap<String, Vec<(u64, u64)>>,
}

impl DeviceUseCollector {
    /// An outermost graph compute began at `begin_ns`.
    pub fn compute_begins(&mut self, begin_ns: u64) {
        self.compute_begins.push(begin_ns);
    }

    /// A node of `backend` ran on its device from `begin_ns` to `end_ns`.
    pub fn device_node(&mut self, backend: &str, begin_ns: u64, end_ns: u64) {
        match self.nodes.get_mut(backend) {
            Some(nodes) => nodes.push((begin_ns, end_ns)),
            None => {
                self.nodes
                    .insert(backend.to_string(), vec![(begin_ns, end_ns)]);
            }
        }
    }

    /// Each device's use (none when no device timed a node).
    pub fn finish(mut self) -> Vec<DeviceUse> {
        self.compute_begins.sort_unstable();
        let begins = &self.compute_begins;
        let mut out = Vec::new();
        for (backend, mut nodes) in self.nodes {
            nodes.sort_unstable();
            let mut use_ = DeviceUse {
                backend,
                nodes: nodes.len() as u64,
                ..DeviceUse::default()
            };
            // Nodes before any graph compute (none in a whole trace) count in no period.
            let mut i = nodes.partition_point(|&(b, _)| begins.first().is_none_or(|&g| b < g));
            while i < nodes.len() {
                let k = begins.partition_point(|&g| g <= nodes[i].0) - 1;
                let next = begins.get(k + 1).copied();
                let j = i + nodes[i..].partition_point(|&(b, _)| next.is_none_or(|n| b < n));
                let period = &nodes[i..j];
                let (first, last) = (period[0].0, period.iter().map(|n| n.1).max().unwrap_or(0));
                let mut busy = 0;
                let mut reached = first;
                for &(b, e) in period {
                    let (b, e) = (b.max(reached), e.max(reached));
                    busy += e - b;
                    reached = e;
                }
                let end = next.unwrap_or(last).max(last);
                use_.computes += 1;
                use_.period_ns += end - begins[k];
                use_.busy_ns += busy;
                use_.idle_before_ns += first - begins[k];
                use_.idle_between_ns += (last - first) - busy;
                use_.idle_after_ns += end - last;
                i = j;
            }
            out.push(use_);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two graph computes 1000 ns apart; the device's nodes in the first from 100 to 300 and 250
    /// to 400 (overlapping: 300 busy), in the second from 1200 to 1500.
    #[test]
    fn busy_and_idle_add_up_to_each_period() {
        let mut c = DeviceUseCollector::default();
        c.compute_begins(0);
        c.compute_begins(1000);
        c.device_node("Vulkan0", 250, 400);
        c.device_node("Vulkan0", 100, 300);
        c.device_node("Vulkan0", 1200, 1500);
        let uses = c.finish();
        assert_eq!(
            uses,
            [DeviceUse {
                backend: "Vulkan0".into(),
                nodes: 3,
                computes: 2,
                // The last period ends with the device's last node.
                period_ns: 1000 + 500,
                busy_ns: 300 + 300,
                idle_before_ns: 100 + 200,
                idle_between_ns: 0,
                idle_after_ns: 600,
            }]
        );
        let u = &uses[0];
        assert_eq!(
            u.busy_ns + u.idle_before_ns + u.idle_between_ns + u.idle_after_ns,
            u.period_ns
        );
        assert_eq!(u.busy_share(), 600.0 / 1500.0);
    }

    #[test]
    fn a_gap_between_nodes_is_idle_between() {
        let mut c = DeviceUseCollector::default();
        c.compute_begins(0);
        c.device_node("Vulkan0", 10, 20);
        c.device_node("Vulkan0", 50, 60);
        let u = &c.finish()[0];
        assert_eq!(
            (u.busy_ns, u.idle_between_ns, u.idle_before_ns),
            (20, 30, 10)
        );
    }
}
