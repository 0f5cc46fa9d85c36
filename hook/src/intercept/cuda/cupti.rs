//! CUPTI's ABI, as far as the capture uses it: the library's functions, found with `dlopen` and
//! `dlsym` (nothing links against it), and the fields of its activity records and callback data,
//! read at their offsets in CUDA 13.0's headers (`CUPTI_API_VERSION` 130001). Activity records
//! are the newest struct of their kind in the library that fills them, so a library of another
//! version is refused rather than read at these offsets. The offsets are checked against the
//! headers of NVIDIA's `nvidia-cuda-cupti` wheel by a C program in the tests (`LAYOUT`).

use std::ffi::{CStr, CString, c_char, c_void};

/// The CUPTI version whose layouts these are (`cuptiGetVersion`).
pub const API_VERSION: u32 = 130_001;

/// Where a field lies in a C struct, and its width in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Field {
    pub at: usize,
    pub width: usize,
}

const fn field(at: usize, width: usize) -> Field {
    Field { at, width }
}

/// The `CUpti_ActivityKind` every activity record starts with.
pub const RECORD_KIND: Field = field(0, 4);

/// `CUpti_ActivityKernel10` (`CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`).
pub mod kernel {
    use super::{Field, field};
    pub const START: Field = field(16, 8);
    pub const END: Field = field(24, 8);
    pub const DEVICE_ID: Field = field(40, 4);
    pub const CONTEXT_ID: Field = field(44, 4);
    pub const STREAM_ID: Field = field(48, 4);
    pub const GRID_X: Field = field(52, 4);
    pub const BLOCK_X: Field = field(64, 4);
    pub const CORRELATION_ID: Field = field(92, 4);
    pub const NAME: Field = field(104, 8);
    pub const GRAPH_NODE_ID: Field = field(144, 8);
    pub const GRAPH_ID: Field = field(156, 4);
}

/// `CUpti_ActivityMemcpy6` (`CUPTI_ACTIVITY_KIND_MEMCPY`) and `CUpti_ActivityMemset4`
/// (`..._MEMSET`), which lay these fields out alike (the tests check both).
pub mod transfer {
    use super::{Field, field};
    pub const BYTES: Field = field(8, 8);
    pub const START: Field = field(16, 8);
    pub const END: Field = field(24, 8);
    pub const DEVICE_ID: Field = field(32, 4);
    pub const STREAM_ID: Field = field(40, 4);
    pub const CORRELATION_ID: Field = field(44, 4);
    pub const GRAPH_NODE_ID: Field = field(64, 8);
    pub const GRAPH_ID: Field = field(72, 4);
    /// A memcpy's only: what it copied from and to (`CUpti_ActivityMemcpyKind`).
    pub const COPY_KIND: Field = field(4, 1);
}

/// `CUpti_CallbackData`: what an API callback gets.
pub mod api_call {
    use super::{Field, field};
    pub const SITE: Field = field(0, 4);
    pub const FUNCTION_NAME: Field = field(8, 8);
    pub const PARAMS: Field = field(16, 8);
    pub const SYMBOL_NAME: Field = field(32, 8);
    pub const CORRELATION_ID: Field = field(64, 4);
}

/// `CUpti_ResourceData`: what a resource callback gets; for graph callbacks its descriptor is a
/// `CUpti_GraphData` ([`graph_data`]).
pub mod resource {
    use super::{Field, field};
    pub const DESCRIPTOR: Field = field(16, 8);
}

/// `CUpti_GraphData`.
pub mod graph_data {
    use super::{Field, field};
    pub const GRAPH: Field = field(0, 8);
    pub const ORIGINAL_GRAPH: Field = field(8, 8);
    pub const NODE: Field = field(16, 8);
    pub const ORIGINAL_NODE: Field = field(24, 8);
    pub const NODE_TYPE: Field = field(32, 4);
    pub const GRAPH_EXEC: Field = field(48, 8);
}

