//! Any sequence of events, encoded in either layout, decodes to the same events, through every
//! reader.

use crate::common;

use ggml_viz_reader::{Events, StreamReader, count_types};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn encode_then_decode_is_identity(
        (layout, events) in common::layout().prop_flat_map(|l| (Just(l), prop::collection::vec(common::event(l), 0..60)))
    ) {
        let (bytes, _) = common::encode(&events, layout);

        let from_slice: Vec<_> = Events::new(&bytes, layout).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&from_slice, &events);

        // Small reads so that records straddle read boundaries.
        let chunked = common::ChunkedReader::new(&bytes, 7);
        let from_stream: Vec<_> = StreamReader::new(chunked, Some(layout)).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&from_stream, &events);

        let counts = count_types(&bytes, layout);
        prop_assert!(counts.damage.is_none());
        for code in 0..=255u8 {
            let expected = events.iter().filter(|e| e.type_code == code).count() as u64;
            prop_assert_eq!(counts.by_code[code as usize], expected);
        }
    }
}
