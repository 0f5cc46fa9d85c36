//! libggml_viz_hook.
