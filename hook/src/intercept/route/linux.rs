//! Finding the real ggml functions behind our exported wrappers, at run time.
//!
//! Nothing of ggml is referenced at link time (rustc links cdylibs with `BIND_NOW`, so one
//! undefined ggml symbol would kill every process that preloads us, `/bin/true` included).
//!
//! Each call goes where the dynamic loader would have bound it without us. The loader looks in
//! the global scope first, for every object, so that is the first definition after ours there
//! (`dlsym(RTLD_NEXT)`): right for ggml calling itself through the PLT and for libllama calling
//! ggml, with one `dlsym` per calling object and function. Where the global scope has none (ggml
//! loaded `RTLD_LOCAL`, two such copies side by side, CPU backend variants loaded with
//! `dlopen`), the caller's object (from the return address) is opened with `RTLD_NOLOAD` and
//! the symbol looked up in its own dependency scope, and when that fails too every loaded object
//! is searched. (Opening an object costs ~50,000 instructions the first time: the loader builds
//! its dependency list; a process that loads ggml at start-up opens none.)
//! Results are cached per call site in atomics; the slow path takes a lock, once per call site.
//! The main program calling a ggml linked into itself goes to the inline hook's trampoline
//! ([`crate::intercept::inline`]).
//!
//! The helpers we call ourselves ([`Helpers`]: `ggml_graph_n_nodes`, `ggml_backend_name`, …) come
//! from where the real function came from (the global scope, or the scope of the object that
//! defines it), so they belong to the same copy.

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use super::{Resolved, note_helpers, untraced};
use crate::base::entry::Entry;
use crate::base::fault::{self, Fault};
use crate::base::ggml::Helpers;
use crate::base::objects::{Loaded, Object, loaded, object_of};
use crate::base::say;
use crate::intercept::inline;

/// Call sites remembered (a power of two); filled to [`CACHE_LIMIT`] at most, so that probing
/// stays short.
const CACHE_SLOTS: usize = 1 << 14;
const CACHE_LIMIT: usize = CACHE_SLOTS / 4 * 3;

struct CacheSlot {
    key: AtomicUsize,
    value: AtomicPtr<Resolved>,
}