/// The driver's launch parameters, as its API callbacks pass them (`generated_cuda_meta.h`).
pub mod launch {
    use super::{Field, field};
    /// `cuLaunchKernel_params`.
    pub const FUNCTION: Field = field(0, 8);
    pub const STREAM: Field = field(40, 8);
    pub const KERNEL_PARAMS: Field = field(48, 8);
    /// `cuLaunchKernelEx_params`.
    pub const EX_FUNCTION: Field = field(8, 8);
    pub const EX_KERNEL_PARAMS: Field = field(16, 8);
    /// `cuGraphLaunch_params`.
    pub const GRAPH_EXEC: Field = field(0, 8);
    pub const GRAPH_STREAM: Field = field(8, 8);
}

/// Every field above with the C struct and member it stands for: what the tests compare with the
/// headers' `offsetof` and `sizeof`.
#[cfg(test)]
#[rustfmt::skip]
const LAYOUT: &[(&str, &str, Field)] = &[
    ("CUpti_ActivityKernel10", "kind", RECORD_KIND),
    ("CUpti_ActivityMemcpy6", "kind", RECORD_KIND),
    ("CUpti_ActivityMemset4", "kind", RECORD_KIND),
    ("CUpti_ActivityKernel10", "start", kernel::START),
    ("CUpti_ActivityKernel10", "end", kernel::END),
    ("CUpti_ActivityKernel10", "deviceId", kernel::DEVICE_ID),
    ("CUpti_ActivityKernel10", "contextId", kernel::CONTEXT_ID),
    ("CUpti_ActivityKernel10", "streamId", kernel::STREAM_ID),
    ("CUpti_ActivityKernel10", "gridX", kernel::GRID_X),
    ("CUpti_ActivityKernel10", "blockX", kernel::BLOCK_X),
    ("CUpti_ActivityKernel10", "correlationId", kernel::CORRELATION_ID),
    ("CUpti_ActivityKernel10", "name", kernel::NAME),
    ("CUpti_ActivityKernel10", "graphNodeId", kernel::GRAPH_NODE_ID),
    ("CUpti_ActivityKernel10", "graphId", kernel::GRAPH_ID),
    ("CUpti_ActivityMemcpy6", "copyKind", transfer::COPY_KIND),
    ("CUpti_ActivityMemcpy6", "bytes", transfer::BYTES),
    ("CUpti_ActivityMemcpy6", "start", transfer::START),
    ("CUpti_ActivityMemcpy6", "end", transfer::END),
    ("CUpti_ActivityMemcpy6", "deviceId", transfer::DEVICE_ID),
    ("CUpti_ActivityMemcpy6", "streamId", transfer::STREAM_ID),
    ("CUpti_ActivityMemcpy6", "correlationId", transfer::CORRELATION_ID),
    ("CUpti_ActivityMemcpy6", "graphNodeId", transfer::GRAPH_NODE_ID),
    ("CUpti_ActivityMemcpy6", "graphId", transfer::GRAPH_ID),
    ("CUpti_ActivityMemset4", "bytes", transfer::BYTES),
    ("CUpti_ActivityMemset4", "start", transfer::START),
    ("CUpti_ActivityMemset4", "end", transfer::END),
    ("CUpti_ActivityMemset4", "deviceId", transfer::DEVICE_ID),
    ("CUpti_ActivityMemset4", "streamId", transfer::STREAM_ID),
    ("CUpti_ActivityMemset4", "correlationId", transfer::CORRELATION_ID),
    ("CUpti_ActivityMemset4", "graphNodeId", transfer::GRAPH_NODE_ID),
    ("CUpti_ActivityMemset4", "graphId", transfer::GRAPH_ID),
    ("CUpti_CallbackData", "callbackSite", api_call::SITE),
    ("CUpti_CallbackData", "functionName", api_call::FUNCTION_NAME),
    ("CUpti_CallbackData", "functionParams", api_call::PARAMS),
    ("CUpti_CallbackData", "symbolName", api_call::SYMBOL_NAME),
    ("CUpti_CallbackData", "correlationId", api_call::CORRELATION_ID),
    ("CUpti_ResourceData", "resourceDescriptor", resource::DESCRIPTOR),
    ("CUpti_GraphData", "graph", graph_data::GRAPH),
    ("CUpti_GraphData", "originalGraph", graph_data::ORIGINAL_GRAPH),
    ("CUpti_GraphData", "node", graph_data::NODE),
    ("CUpti_GraphData", "originalNode", graph_data::ORIGINAL_NODE),
    ("CUpti_GraphData", "nodeType", graph_data::NODE_TYPE),
    ("CUpti_GraphData", "graphExec", graph_data::GRAPH_EXEC),
    ("cuLaunchKernel_params", "f", launch::FUNCTION),
    ("cuLaunchKernel_params", "hStream", launch::STREAM),
    ("cuLaunchKernel_params", "kernelParams", launch::KERNEL_PARAMS),
    ("cuLaunchKernelEx_params", "f", launch::EX_FUNCTION),
    ("cuLaunchKernelEx_params", "kernelParams", launch::EX_KERNEL_PARAMS),
    ("cuGraphLaunch_params", "hGraph", launch::GRAPH_EXEC),
    ("cuGraphLaunch_params", "hStream", launch::GRAPH_STREAM),
];

