//! The Vulkan layer a recorded program gets (Linux): the hook library is also the layer
//! `VK_LAYER_GGMLVIZ_timing`, which times each node ggml-vulkan labels on the device. `record`
//! writes the layer's manifest (naming the hook it preloads) into a directory of its own, points
//! the Vulkan loader at it (`VK_ADD_LAYER_PATH`, `VK_INSTANCE_LAYERS`), and asks ggml-vulkan for
//! its node labels (`GGML_VK_DEBUG_MARKERS`); the directory is removed when the program is done.
//! A program without Vulkan never reads any of it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The layer's name, as the hook's negotiation answers for it.
pub const LAYER: &str = "VK_LAYER_GGMLVIZ_timing";

/// The manifest's directory, removed when dropped.
pub struct LayerDir(PathBuf);

impl Drop for LayerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The manifest of the layer in library `hook` (loader layer interface 2).
pub fn manifest(hook: &Path) -> String {
    serde_json::json!({
        "file_format_version": "1.2.0",
        "layer": {
            "name": LAYER,
            "type": "GLOBAL",
            "library_path": hook,
            "api_version": "1.3.0",
            "implementation_version": "1",
            "description": "ggml-viz: the device time of each node ggml-vulkan labels",
            "functions": {
                "vkNegotiateLoaderLayerInterfaceVersion": "vkNegotiateLoaderLayerInterfaceVersion"
            }
        }
    })
    .to_string()
}

/// Sets `cmd` up to load the layer in `hook`; `None` (and `cmd` unchanged) when the manifest
/// cannot be written (said once: the program then runs without device timing).
pub fn enable(cmd: &mut Command, hook: &Path) -> Option<LayerDir> {
    let hook = std::fs::canonicalize(hook).ok()?;
    let dir = std::env::temp_dir().join(format!("ggml-viz-vulkan-{}", std::process::id()));
    let written = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("ggml_viz_layer.json"), manifest(&hook)));
    if let Err(err) = written {
        eprintln!(
            "ggml-viz: cannot write the Vulkan layer's manifest in {} ({err}): Vulkan nodes are not timed",
            dir.display()
        );
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    }
    cmd.env("VK_ADD_LAYER_PATH", prepended(&dir, "VK_ADD_LAYER_PATH"))
        .env(
            "VK_INSTANCE_LAYERS",
            prepended(Path::new(LAYER), "VK_INSTANCE_LAYERS"),
        );
    if std::env::var_os("GGML_VK_DEBUG_MARKERS").is_none() {
        cmd.env("GGML_VK_DEBUG_MARKERS", "1");
    }
    Some(LayerDir(dir))
}

/// `first`, then the list already in the variable `var`, `:`-separated.
fn prepended(first: &Path, var: &str) -> OsString {
    let mut value = first.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}