#[allow(clippy::declare_interior_mutable_const)] // a template copied into each slot
const EMPTY: CacheSlot = CacheSlot {
    key: AtomicUsize::new(0),
    value: AtomicPtr::new(ptr::null_mut()),
};
static CACHE: [CacheSlot; CACHE_SLOTS] = [EMPTY; CACHE_SLOTS];
/// Slots taken.
static CACHE_USED: AtomicUsize = AtomicUsize::new(0);
/// Past the limit, new call sites of a function go where its first uncached call site went: one
/// lookup, no lock, nothing leaked per call (a second copy of ggml is then not told apart).
/// Indexed by [`Callee::code`].
static PAST_LIMIT: [OnceLock<&'static Resolved>; 256] = [const { OnceLock::new() }; 256];

/// Has the call-site cache's pages (256 KiB) backed for writing now, for threads-mode op
/// timing. A slot is read before it is written (a lookup, then the insert after a miss): the
/// read of an untouched page maps the shared zero page, and the insert faults again to replace
/// it, which makes the kernel flush the TLBs of every other CPU running a thread of the
/// process. ggml's worker threads meet their call sites together, in the first timed graph
/// compute: left unbacked, the cache's pages made it 0.27 ms longer (`llama-bench -t 2` on the
/// 512x8 model: 3.0 ms against 2.7 ms).
#[cfg(target_arch = "x86_64")]
pub fn back_call_site_cache() {
    crate::base::os::populate_for_writing(CACHE.as_ptr().cast(), std::mem::size_of_val(&CACHE));
}

/// A function we wrap: an entry point, or one of the CPU backend's per-op functions (by its
/// index in [`crate::intercept::cpu_ops`]'s table, and its name).
#[derive(Clone, Copy)]
pub enum Callee {
    Entry(Entry),
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Cpu(u8, &'static CStr),
    /// One of ggml-rpc's transport methods (by its row in [`crate::intercept::rpc_transport`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Rpc(u8, &'static CStr),
}

impl Callee {
    /// A number per function, below 256: entry points from 1, CPU functions from 64, RPC
    /// methods from 240.
    fn code(self) -> usize {
        match self {
            Callee::Entry(entry) => entry as usize,
            Callee::Cpu(index, _) => 64 + index as usize,
            Callee::Rpc(index, _) => 240 + index as usize,
        }
    }

    fn c_name(self) -> &'static CStr {
        match self {
            Callee::Entry(entry) => entry.c_name(),
            Callee::Cpu(_, name) | Callee::Rpc(_, name) => name,
        }
    }
}

/// What the slow path has learnt; its lock serializes the slow path.
struct Slow {
    /// Helpers already found, by the base address of the object defining the real function (0:
    /// the global scope's).
    helpers: Vec<(usize, &'static Helpers)>,
    /// `dlopen(RTLD_NOLOAD)` handles by object path, kept open: each `dlopen` costs thousands of
    /// instructions, and holding a reference to a loaded object only keeps it loaded.
    handles: Vec<(CString, usize)>,
    /// The loaded objects as last seen (walked again when an address is in none of them).
    objects: Vec<Loaded>,
    /// Their segments by start address: start, end and the object's index in `objects`.
    segments: Vec<(usize, usize, usize)>,
    /// Where each function goes from each calling object (by its base; `usize::MAX`: an address
    /// in no object): call sites of one object share it, so each is one lookup, not a `dlsym`.
    routes: BTreeMap<(usize, usize), &'static Resolved>,
}

/// Where a call goes.
#[derive(Clone, Copy)]
struct Route {
    real: usize,
    /// Several copies define the function and the caller belongs to none: a guess, untraced.
    ambiguous: bool,
    /// Found in the global scope (else in an object's own scope, or hooked inline).
    global: bool,
}

/// The slow path's state behind a pthread mutex that `fork` takes first (an atfork handler) and
/// releases in the parent and the child: a child forked while another thread was resolving gets
/// it unlocked and consistent (a std `Mutex` held at fork stays locked in the child forever).
struct SlowLock {
    mutex: UnsafeCell<libc::pthread_mutex_t>,
    slow: UnsafeCell<Slow>,
}

// SAFETY: `slow` is only reached through `SlowGuard`, which holds `mutex`.
unsafe impl Sync for SlowLock {}

static SLOW: SlowLock = SlowLock {
    mutex: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    slow: UnsafeCell::new(Slow {
        helpers: Vec::new(),
        handles: Vec::new(),
        objects: Vec::new(),
        segments: Vec::new(),
        routes: BTreeMap::new(),
    }),
};

/// The slow path, locked (unlocked when dropped, also on a panic).
struct SlowGuard;

impl SlowGuard {
    fn lock() -> SlowGuard {
        static AT_FORK: Once = Once::new();
        AT_FORK.call_once(|| {
            // The heap's handlers first, so that `fork` takes our mutex before the heap's lock
            // (whoever holds the mutex may be allocating).
            crate::base::heap::register_fork_handlers();
            extern "C" fn prepare() {
                // SAFETY: a valid, initialized mutex; released by `released` after the fork.
                unsafe { libc::pthread_mutex_lock(SLOW.mutex.get()) };
            }
            extern "C" fn released() {
                // SAFETY: `prepare` locked it in this thread (the child's only thread is the
                // forking one), so this thread may unlock it.
                unsafe { libc::pthread_mutex_unlock(SLOW.mutex.get()) };
            }
            // SAFETY: three `extern "C"` handlers that never unwind.
            unsafe { libc::pthread_atfork(Some(prepare), Some(released), Some(released)) };
        });
        // SAFETY: a valid, initialized mutex, unlocked by `drop`.
        unsafe { libc::pthread_mutex_lock(SLOW.mutex.get()) };
        SlowGuard
    }
}

impl std::ops::Deref for SlowGuard {
    type Target = Slow;
    fn deref(&self) -> &Slow {
        // SAFETY: the mutex is held while the guard lives.
        unsafe { &*SLOW.slow.get() }
    }
}

impl std::ops::DerefMut for SlowGuard {
    fn deref_mut(&mut self) -> &mut Slow {
        // SAFETY: the mutex is held while the guard lives, and this is the only guard.
        unsafe { &mut *SLOW.slow.get() }
    }
}

impl Drop for SlowGuard {
    fn drop(&mut self) {
        // SAFETY: locked by `lock` in this thread.
        unsafe { libc::pthread_mutex_unlock(SLOW.mutex.get()) };
    }
}

/// The entry point and the return address together: one call site can call several entry
/// points (libffi's, or any call through a function pointer), and one entry point is called from
/// many sites. User-space addresses fit in 56 bits, so the entry goes above them; without a
/// return address (an architecture we have no trampoline for) the entry alone is the key.
fn cache_key(callee: Callee, return_address: usize) -> usize {
    (callee.code() << 56) | (return_address & ((1 << 56) - 1))
}

fn probe(key: usize) -> impl Iterator<Item = &'static CacheSlot> {
    let start =
        key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (usize::BITS - CACHE_SLOTS.trailing_zeros());
    (0..CACHE_SLOTS).map(move |i| &CACHE[(start + i) % CACHE_SLOTS])
}

fn cached(key: usize) -> Option<&'static Resolved> {
    for slot in probe(key) {
        match slot.key.load(Ordering::Acquire) {
            0 => return None,
            k if k == key => {
                let value = slot.value.load(Ordering::Acquire);
                // SAFETY: values are leaked `Resolved`s, published before their key.
                return (!value.is_null()).then(|| unsafe { &*value });
            }
            _ => {}
        }
    }
    None
}

