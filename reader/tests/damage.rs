//! Damaged input: every complete event before the damage, then an error that names the offset.
//! Never a panic, a hang, or a guess.

use crate::common;

use ggml_viz_reader::format::Layout;
use ggml_viz_reader::{
    Damage, DamageKind, Event, Events, StreamError, StreamReader, TraceFile, count_types,
};
use proptest::prelude::*;

fn read_slice(bytes: &[u8], layout: Option<Layout>) -> (Vec<Event<'static>>, Option<Damage>) {
    let layout = layout.unwrap_or_else(|| {
        ggml_viz_reader::choose_layout(bytes.get(12..).unwrap_or(&[]), None).layout
    });
    let mut events = Vec::new();
    for item in Events::new(bytes, layout) {
        match item {
            Ok(e) => events.push(e.into_owned()),
            Err(d) => return (events, Some(d)),
        }
    }
    (events, None)
}

/// The events and damage of `bytes` read `chunk` bytes at a time, one by one and handed over by
/// `for_each_borrowed` (which must agree, offsets included).
fn read_stream(
    bytes: &[u8],
    layout: Option<Layout>,
    chunk: usize,
) -> (Vec<Event<'static>>, Option<Damage>) {
    let read = |each: bool| {
        let (mut events, mut offsets, mut damage) = (Vec::new(), Vec::new(), None);
        let mut on = |offset: u64, item: Result<&Event<'_>, StreamError>| match item {
            Ok(e) => {
                offsets.push(offset);
                events.push(e.clone().into_owned());
                true
            }
            Err(StreamError::Damage(d)) => {
                damage = Some(d);
                false
            }
            Err(StreamError::Io(e)) => panic!("in-memory read failed: {e}"),
        };
        let mut reader = StreamReader::new(common::ChunkedReader::new(bytes, chunk), layout);
        if each {
            reader.for_each_borrowed(on);
        } else {
            while let Some(item) = reader.next_borrowed() {
                let go_on = match item {
                    Ok((offset, e)) => on(offset, Ok(&e)),
                    Err(err) => on(0, Err(err)),
                };
                if !go_on {
                    break;
                }
            }
        }
        (events, offsets, damage)
    };
    let (events, offsets, damage) = read(false);
    assert_eq!(read(true), (events.clone(), offsets, damage.clone()));
    (events, damage)
}

#[test]
fn every_truncation_point_returns_the_complete_events_and_names_the_offset() {
    for layout in [Layout::Packed, Layout::Padded] {
        let events = common::sample_trace(layout);
        let (bytes, ends) = common::encode(&events, layout);
        for cut in 0..=bytes.len() {
            let complete = ends.iter().filter(|&&end| end <= cut).count();
            let boundary = if complete == 0 {
                12.min(cut)
            } else {
                ends[complete - 1]
            };
            let boundary = if cut < 12 { 0 } else { boundary };
            // Forced layout, and detection from the marker: both must agree.
            for forced in [Some(layout), None] {
                for (events_read, damage) in [
                    read_slice(&bytes[..cut], forced),
                    read_stream(&bytes[..cut], forced, 5),
                ] {
                    assert_eq!(events_read, events[..complete], "{layout} cut at {cut}");
                    if cut == bytes.len() {
                        assert_eq!(damage, None);
                    } else if cut == boundary && cut >= 12 {
                        assert_eq!(damage, None, "{layout} cut at record boundary {cut}");
                    } else {
                        let leftover = (cut - boundary) as u64;
                        assert_eq!(
                            damage,
                            Some(Damage {
                                offset: boundary as u64,
                                kind: DamageKind::Truncated { leftover }
                            }),
                            "{layout} cut at {cut}"
                        );
                    }
                }
            }
            let counts = count_types(&bytes[..cut], layout);
            assert_eq!(counts.total(), complete as u64);
        }
    }
}

#[test]
fn a_bad_has_label_byte_is_corruption_at_its_record() {
    let layout = Layout::Packed;
    let events = common::sample_trace(layout);
    let (mut bytes, ends) = common::encode(&events, layout);
    let victim = 4; // the fifth record
    bytes[ends[victim - 1] + layout.fixed_len() - 1] = 7;
    let (read, damage) = read_slice(&bytes, Some(layout));
    assert_eq!(read, events[..victim]);
    let damage = damage.unwrap();
    assert_eq!(damage.offset, ends[victim - 1] as u64);
    assert!(!damage.is_truncation());
    assert!(
        damage
            .to_string()
            .contains(&format!("byte offset {}", ends[victim - 1])),
        "{damage}"
    );
}

