//! A span's arguments, looked up by key, as the report's tables and charts read them.

use ggml_viz_reader::telemetry::{Arg, Span};

/// The argument `key` of `span`, if it has one.
fn arg<'a>(span: &'a Span, key: &str) -> Option<&'a Arg> {
    span.args.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// The argument `key` of `span` as text.
pub(super) fn arg_str(span: &Span, key: &str) -> Option<String> {
    arg(span, key).map(|a| a.to_string())
}

/// An unsigned count argument of `span` (tokens, bytes).
pub(super) fn arg_uint(span: &Span, key: &str) -> Option<u64> {
    match arg(span, key) {
        Some(Arg::UInt(n)) => Some(*n),
        _ => None,
    }
}
