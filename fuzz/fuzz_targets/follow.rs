//! The push decoder behind the streaming and follow readers, fed in pieces whose sizes come from
//! the input itself. Invariant: it returns exactly what the slice reader returns for the same bytes.
#![no_main]

use ggml_viz_reader::format::Layout;
use ggml_viz_reader::{Decoder, Events};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, bytes)) = data.split_first() else { return };
    let step = step as usize % 64 + 1;
    let mut decoder = Decoder::new(Some(Layout::Packed));
    let mut pushed = Vec::new();
    for chunk in bytes.chunks(step) {
        decoder.push(chunk);
        while let Some(item) = decoder.next_event() {
            pushed.push(item);
        }
    }
    decoder.end_input();
    while let Some(item) = decoder.next_event() {
        pushed.push(item);
    }
    if let Some(d) = decoder.finish() {
        pushed.push(Err(d));
    }
    let sliced: Vec<_> = Events::new(bytes, Layout::Packed).map(|r| r.map(|e| e.into_owned())).collect();
    assert_eq!(pushed, sliced);
});