#[test]
fn an_absurd_label_length_is_corruption_not_a_wait() {
    let layout = Layout::Padded;
    let events = common::sample_trace(layout);
    let (mut bytes, ends) = common::encode(&events, layout);
    // The second record has a label; make its length 4 GiB - 1.
    let at = ends[0] + layout.fixed_len();
    bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    for (read, damage) in [
        read_slice(&bytes, Some(layout)),
        read_stream(&bytes, Some(layout), 4096),
    ] {
        assert_eq!(read, events[..1]);
        let damage = damage.unwrap();
        assert_eq!(damage.offset, ends[0] as u64);
        assert!(!damage.is_truncation(), "{damage}");
    }
}

#[test]
fn bad_headers_are_named() {
    let (mut bytes, _) = common::encode(&common::sample_trace(Layout::Packed), Layout::Packed);
    bytes[8] = 2;
    let (read, damage) = read_slice(&bytes, Some(Layout::Packed));
    assert!(read.is_empty());
    assert_eq!(damage.unwrap().kind, DamageKind::UnsupportedVersion(2));
    let (read, damage) = read_stream(b"PK\x03\x04 not a trace at all", None, 3);
    assert!(read.is_empty());
    assert_eq!(
        damage,
        Some(Damage {
            offset: 0,
            kind: DamageKind::BadMagic
        })
    );
}

#[test]
fn an_empty_file_maps_and_reads_as_a_truncated_header() {
    let dir = std::env::temp_dir().join(format!("ggml-viz-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("empty.ggmlviz");
    std::fs::write(&path, b"").unwrap();
    let trace = TraceFile::open(&path, None).unwrap();
    let items: Vec<_> = trace.events().collect();
    assert_eq!(
        items,
        vec![Err(Damage {
            offset: 0,
            kind: DamageKind::Truncated { leftover: 0 }
        })]
    );
    std::fs::remove_dir_all(dir).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Random corruption: every reader stops with a named offset inside the file, agrees with the
    /// others, and returns unchanged every record that lies wholly before the first changed byte.
    #[test]
    fn random_corruption_never_panics_and_keeps_the_intact_prefix(
        layout in common::layout(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        chunk in 1usize..200,
        detect in any::<bool>(),
    ) {
        let events = common::sample_trace(layout);
        let (mut bytes, ends) = common::encode(&events, layout);
        let mut first_changed = bytes.len();
        for (index, value) in flips {
            let at = index.index(bytes.len());
            if bytes[at] != value {
                bytes[at] = value;
                first_changed = first_changed.min(at);
            }
        }
        let forced = if detect { None } else { Some(layout) };
        let (from_slice, slice_damage) = read_slice(&bytes, forced);
        let (from_stream, stream_damage) = read_stream(&bytes, forced, chunk);
        prop_assert_eq!(&from_slice, &from_stream);
        prop_assert_eq!(&slice_damage, &stream_damage);
        if let Some(d) = &slice_damage {
            prop_assert!(d.offset <= bytes.len() as u64);
            prop_assert!(d.to_string().contains("offset"));
        }
        // The marker (record 0) is intact whenever the first change comes after it, so the
        // layout is known, and every record that ends before the first change survives.
        if first_changed >= ends[0] || forced.is_some() {
            let intact = ends.iter().filter(|&&end| end <= first_changed).count();
            prop_assert!(from_slice.len() >= intact);
            prop_assert_eq!(&from_slice[..intact], &events[..intact]);
        }
        let counts = count_types(&bytes, if detect { ggml_viz_reader::choose_layout(&bytes[12..], None).layout } else { layout });
        prop_assert!(counts.total() <= (bytes.len() / 42) as u64);
    }
}

#[test]
fn hostile_sizes_and_times_saturate_instead_of_overflowing() {
    // Found by the decode fuzz target: two huge allocations overflowed the byte totals.
    use ggml_viz_reader::format::{Event, Payload};
    use ggml_viz_reader::import::ggmlviz;
    use ggml_viz_reader::telemetry::Collected;
    let huge = |type_code, ptr, ts| Event {
        type_code,
        timestamp_ns: ts,
        thread_id: 1,
        payload: Payload::Memory {
            ptr,
            size: u64::MAX,
        },
        label: None,
    };
    let events = vec![
        huge(4, 1, 5),
        huge(4, 2, u64::MAX),
        huge(4, 1, 0),
        huge(5, 2, 1),
    ];
    let (bytes, _) = common::encode(&events, Layout::Packed);
    let stats = ggml_viz_reader::TraceStats::collect(Events::new(&bytes, Layout::Packed));
    assert_eq!(stats.memory.allocated_bytes, u64::MAX);
    let mut c = Collected::default();
    ggmlviz::import(
        &bytes,
        Layout::Packed,
        "hostile",
        &mut ggml_viz_reader::telemetry::Ids::default(),
        &mut c,
    );
    assert_eq!(c.counters.len(), 4);
}
