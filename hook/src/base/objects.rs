//! The loaded objects (Linux): which one contains an address, their paths, and what their files'
//! symbol tables say — local symbols included, which the dynamic loader does not keep.

use std::ffi::{CStr, CString, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use object::{Object as _, ObjectSymbol};

/// A loaded object: its path (empty for the main program) and load address.
#[derive(Clone)]
pub struct Object {
    pub path: CString,
    pub base: usize,
}

/// The loaded object that contains `address`. Found by walking the program headers rather than
/// with `dladdr`, which also searches the object's symbol table for the nearest symbol: ~36,000
/// instructions a call here, for a name we do not need.
pub fn object_of(address: usize) -> Option<Object> {
    if address == 0 {
        return None;
    }
    struct Search {
        address: usize,
        found: Option<Object>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `Search`.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        let base = info.dlpi_addr as usize;
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let inside = headers.iter().any(|h| {
            let start = base.wrapping_add(h.p_vaddr as usize);
            h.p_type == libc::PT_LOAD
                && search.address >= start
                && search.address < start + h.p_memsz as usize
        });
        if !inside {
            return 0;
        }
        let path = if info.dlpi_name.is_null() {
            CString::default()
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned()
        };
        search.found = Some(Object { path, base });
        1
    }
    let mut search = Search {
        address,
        found: None,
    };
    // SAFETY: the callback only reads the headers and writes `search`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.found
}

/// A loaded object and the address ranges of its loaded segments.
pub struct Loaded {
    pub object: Object,
    segments: Vec<(usize, usize)>,
}

impl Loaded {
    /// The `[start, end)` ranges of its loaded segments.
    pub fn segments(&self) -> &[(usize, usize)] {
        &self.segments
    }
}

/// Every loaded object, the main program (empty path) first.
pub fn loaded() -> Vec<Loaded> {
    let mut all: Vec<Loaded> = Vec::new();
    unsafe extern "C" fn collect(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our `all`.
        let (info, all) = unsafe { (&*info, &mut *(data as *mut Vec<Loaded>)) };
        let base = info.dlpi_addr as usize;
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let segments = headers
            .iter()
            .filter(|h| h.p_type == libc::PT_LOAD)
            .map(|h| {
                let start = base.wrapping_add(h.p_vaddr as usize);
                (start, start.wrapping_add(h.p_memsz as usize))
            })
            .collect();
        let path = if info.dlpi_name.is_null() {
            CString::default()
        } else {
            // SAFETY: dlpi_name is a NUL-terminated string owned by the loader.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_owned()
        };
        all.push(Loaded {
            object: Object { path, base },
            segments,
        });
        0
    }
    // SAFETY: the callback only reads the headers and copies into `all`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(collect), &mut all as *mut Vec<Loaded> as *mut c_void) };
    all
}

/// The file of a loaded object's path (the main program's is `/proc/self/exe`).
pub fn file_of(path: &CStr) -> &Path {
    if path.is_empty() {
        Path::new("/proc/self/exe")
    } else {
        Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()))
    }
}

/// `f` of the parsed ELF file at `path`; `None` when it cannot be read or parsed.
pub fn with_elf<T>(path: &Path, f: impl FnOnce(&object::File<'_>) -> T) -> Option<T> {
    let file = std::fs::File::open(path).ok()?;
    // SAFETY: a loaded object's file cannot be written while it runs (ETXTBSY) and a library's
    // is replaced, not rewritten, by installers; the map is read-only and dropped before we
    // return.
    let map = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    let elf = object::File::parse(&*map).ok()?;
    Some(f(&elf))
}

/// The size of the symbol `name` in the symbol table of the ELF file at `path`.
pub fn symbol_size(path: &Path, name: &str) -> Option<u64> {
    with_elf(path, |elf| {
        elf.symbols()
            .find(|s| s.name() == Ok(name))
            .map(|s| s.size())
    })
    .flatten()
}