/// The records' sizes (`sizeof`) these layouts are of, for the same check: a record grown by a
/// field is another version.
#[cfg(test)]
const SIZES: &[(&str, usize)] = &[
    ("CUpti_ActivityKernel10", 216),
    ("CUpti_ActivityMemcpy6", 96),
    ("CUpti_ActivityMemset4", 88),
];

/// `CUpti_ActivityKind` values.
pub mod activity_kind {
    pub const MEMCPY: u32 = 1;
    pub const MEMSET: u32 = 2;
    pub const CONCURRENT_KERNEL: u32 = 10;
}

/// `CUpti_CallbackDomain` values.
pub mod domain {
    pub const DRIVER_API: u32 = 1;
    pub const RUNTIME_API: u32 = 2;
    pub const RESOURCE: u32 = 3;
}

/// Callback ids the capture asks for (`cupti_driver_cbid.h`, `cupti_runtime_cbid.h`,
/// `cupti_callbacks.h`).
pub mod cbid {
    pub const CU_LAUNCH_KERNEL: u32 = 307;
    pub const CU_LAUNCH_KERNEL_PTSZ: u32 = 442;
    pub const CU_LAUNCH_KERNEL_EX: u32 = 652;
    pub const CU_LAUNCH_KERNEL_EX_PTSZ: u32 = 653;
    pub const CU_GRAPH_LAUNCH: u32 = 514;
    pub const CU_GRAPH_LAUNCH_PTSZ: u32 = 515;
    pub const GRAPHNODE_CREATED: u32 = 13;
    pub const GRAPHEXEC_CREATED: u32 = 18;
    pub const GRAPHNODE_CLONED: u32 = 20;
}

/// Every callback the capture enables: its domain, its enumerator's name in the headers, its id.
/// The driver's launches carry the kernels' parameters; the runtime's calls say what ggml asked
/// for (a `<<<>>>` launch is CUDA 13's `__cudaLaunchKernel`) and where captures begin and end;
/// the resource callbacks name the CUDA graph nodes a capture creates and an instantiation
/// clones.
#[rustfmt::skip]
pub const CALLBACKS: &[(u32, &str, u32)] = &[
    (domain::DRIVER_API, "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel", cbid::CU_LAUNCH_KERNEL),
    (domain::DRIVER_API, "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz", cbid::CU_LAUNCH_KERNEL_PTSZ),
    (domain::DRIVER_API, "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx", cbid::CU_LAUNCH_KERNEL_EX),
    (domain::DRIVER_API, "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz", cbid::CU_LAUNCH_KERNEL_EX_PTSZ),
    (domain::DRIVER_API, "CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch", cbid::CU_GRAPH_LAUNCH),
    (domain::DRIVER_API, "CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz", cbid::CU_GRAPH_LAUNCH_PTSZ),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000", 211),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000", 214),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060", 430),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060", 431),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000", 505),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000", 506),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000", 311),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000", 312),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_v10000", 315),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaStreamBeginCapture_ptsz_v10000", 316),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_v10000", 319),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaStreamEndCapture_ptsz_v10000", 320),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaGraphInstantiate_v12000", 443),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaGraphExecUpdate_v10020", 335),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020", 41),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_ptsz_v7000", 225),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_v3020", 44),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy2DAsync_ptsz_v7000", 228),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020", 51),
    (domain::RUNTIME_API, "CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_ptsz_v7000", 235),
    (domain::RESOURCE, "CUPTI_CBID_RESOURCE_GRAPHNODE_CREATED", cbid::GRAPHNODE_CREATED),
    (domain::RESOURCE, "CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED", cbid::GRAPHEXEC_CREATED),
    (domain::RESOURCE, "CUPTI_CBID_RESOURCE_GRAPHNODE_CLONED", cbid::GRAPHNODE_CLONED),
];

