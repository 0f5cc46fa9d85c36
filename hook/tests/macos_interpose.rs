//! The macOS build, checked where it cannot run: scripts/test.sh compiles the hook to Mach-O
//! objects for x86_64 and aarch64 (`--emit=obj`, no macOS linker needed) and names them in
//! `GGML_VIZ_MACOS_OBJECTS`; this reads them back and checks what dyld will read: an
//! `__interpose` section of (replacement, original) pairs, one per entry point, whose
//! replacements are our exported wrappers and whose originals are weak references to ggml's
//! functions (so that a process without ggml still starts), in the order of `Entry::ALL`.

use ggml_viz_hook::Entry;
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};

#[test]
fn the_macos_objects_interpose_every_entry_point_weakly() {
    let paths = std::env::var_os("GGML_VIZ_MACOS_OBJECTS").expect(
        "GGML_VIZ_MACOS_OBJECTS is not set: run the tests through scripts/test.sh, which builds the objects",
    );
    let paths: Vec<_> = std::env::split_paths(&paths).collect();
    assert_eq!(paths.len(), 2, "one object per architecture: {paths:?}");
    for path in paths {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file = object::File::parse(&*bytes).unwrap();
        assert_eq!(
            file.format(),
            object::BinaryFormat::MachO,
            "{}",
            path.display()
        );
        let section = file
            .section_by_name("__interpose")
            .unwrap_or_else(|| panic!("{}: no __interpose section", path.display()));
        assert_eq!(
            section.size(),
            16 * Entry::ALL.len() as u64,
            "{}",
            path.display()
        );
        // Each 8-byte slot is filled by a relocation against a symbol: offset -> name.
        let mut slots = std::collections::BTreeMap::new();
        for (offset, reloc) in section.relocations() {
            let RelocationTarget::Symbol(index) = reloc.target() else {
                panic!("{}: a slot not filled from a symbol", path.display());
            };
            let symbol = file.symbol_by_index(index).unwrap();
            slots.insert(offset, symbol);
        }
        assert_eq!(slots.len(), 2 * Entry::ALL.len(), "{}", path.display());
        for (i, name) in Entry::ALL.iter().map(|e| e.name()).enumerate() {
            let replacement = &slots[&(16 * i as u64)];
            let original = &slots[&(16 * i as u64 + 8)];
            assert_eq!(replacement.name().unwrap(), format!("_ggml_viz_{name}"));
            assert!(
                replacement.is_definition(),
                "{name}: our wrapper is defined here"
            );
            assert!(replacement.is_global(), "{name}: our wrapper is exported");
            assert_eq!(original.name().unwrap(), format!("_{name}"));
            assert!(
                original.is_undefined(),
                "{name}: ggml's function is not ours"
            );
            assert!(
                original.is_weak(),
                "{name}: a weak reference, or processes without ggml fail to start"
            );
        }
    }
}
