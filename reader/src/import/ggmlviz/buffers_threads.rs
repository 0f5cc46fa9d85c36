//! Buffer events as a live-bytes counter per buffer type, thread events as named lanes.

use crate::format::{Event, EventType, Payload};
use crate::telemetry::{BufferEvent, Lane, Record, RecordSink};

use super::Importer;

impl<S: RecordSink> Importer<'_, S> {
    /// [`Importer::event`] of memory and thread events (and of types it does not know).
    #[inline(never)]
    pub(super) fn other_event(&mut self, e: Event<'_>) {
        let ts = e.timestamp_ns;
        let label: &[u8] = e.label.as_deref().unwrap_or_default();
        match (e.event_type(), &e.payload) {
            (Some(EventType::TensorAlloc), &Payload::Memory { ptr, size }) => {
                let label = String::from_utf8_lossy(label);
                let (buft, base) = crate::format::buffer_parts(&label);
                let buft = buft.to_string();
                let live = self.live.entry(buft.clone()).or_default();
                *live = live.saturating_add(size.min(i64::MAX as u64) as i64);
                self.buffers.insert(ptr, (buft.clone(), size));
                self.counter(buft.clone(), ts);
                self.buffer(true, ptr, size, (buft, base), ts);
            }
            (Some(EventType::TensorFree), &Payload::Memory { ptr, .. }) => {
                if let Some((buft, size)) = self.buffers.remove(&ptr) {
                    let live = self.live.entry(buft.clone()).or_default();
                    *live = live.saturating_sub(size.min(i64::MAX as u64) as i64);
                    self.counter(buft, ts);
                    let label = String::from_utf8_lossy(label);
                    let (buft, base) = crate::format::buffer_parts(&label);
                    self.buffer(false, ptr, size, (buft.to_string(), base), ts);
                }
            }
            (Some(ty @ (EventType::ThreadBegin | EventType::ThreadFree)), _) => {
                let named = (ty == EventType::ThreadBegin && !label.is_empty())
                    .then(|| String::from_utf8_lossy(label).into_owned());
                let new = !self.thread_of.contains_key(&e.thread_id);
                let i = self.thread_named(e.thread_id, named.clone().filter(|_| new));
                let lane = self.threads[i].lane;
                // A thread met before its THREAD_BEGIN is renamed.
                if !new && let Some(name) = named {
                    let lane = Lane {
                        id: lane,
                        process: self.process,
                        tid: Some(e.thread_id as u64),
                        name,
                    };
                    self.sink.record(Record::Lane(lane));
                }
                let name = ty.name().to_string();
                self.sink.record(Record::Instant(crate::telemetry::Instant {
                    lane,
                    name,
                    time_ns: ts,
                }));
            }
            _ => {}
        }
    }

    /// The buffer event itself: made or freed, its handle and bytes, and the buffer type and
    /// base address its label says.
    fn buffer(
        &mut self,
        made: bool,
        buffer: u64,
        size: u64,
        (buffer_type, base): (String, &str),
        time_ns: u64,
    ) {
        self.sink.record(Record::Buffer(BufferEvent {
            process: self.process,
            time_ns,
            made,
            buffer,
            size,
            buffer_type,
            base: base.to_string(),
        }));
    }

    pub(super) fn counter(&mut self, buft: String, ts: u64) {
        let value = self.live.get(&buft).copied().unwrap_or(0) as f64;
        self.sink
            .record(Record::Counter(crate::telemetry::CounterSample {
                process: self.process,
                name: format!("live bytes {buft}"),
                time_ns: ts,
                value,
            }));
    }
}