/// The real function for `entry` called from `return_address`, and whether this call resolved it
/// afresh; `None` if no loaded object defines it.
pub fn resolve(entry: Entry, return_address: usize) -> Option<(&'static Resolved, bool)> {
    resolve_callee(Callee::Entry(entry), return_address)
}

/// [`resolve`] for any function we wrap.
pub fn resolve_callee(callee: Callee, return_address: usize) -> Option<(&'static Resolved, bool)> {
    let key = cache_key(callee, return_address);
    if let Some(found) = cached(key) {
        return Some((found, false));
    }
    if let Some(&found) = PAST_LIMIT[callee.code()].get() {
        return Some((found, false));
    }
    fault::inject(Fault::Resolve);
    let mut slow = SlowGuard::lock();
    if let Some(found) = cached(key) {
        return Some((found, false));
    }
    let (resolved, fresh) = slow.find_real(callee, return_address)?;
    if fresh && resolved.untraced {
        say(format_args!(
            "several copies of ggml define {} and the caller at {return_address:#x} belongs to none of them; \
             calling the first one, untraced",
            callee.c_name().to_string_lossy()
        ));
    }
    if CACHE_USED.load(Ordering::Relaxed) < CACHE_LIMIT
        && let Some(slot) = probe(key).find(|s| s.key.load(Ordering::Relaxed) == 0)
    {
        slot.value.store(
            resolved as *const Resolved as *mut Resolved,
            Ordering::Release,
        );
        slot.key.store(key, Ordering::Release);
        CACHE_USED.fetch_add(1, Ordering::Relaxed);
    } else if PAST_LIMIT[callee.code()].set(resolved).is_ok() {
        say(format_args!(
            "more than {CACHE_LIMIT} call sites of ggml: new call sites of {} go where the first \
             of them went",
            callee.c_name().to_string_lossy()
        ));
    }
    Some((resolved, true))
}

/// The trampoline to the original of `callee` where the executable's own function was hooked
/// inline.
fn inline_original(callee: Callee) -> Option<usize> {
    match callee {
        Callee::Entry(entry) => inline::original(entry),
        #[cfg(target_arch = "x86_64")]
        Callee::Cpu(row, _) => inline::cpu_original(row),
        #[cfg(not(target_arch = "x86_64"))]
        Callee::Cpu(..) => None,
        Callee::Rpc(..) => None,
    }
}