/// The activity kinds the capture enables, by their enumerators' names.
#[rustfmt::skip]
pub const ACTIVITY_KINDS: &[(&str, u32)] = &[
    ("CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", activity_kind::CONCURRENT_KERNEL),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", activity_kind::MEMCPY),
    ("CUPTI_ACTIVITY_KIND_MEMSET", activity_kind::MEMSET),
];

/// `CUPTI_API_ENTER`.
pub const API_ENTER: u32 = 0;

/// Reads `f` of the struct at `base` as an unsigned integer (its width: 1, 4 or 8 bytes).
///
/// # Safety
/// `base` points to a live struct of the kind `f` belongs to.
pub unsafe fn read(base: *const u8, f: Field) -> u64 {
    // SAFETY: per the contract, the field lies inside the struct; unaligned reads are fine
    // (activity records are packed).
    unsafe {
        let at = base.add(f.at);
        match f.width {
            1 => u64::from(at.read()),
            4 => u64::from((at as *const u32).read_unaligned()),
            _ => (at as *const u64).read_unaligned(),
        }
    }
}

/// Reads `f` of the struct at `base` as a C string (null: none).
///
/// # Safety
/// As [`read`]; the field holds null or a NUL-terminated string alive for the call.
pub unsafe fn read_str(base: *const u8, f: Field) -> Option<String> {
    // SAFETY: per the contract.
    let p = unsafe { read(base, f) } as *const c_char;
    // SAFETY: non-null: a NUL-terminated string (the contract).
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A symbol's address as the function pointer type `F`.
///
/// # Safety
/// `F` is a function pointer type of the symbol's C signature.
pub unsafe fn as_function<F: Copy>(address: *mut c_void) -> F {
    const { assert!(size_of::<F>() == size_of::<*mut c_void>()) };
    // SAFETY: same size (above); the signature per the contract.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) }
}

pub type Subscriber = *mut c_void;
pub type ApiCallback = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
pub type BufferRequested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub type BufferCompleted = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);
pub type Timestamp = unsafe extern "C" fn() -> u64;

/// The functions of a loaded CUPTI library (each returns a `CUptiResult`, 0 for success).
pub struct Cupti {
    pub path: String,
    get_version: unsafe extern "C" fn(*mut u32) -> i32,
    result_string: unsafe extern "C" fn(i32, *mut *const c_char) -> i32,
    pub subscribe: unsafe extern "C" fn(*mut Subscriber, ApiCallback, *mut c_void) -> i32,
    pub unsubscribe: unsafe extern "C" fn(Subscriber) -> i32,
    pub enable_callback: unsafe extern "C" fn(u32, Subscriber, u32, u32) -> i32,
    pub activity_enable: unsafe extern "C" fn(u32) -> i32,
    pub activity_disable: unsafe extern "C" fn(u32) -> i32,
    pub register_buffers: unsafe extern "C" fn(BufferRequested, BufferCompleted) -> i32,
    pub register_timestamp: unsafe extern "C" fn(Timestamp) -> i32,
    pub next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut u8) -> i32,
    pub flush_all: unsafe extern "C" fn(u32) -> i32,
    pub dropped_records: unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> i32,
    pub graph_node_id: unsafe extern "C" fn(*mut c_void, *mut u64) -> i32,
    pub graph_id: unsafe extern "C" fn(*mut c_void, *mut u32) -> i32,
}

