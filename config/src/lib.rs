//! The one ggml-viz configuration.