/// Whether threads-mode op timing can work here: `ggml_barrier` and
/// `ggml_compute_forward_mul_mat` are exported by a loaded library other than ours (calls to
/// them then reach our wrappers through the PLT) or were hooked inline in the executable's own
/// ggml; `Err` says why not.
#[cfg(target_arch = "x86_64")]
pub fn cpu_functions_reachable() -> Result<(), String> {
    let mut slow = SlowGuard::lock();
    for name in [c"ggml_barrier", c"ggml_compute_forward_mul_mat"] {
        if inline::cpu_hooked(name) {
            continue;
        }
        // The next definition after ours in the global scope, else (a ggml loaded
        // `RTLD_LOCAL`) a search of every loaded object.
        if slow.next_global(name).is_some() {
            continue;
        }
        if slow.all_definitions(name).is_empty() {
            return Err(format!(
                "no loaded library exports {} and the executable has none of its own to hook \
                 (a ggml whose CPU backend neither exports its per-op functions nor has them \
                 in a symbol table)",
                name.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// Where a call site goes, for `verbose`: the caller's object and the real function's.
pub fn describe_route(entry: Entry, return_address: usize, resolved: &Resolved) -> String {
    let path = |address| object_of(address).map(|o| o.path.to_string_lossy().into_owned());
    format!(
        "{} called from {} goes to {}",
        entry.name(),
        match path(return_address) {
            Some(p) if p.is_empty() => "the executable".to_string(),
            Some(p) => p,
            None => format!("{return_address:#x}"),
        },
        if inline::helpers_for(resolved.real).is_some() {
            "the executable's own (inline hook)".to_string()
        } else {
            path(resolved.real).unwrap_or_else(|| format!("{:#x}", resolved.real))
        },
    )
}

impl Slow {
    /// Where `callee` called from `return_address` goes: [`Slow::find_route`] and the helpers of
    /// the copy it found, once per calling object and function (whose call sites share the
    /// result); whether this call found it.
    fn find_real(
        &mut self,
        callee: Callee,
        return_address: usize,
    ) -> Option<(&'static Resolved, bool)> {
        let key = (
            self.base_of(return_address).unwrap_or(usize::MAX),
            callee.code(),
        );
        if let Some(&found) = self.routes.get(&key) {
            return Some((found, false));
        }
        let caller = self.object_at(return_address).cloned();
        let route = self.find_route(callee, caller)?;
        let helpers = inline::helpers_for(route.real).unwrap_or_else(|| self.helpers_for(route));
        note_helpers(helpers);
        let resolved: &'static Resolved = Box::leak(Box::new(Resolved {
            real: route.real,
            helpers,
            untraced: route.ambiguous,
        }));
        self.routes.insert(key, resolved);
        Some((resolved, true))
    }

    fn find_route(&mut self, callee: Callee, caller: Option<Object>) -> Option<Route> {
        let name = callee.c_name();
        let route = |real, ambiguous, global| Route {
            real,
            ambiguous,
            global,
        };
        // The main program (no path) calling its own statically linked ggml: the inline hook.
        if let Some(caller) = &caller
            && caller.path.is_empty()
            && let Some(original) = inline_original(callee)
        {
            return Some(route(original, false, false));
        }
        if let Some(next) = self.next_global(name) {
            return Some(route(next, false, true));
        }
        if let Some(caller) = caller
            && let Some(real) = self.lookup_in_scope(&caller.path, name)
        {
            return Some(route(real, false, false));
        }
        let all = self.all_definitions(name);
        all.first().map(|&real| route(real, all.len() > 1, false))
    }

    /// The first definition of `name` after ours in the global scope, if any.
    fn next_global(&mut self, name: &CStr) -> Option<usize> {
        // SAFETY: dlsym with RTLD_NEXT and a valid C string.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        (next != 0 && !self.is_ours(next)).then_some(next)
    }

    /// `name` looked up in the scope of the already-loaded object at `path` (the object, then
    /// its dependencies), unless that finds our own wrapper.
    fn lookup_in_scope(&mut self, path: &CStr, name: &CStr) -> Option<usize> {
        if path.is_empty() {
            return None;
        }
        let handle = match self.handles.iter().find(|(p, _)| p.as_c_str() == path) {
            Some((_, handle)) => *handle,
            None => {
                // SAFETY: RTLD_NOLOAD only returns a handle for an object that is already loaded.
                let handle =
                    unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
                self.handles.push((path.to_owned(), handle as usize));
                handle as usize
            }
        };
        if handle == 0 {
            return None;
        }
        // SAFETY: a valid handle and C string.
        let found = unsafe { libc::dlsym(handle as *mut c_void, name.as_ptr()) } as usize;
        (found != 0 && !self.is_ours(found)).then_some(found)
    }

    /// The loaded object containing `address`, from the snapshot, walked again on a miss (an
    /// object loaded since).
    fn object_at(&mut self, address: usize) -> Option<&Object> {
        if address == 0 {
            return None;
        }
        let i = self.object_index(address).or_else(|| {
            self.objects = loaded();
            self.segments = (self.objects.iter().enumerate())
                .flat_map(|(i, l)| {
                    l.segments()
                        .iter()
                        .map(move |&(start, end)| (start, end, i))
                })
                .collect();
            self.segments.sort_unstable();
            self.object_index(address)
        })?;
        Some(&self.objects[i].object)
    }

    /// The index in `objects` of the object with a segment containing `address`.
    fn object_index(&self, address: usize) -> Option<usize> {
        let after = self
            .segments
            .partition_point(|&(start, _, _)| start <= address);
        let &(_, end, i) = self.segments.get(after.checked_sub(1)?)?;
        (address < end).then_some(i)
    }

    /// The base of the loaded object containing `address` ([`Slow::object_at`]).
    fn base_of(&mut self, address: usize) -> Option<usize> {
        self.object_at(address).map(|o| o.base)
    }

    fn is_ours(&mut self, address: usize) -> bool {
        self.base_of(address) == Some(our_base())
    }

    /// Every distinct definition of `name` in the loaded objects other than ours.
    fn all_definitions(&mut self, name: &CStr) -> Vec<usize> {
        let mut found = Vec::new();
        for path in loaded().into_iter().map(|l| l.object.path) {
            if let Some(address) = self.lookup_in_scope(&path, name)
                && !found.contains(&address)
            {
                found.push(address);
            }
        }
        found
    }

    /// The helpers of the copy of ggml that defines the real function of `route`: looked up
    /// where it was found.
    fn helpers_for(&mut self, route: Route) -> &'static Helpers {
        // Found in the global scope: the helpers are the global scope's too, whichever object
        // defines the function (under base 0, which no object has).
        let base = match route.global {
            true => 0,
            false => match self.base_of(route.real) {
                Some(base) => base,
                None => return Box::leak(Box::default()),
            },
        };
        if let Some((_, helpers)) = self.helpers.iter().find(|(b, _)| *b == base) {
            return helpers;
        }
        let helpers = if route.global {
            Helpers::load(|name| self.next_global(name))
        } else {
            let Some(object) = self.object_at(route.real).cloned() else {
                return Box::leak(Box::default());
            };
            Helpers::load(|name| self.lookup_in_scope(&object.path, name))
        };
        let helpers: &'static Helpers = Box::leak(Box::new(helpers));
        self.helpers.push((base, helpers));
        helpers
    }
}

/// Where a call goes when [`resolve`] failed (our code panicked): `dlsym(RTLD_NEXT)`, else the
/// first loaded object other than ours that defines the function, else the executable's own
/// (statically linked ggml) — without the cache, the slow path's lock or its state, whatever of
/// them the failure left behind. The call is untraced.
pub fn fallback(entry: Entry) -> Option<&'static Resolved> {
    fallback_callee(Callee::Entry(entry))
}

