//! The follow reader returns each record once, as it completes, without re-reading.

use crate::common;

use std::io::Write;

use ggml_viz_reader::format::Layout;
use ggml_viz_reader::{Follower, LayoutSource};

#[test]
fn follow_returns_new_records_once_as_they_complete() {
    for layout in [Layout::Packed, Layout::Padded] {
        let events = common::sample_trace(layout);
        let (bytes, ends) = common::encode(&events, layout);
        let dir =
            std::env::temp_dir().join(format!("ggml-viz-follow-{}-{layout}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("live.ggmlviz");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut follower = Follower::open(&path, None).unwrap();

        // Write in uneven pieces, each ending inside a record, and poll after each.
        let mut written = 0;
        let mut seen = Vec::new();
        for cut in (0..bytes.len()).step_by(37).chain([bytes.len()]) {
            file.write_all(&bytes[written..cut]).unwrap();
            written = cut;
            let poll = follower.poll().unwrap();
            assert!(poll.damage.is_none());
            seen.extend(poll.events);
            let complete = ends.iter().filter(|&&end| end <= cut).count();
            assert_eq!(seen, events[..complete], "{layout} after {cut} bytes");
            assert_eq!(follower.offset() + follower.pending() as u64, cut as u64);
        }
        assert_eq!(follower.layout().unwrap().source, LayoutSource::Marker);
        assert!(follower.poll().unwrap().events.is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