impl Cupti {
    /// Loads the library at `path` (a file, or a name the loader searches for) and finds its
    /// functions; refuses a version whose records are laid out otherwise (another API version).
    pub fn open(path: &str) -> Result<Cupti, String> {
        let c_path = CString::new(path).map_err(|_| format!("{path:?}: a NUL in the path"))?;
        // SAFETY: dlopen with a valid C string; the handle is kept for the process's life (the
        // library is never closed: its callbacks may run until exit).
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns null or a NUL-terminated message.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "not found".into()
            } else {
                // SAFETY: non-null, NUL-terminated (above).
                unsafe { CStr::from_ptr(why) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(format!("cannot load {path}: {why}"));
        }
        let find = |name: &CStr| {
            // SAFETY: a live handle and a valid C string.
            let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
            if f.is_null() {
                Err(format!("{path} defines no {}", name.to_string_lossy()))
            } else {
                Ok(f)
            }
        };
        macro_rules! function {
            ($name:literal) => {
                // SAFETY: the symbol is CUPTI's function of that name, whose C signature
                // (cupti_activity.h, cupti_callbacks.h) is the field's type.
                unsafe { as_function(find($name)?) }
            };
        }
        let cupti = Cupti {
            path: path.into(),
            get_version: function!(c"cuptiGetVersion"),
            result_string: function!(c"cuptiGetResultString"),
            subscribe: function!(c"cuptiSubscribe"),
            unsubscribe: function!(c"cuptiUnsubscribe"),
            enable_callback: function!(c"cuptiEnableCallback"),
            activity_enable: function!(c"cuptiActivityEnable"),
            activity_disable: function!(c"cuptiActivityDisable"),
            register_buffers: function!(c"cuptiActivityRegisterCallbacks"),
            register_timestamp: function!(c"cuptiActivityRegisterTimestampCallback"),
            next_record: function!(c"cuptiActivityGetNextRecord"),
            flush_all: function!(c"cuptiActivityFlushAll"),
            dropped_records: function!(c"cuptiActivityGetNumDroppedRecords"),
            graph_node_id: function!(c"cuptiGetGraphNodeId"),
            graph_id: function!(c"cuptiGetGraphId"),
        };
        let version = cupti.version()?;
        if version != API_VERSION {
            return Err(format!(
                "{path} is CUPTI API version {version}; its records are read as version \
                 {API_VERSION}'s (CUDA 13.0) only"
            ));
        }
        Ok(cupti)
    }

    /// `cuptiGetVersion`.
    pub fn version(&self) -> Result<u32, String> {
        let mut v = 0;
        // SAFETY: CUPTI's function with a valid out pointer.
        self.check("cuptiGetVersion", unsafe { (self.get_version)(&mut v) })?;
        Ok(v)
    }