/// [`fallback`] for any function we wrap.
pub fn fallback_callee(callee: Callee) -> Option<&'static Resolved> {
    static FOUND: [OnceLock<Option<&'static Resolved>>; 256] = [const { OnceLock::new() }; 256];
    *FOUND[callee.code()].get_or_init(|| {
        let name = callee.c_name();
        // SAFETY: dlsym with RTLD_NEXT and a valid C string.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        let real = if next != 0 && !is_ours(next) {
            next
        } else {
            loaded()
                .into_iter()
                .map(|l| l.object.path)
                .find_map(|path| {
                    // SAFETY: RTLD_NOLOAD only returns a handle for an object that is already
                    // loaded; the main program's empty path is given as NULL, its own handle.
                    let handle = unsafe {
                        libc::dlopen(
                            if path.is_empty() {
                                ptr::null()
                            } else {
                                path.as_ptr()
                            },
                            libc::RTLD_NOLOAD | libc::RTLD_LAZY,
                        )
                    };
                    if handle.is_null() {
                        return None;
                    }
                    // SAFETY: a valid handle and C string.
                    let found = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
                    (found != 0 && !is_ours(found)).then_some(found)
                })
                // The executable's own statically linked ggml, behind its inline hook.
                .or_else(|| inline_original(callee))?
        };
        Some(untraced(real))
    })
}

fn our_base() -> usize {
    static BASE: AtomicUsize = AtomicUsize::new(0);
    match BASE.load(Ordering::Relaxed) {
        0 => {
            let base = object_of(our_base as *const () as usize).map_or(usize::MAX, |o| o.base);
            BASE.store(base, Ordering::Relaxed);
            base
        }
        base => base,
    }
}

fn is_ours(address: usize) -> bool {
    object_of(address).is_some_and(|o| o.base == our_base())
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::base::os::backed_pages;

    /// Every page of the call-site cache is backed once it is asked for (this test process
    /// resolves few call sites: most of the cache's pages are untouched before).
    #[test]
    fn backing_the_call_site_cache_backs_all_of_it() {
        let pages = || backed_pages(CACHE.as_ptr().cast(), size_of_val(&CACHE));
        let before = pages();
        assert!(before.len() >= 60, "{} pages", before.len());
        assert!(before.iter().any(|&b| !b), "the cache was backed already");
        back_call_site_cache();
        assert!(pages().iter().all(|&b| b), "{:?}", pages());
    }
}