    /// `Ok` for CUPTI's success, else the call's name with CUPTI's name for `result`.
    pub fn check(&self, call: &str, result: i32) -> Result<(), String> {
        if result == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: CUPTI's function with a valid out pointer; the string it sets is static.
        let named = unsafe { (self.result_string)(result, &mut text) } == 0 && !text.is_null();
        let name = if named {
            // SAFETY: non-null, NUL-terminated, static (above).
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("CUPTI error {result}")
        };
        Err(format!("{call}: {name}"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The unpacked `nvidia-cuda-cupti`, `nvidia-cuda-runtime` and `nvidia-cuda-crt` wheels of
    /// CUDA 13.0 (`include/`, `lib/`), which `scripts/test.sh` fetches; `None` outside CI when
    /// they are not there (CI always has them: a missing folder fails there).
    pub(crate) fn wheels() -> Option<PathBuf> {
        match std::env::var_os("GGML_VIZ_CUDA_WHEELS") {
            Some(dir) => Some(PathBuf::from(dir)),
            None if std::env::var_os("CI").is_some() => {
                panic!("GGML_VIZ_CUDA_WHEELS is not set: scripts/test.sh sets it in CI")
            }
            None => {
                eprintln!("GGML_VIZ_CUDA_WHEELS not set: CUPTI's headers and library not checked");
                None
            }
        }
    }

    #[test]
    fn the_offsets_are_the_headers() {
        let Some(wheels) = wheels() else { return };
        let dir = std::env::temp_dir().join(format!("ggml-viz-cupti-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include <cupti.h>\nint main(void) {\n",
        );
        for (s, f, _) in LAYOUT {
            c += &format!(
                "printf(\"{s}.{f} %zu %zu\\n\", offsetof({s}, {f}), sizeof((({s} *)0)->{f}));\n"
            );
        }
        for (s, _) in SIZES {
            c += &format!("printf(\"{s} %zu\\n\", sizeof({s}));\n");
        }
        let enumerators = CALLBACKS
            .iter()
            .map(|&(_, name, id)| (name, id))
            .chain(ACTIVITY_KINDS.iter().copied())
            .chain([
                ("CUPTI_CB_DOMAIN_DRIVER_API", domain::DRIVER_API),
                ("CUPTI_CB_DOMAIN_RUNTIME_API", domain::RUNTIME_API),
                ("CUPTI_CB_DOMAIN_RESOURCE", domain::RESOURCE),
                ("CUPTI_API_ENTER", API_ENTER),
            ]);
        for (name, _) in enumerators.clone() {
            c += &format!("printf(\"{name} %d\\n\", (int){name});\n");
        }
        c += "return 0;\n}\n";
        let source = dir.join("layout.c");
        std::fs::write(&source, c).unwrap();
        let exe = dir.join("layout");
        let built = std::process::Command::new("cc")
            .arg("-I")
            .arg(wheels.join("include"))
            .arg(&source)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap();
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let out = std::process::Command::new(&exe).output().unwrap();
        let printed = String::from_utf8(out.stdout).unwrap();
        let mut lines = printed.lines();
        for (s, f, field) in LAYOUT {
            let line = lines.next().unwrap();
            assert_eq!(
                line,
                format!("{s}.{f} {} {}", field.at, field.width),
                "the header's offset and size of {s}.{f}"
            );
        }
        for (s, size) in SIZES {
            assert_eq!(lines.next().unwrap(), format!("{s} {size}"));
        }
        for (name, id) in enumerators {
            assert_eq!(lines.next().unwrap(), format!("{name} {id}"));
        }
        assert_eq!(lines.next(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_wheels_library_opens_at_the_headers_version() {
        let Some(wheels) = wheels() else { return };
        let header = std::fs::read_to_string(wheels.join("include/cupti_version.h")).unwrap();
        let version: u32 = header
            .lines()
            .find_map(|l| l.strip_prefix("#define CUPTI_API_VERSION "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(version, API_VERSION, "the wheel's header");
        let lib = wheels.join("lib/libcupti.so.13");
        let cupti = Cupti::open(lib.to_str().unwrap()).unwrap();
        assert_eq!(cupti.version(), Ok(version));
        // Without a driver (no GPU here), enabling an activity fails, and says how by name.
        // SAFETY: CUPTI's function, any kind value.
        let result = unsafe { (cupti.activity_enable)(activity_kind::CONCURRENT_KERNEL) };
        let err = cupti.check("cuptiActivityEnable", result).unwrap_err();
        assert!(
            err.starts_with("cuptiActivityEnable: CUPTI_ERROR_"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_library_is_named() {
        let err = Cupti::open("/nonexistent/libcupti.so.13").err().unwrap();
        assert!(
            err.starts_with("cannot load /nonexistent/libcupti.so.13: "),
            "{err}"
        );
    }
}
