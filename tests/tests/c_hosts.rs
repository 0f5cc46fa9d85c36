//! C programs the tests generate and build against the llama.cpp build's ggml, for what a
//! Python host cannot do: thousands of distinct call sites, threads that fork mid-call, a call
//! made with the stack pointer next to an inaccessible page.

use std::path::{Path, PathBuf};
use std::process::Command;

use ggml_viz_e2e::*;

/// `source`, a C program, built against the llama.cpp build's ggml (`flags`: more for `cc`).
fn build_c(dir: &Path, name: &str, source: &str, flags: &[String]) -> PathBuf {
    let file = dir.join(format!("{name}.c"));
    std::fs::write(&file, source).unwrap();
    let bin = llama_bin();
    let exe = dir.join(name);
    let built = run({
        let mut cc = Command::new("cc");
        cc.arg("-O0")
            .arg(&file)
            .arg("-o")
            .arg(&exe)
            .args(flags)
            .arg(format!("-L{}", bin.display()))
            .args(["-lggml-cpu", "-lggml-base", "-lpthread"])
            .arg(format!("-Wl,-rpath,{}", bin.display()));
        cc
    });
    assert!(built.status.success(), "{}", text(&built.stderr));
    exe
}

const PROLOGUE: &str = "#include <stdio.h>\n\
    #include <pthread.h>\n\
    #include <signal.h>\n\
    #include <sys/wait.h>\n\
    #include <unistd.h>\n\
    typedef struct ggml_backend * ggml_backend_t;\n\
    ggml_backend_t ggml_backend_cpu_init(void);\n\
    void ggml_backend_synchronize(ggml_backend_t);\n\
    void ggml_backend_free(ggml_backend_t);\n";

/// `n` distinct call sites of `ggml_backend_synchronize(b)`.
fn call_sites(n: usize) -> String {
    "    ggml_backend_synchronize(b);\n".repeat(n)
}

/// A C program with `sites` distinct call sites of `ggml_backend_synchronize`, each run
/// `rounds` times.
fn many_call_sites(dir: &Path, sites: usize, rounds: usize) -> PathBuf {
    let source = format!(
        "{PROLOGUE}int main(void) {{\n  ggml_backend_t b = ggml_backend_cpu_init();\n  \
         for (int r = 0; r < {rounds}; r++) {{\n{}  }}\n  \
         printf(\"calls=%d\\n\", {rounds} * {sites});\n  ggml_backend_free(b);\n  return 0;\n}}\n",
        call_sites(sites)
    );
    build_c(dir, &format!("sites{sites}"), &source, &[])
}

/// Every call site is resolved once, however many times it calls: with `verbose`, each fresh
/// resolution says where the site goes. Past the hook's cache (12288 sites), new sites reuse
/// their entry's first uncached resolution, said once (before: a cache of 1024, and each call of
/// a site past it took the slow path again, leaking memory each time).
#[test]
fn each_call_site_is_resolved_once_even_past_the_cache() {
    let dir = scratch("call-sites");
    let rounds = 3;
    for sites in [1500, 13000] {
        let exe = many_call_sites(&dir, sites, rounds);
        let trace = dir.join(format!("{sites}.ggmlviz"));
        let out = run(with_hook(
            Command::new(&exe),
            &[
                ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
                ("GGML_VIZ_VERBOSE", "1"),
            ],
        ));
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout).trim(),
            format!("calls={}", sites * rounds)
        );
        let lines = hook_lines(&out.stderr);
        let resolved = lines.iter().filter(|l| l.contains(" called from ")).count();
        let past = lines
            .iter()
            .filter(|l| l.contains("call sites of ggml"))
            .count();
        if sites < 12288 {
            assert_eq!((resolved, past), (sites, 0), "{sites} sites");
        } else {
            assert!(
                resolved <= sites,
                "{resolved} resolutions for {sites} sites"
            );
            assert_eq!(past, 1, "{sites} sites");
        }
    }
}

/// An OpenMP program that never calls ggml: its `GOMP_barrier` calls reach the hook's wrapper
/// (which ggml's inlined barriers need, see the threads tests), bound there by the dynamic
/// loader, and go on to OpenMP's: the program computes what it computes without the hook, says
/// nothing more, and no trace is written.
#[test]
fn an_openmp_program_that_never_calls_ggml_keeps_its_barriers() {
    let dir = scratch("openmp");
    // Each round, each thread writes its slot, waits, reads its neighbour's, waits: a barrier
    // that did not wait would read a slot of another round. Waiting threads sleep rather than
    // spin (4 threads on the 2 cores, beside the other tests).
    let rounds: u64 = 2000;
    let source = format!(
        "#include <stdio.h>\n#include <omp.h>\nint main(void) {{\n  \
         volatile long slot[4] = {{0}}; long total = 0; int threads = 0;\n  \
         #pragma omp parallel num_threads(4) reduction(+:total)\n  {{\n    \
         int t = omp_get_thread_num(), n = omp_get_num_threads();\n    \
         if (t == 0) threads = n;\n    \
         for (long i = 0; i < {rounds}; i++) {{\n      slot[t] = i * (t + 1);\n      \
         #pragma omp barrier\n      total += slot[(t + 1) % n];\n      \
         #pragma omp barrier\n    }}\n  }}\n  \
         printf(\"threads=%d total=%ld\\n\", threads, total);\n  return 0;\n}}\n"
    );
    let exe = build_c(&dir, "barriers", &source, &["-fopenmp".to_string()]);
    let traces = dir.join("traces");
    std::fs::create_dir(&traces).unwrap();
    let mut program = Command::new(&exe);
    program.env_remove("OMP_THREAD_LIMIT");
    let hooked = run(with_hook(
        program,
        &[
            (
                "GGML_VIZ_OUTPUT",
                traces.join("t.ggmlviz").to_str().unwrap(),
            ),
            ("OMP_WAIT_POLICY", "passive"),
            ("LD_DEBUG", "bindings"),
            ("LD_DEBUG_OUTPUT", dir.join("bindings").to_str().unwrap()),
        ],
    ));
    assert!(hooked.status.success(), "{}", text(&hooked.stderr));
    // Each of the 4 threads reads, every round, i * (its neighbour's index + 1): the indices
    // 1..=4 once each.
    let expected = (0..rounds).sum::<u64>() * (1..=4).sum::<u64>();
    assert_eq!(
        text(&hooked.stdout),
        format!("threads=4 total={expected}\n")
    );
    assert_eq!(text(&hooked.stderr), "");
    assert_eq!(std::fs::read_dir(&traces).unwrap().count(), 0, "a trace");
    let bindings: String = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("bindings")
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(
        bindings.lines().any(|l| l.contains("libggml_viz_hook")
            && l.contains("`GOMP_barrier'")
            && l.contains(exe.file_name().unwrap().to_str().unwrap())),
        "GOMP_barrier is not bound to the hook"
    );
}

/// A thread resolves thousands of new call sites (the resolver's slow path, under its lock)
/// while the main thread forks 20 children, each making a call of its own and exiting. No child
/// may hang: the lock is taken around `fork` and released in both processes (before: most
/// children deadlocked on a lock held by a thread that does not exist in them). The resolver
/// works in 20 chunks of 500 new sites (about 0.8 ms each here) and starts chunk k+1 only after
/// fork k; fork k waits, spinning, for chunk k to start; the two threads are pinned to two CPUs.
/// On an idle machine nearly every fork falls inside the resolving (before: one burst of 10000
/// sites, which a loaded machine finished before the first fork; and two threads left on one
/// CPU took turns a whole chunk long). Measured with three busy loops beside it: 4-10
/// of 40 forks in 250-site chunks fell inside, 1-11 of 20 in 500-site ones; so the program
/// runs again until 5 forks in all did.
#[test]
fn children_forked_while_another_thread_resolves_never_hang() {
    let dir = scratch("fork-resolving");
    let chunks: String = (0..20)
        .map(|k| format!("static void chunk{k}(void) {{\n{}}}\n", call_sites(500)))
        .collect();
    let table: Vec<String> = (0..20).map(|k| format!("chunk{k}")).collect();
    let source = format!(
        "#define _GNU_SOURCE\n{PROLOGUE}#include <sched.h>\nstatic ggml_backend_t b;\n{chunks}\
         static void (*const chunk[20])(void) = {{{}}};\n\
         static volatile int begun = 0, ended = 0, forks = 0;\n\
         static void pin(int cpu) {{\n  cpu_set_t s;\n  CPU_ZERO(&s);\n  CPU_SET(cpu, &s);\n  \
         pthread_setaffinity_np(pthread_self(), sizeof s, &s);\n}}\n\
         static void *resolver(void *arg) {{\n  pin(1);\n  for (int k = 0; k < 20; k++) {{\n    \
         begun = k + 1;\n    chunk[k]();\n    ended = k + 1;\n    \
         while (forks <= k) sched_yield();\n  }}\n  return arg;\n}}\n\
         int main(void) {{\n  b = ggml_backend_cpu_init();\n  ggml_backend_synchronize(b);\n  \
         pin(0);\n  pthread_t t;\n  pthread_create(&t, NULL, resolver, NULL);\n  \
         int during = 0, hung = 0;\n  pid_t pids[20];\n  \
         while (forks < 20) {{\n    while (begun <= forks) {{}}\n    \
         if (ended <= forks) during++;\n    pid_t pid = fork();\n    \
         if (pid == 0) {{\n      alarm(5);\n      ggml_backend_synchronize(b);\n      _exit(0);\n    }}\n    \
         pids[forks] = pid;\n    forks = forks + 1;\n  }}\n  \
         for (int i = 0; i < 20; i++) {{\n    int status;\n    waitpid(pids[i], &status, 0);\n    \
         if (WIFSIGNALED(status)) hung++;\n  }}\n  pthread_join(t, NULL);\n  \
         printf(\"forks=%d during=%d hung=%d\\n\", forks, during, hung);\n  return 0;\n}}\n",
        table.join(", ")
    );
    let exe = build_c(&dir, "fork_resolving", &source, &[]);
    // Runs until 5 forks in all fell inside the resolving, 5 runs at most.
    let (mut during, mut runs) = (0, 0);
    while during < 5 && runs < 5 {
        runs += 1;
        let out = run(with_hook(
            Command::new(&exe),
            &[(
                "GGML_VIZ_OUTPUT",
                dir.join("t-%p.ggmlviz").to_str().unwrap(),
            )],
        ));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let field = |name: &str| -> usize {
            stdout
                .split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {stdout}"))
        };
        assert_eq!(field("forks"), 20);
        assert_eq!(field("hung"), 0, "{stdout}");
        during += field("during");
    }
    assert!(
        during >= 5,
        "too few forks while resolving to check anything: {during} in {runs} runs"
    );
}

/// The ggml source the llama.cpp build was configured from (its `CMakeCache.txt` says).
fn ggml_source() -> PathBuf {
    let cache = llama_bin().join("../CMakeCache.txt");
    let cache = std::fs::read_to_string(&cache).unwrap_or_else(|e| panic!("{cache:?}: {e}"));
    let home = cache
        .lines()
        .find_map(|l| l.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .expect("CMAKE_HOME_DIRECTORY in CMakeCache.txt");
    PathBuf::from(home).join("ggml")
}

/// `source`, a C program on this llama.cpp's `llama.h`, built as `dir/name` against its
/// libllama.
fn build_on_llama(dir: &Path, name: &str, source: &str) -> PathBuf {
    let llama = ggml_source().join("..");
    let file = dir.join(format!("{name}.c"));
    std::fs::write(&file, source).unwrap();
    let exe = dir.join(name);
    let bin = llama_bin();
    let built = run({
        let mut cc = Command::new("cc");
        cc.arg(&file)
            .arg("-o")
            .arg(&exe)
            .arg(format!("-I{}", llama.join("include").display()))
            .arg(format!("-I{}", llama.join("ggml/include").display()))
            .arg(format!("-L{}", bin.display()))
            .args(["-lllama", "-lggml-base"])
            .arg(format!("-Wl,-rpath,{}", bin.display()));
        cc
    });
    assert!(built.status.success(), "{}", text(&built.stderr));
    exe
}

/// The llama calls' spans of an import, in order: name, tokens and tokens by sequence.
fn llama_spans(
    c: &ggml_viz_reader::telemetry::Collected,
) -> Vec<(String, Option<String>, Option<String>)> {
    (c.spans.iter())
        .filter(|s| s.name.starts_with("llama_"))
        .map(|s| {
            let arg = |key: &str| {
                (s.args.iter())
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.to_string())
            };
            (s.name.to_string(), arg("n_tokens"), arg("seq_tokens"))
        })
        .collect()
}

/// `ggml_backend_buffer_init` takes `struct ggml_backend_buffer_i` by value, which x86-64 passes
/// in the caller's stack frame. A C program (built against this ggml's own
/// `ggml-backend-impl.h`) calls it with its stack pointer placed so that the struct ends within 16
/// bytes of an inaccessible page, then checks the buffer it got: its base and size, and that
/// freeing it calls the interface's `free_buffer`. Nothing past the struct may be read (before:
/// the hook took 16 words by value, 40 bytes past this ggml's 11, and the program died of
/// SIGSEGV). The trace holds the buffer's allocation with its size.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_buffer_interface_is_passed_on_without_reading_past_it() {
    let dir = scratch("buffer-iface-edge");
    let ggml = ggml_source();
    let source = r#"#define _GNU_SOURCE
#include <stdio.h>
#include <sys/mman.h>
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-backend-impl.h"

static char memory[256];
static int freed = 0;
static void free_buffer(ggml_backend_buffer_t b) { (void)b; freed++; }
static void *get_base(ggml_backend_buffer_t b) { (void)b; return memory; }

/* fn(buft, iface, context, size) called with the stack pointer at `sp`, where the struct is. */
static ggml_backend_buffer_t call_at(void *fn, char *sp, ggml_backend_buffer_type_t buft,
                                     void *context, size_t size) {
    ggml_backend_buffer_t r;
    __asm__ volatile("mov %%rsp, %%rbx\n\tmov %[sp], %%rsp\n\tcall *%[fn]\n\tmov %%rbx, %%rsp"
                     : "=a"(r)
                     : [fn] "r"(fn), [sp] "r"(sp), "D"(buft), "S"(context), "d"(size)
                     : "rbx", "rcx", "r8", "r9", "r10", "r11", "memory", "cc", "xmm0", "xmm1",
                       "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                       "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
    return r;
}

int main(void) {
    /* Start the hook (and its recorder) on the normal stack. */
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_synchronize(cpu);
    size_t stack = 1 << 20, page = 4096;
    char *low = mmap(NULL, stack + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (low == MAP_FAILED || mprotect(low + stack, page, PROT_NONE)) { perror("mmap"); return 2; }
    struct ggml_backend_buffer_i iface = {0};
    iface.free_buffer = free_buffer;
    iface.get_base = get_base;
    size_t room = (sizeof iface + 15) & ~(size_t)15;
    char *sp = low + stack - room;
    *(struct ggml_backend_buffer_i *)sp = iface;
    ggml_backend_buffer_t b = call_at((void *)ggml_backend_buffer_init, sp,
                                      ggml_backend_cpu_buffer_type(), NULL, 64);
    int base_ok = b && ggml_backend_buffer_get_base(b) == (void *)memory;
    size_t size = b ? ggml_backend_buffer_get_size(b) : 0;
    ggml_backend_buffer_free(b);
    printf("iface=%zu room=%zu base_ok=%d size=%zu freed=%d\n", sizeof iface, room, base_ok, size, freed);
    ggml_backend_free(cpu);
    return 0;
}
"#;
    let exe = build_c(
        &dir,
        "edge",
        source,
        &[
            format!("-I{}", ggml.join("include").display()),
            format!("-I{}", ggml.join("src").display()),
        ],
    );
    let plain = run(Command::new(&exe));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let trace = dir.join("t.ggmlviz");
    let out = run(with_hook(
        Command::new(&exe),
        &[
            ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
            ("GGML_VIZ_MEMORY_TRACKING", "1"),
        ],
    ));
    assert!(
        out.status.success(),
        "{:?} {}",
        out.status,
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert_eq!(stdout, text(&plain.stdout));
    assert!(stdout.contains("base_ok=1 size=64 freed=1"), "{stdout}");
    let (events, damage, _) = read_trace(&trace);
    assert_eq!(damage, None);
    assert_eq!(alloc_sizes(&events), [64]);
}

/// A process with ggml-rpc's C API but another transport (here: an executable defining
/// `ggml_backend_rpc_add_server` itself, without the `socket_t` methods the hook wraps, as a
/// ggml-rpc whose transport was renamed would be): the hook says so once, records no RPC
/// command, and the program runs on.
#[test]
fn a_ggml_rpc_without_the_known_transport_is_said_once() {
    let dir = scratch("c-rpc-names");
    let source = format!(
        "{PROLOGUE}void * ggml_backend_rpc_add_server(const char * endpoint) {{ (void) endpoint; return 0; }}\n\
         int main(void) {{\n  ggml_backend_t b = ggml_backend_cpu_init();\n{}  \
         printf(\"done\\n\");\n  ggml_backend_free(b);\n  return 0;\n}}\n",
        call_sites(3)
    );
    let exe = build_c(&dir, "rpc_names", &source, &["-rdynamic".to_string()]);
    let trace = dir.join("t.ggmlviz");
    let out = run(with_hook(
        Command::new(&exe),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "done\n");
    let said: Vec<String> = hook_lines(&out.stderr)
        .into_iter()
        .filter(|l| l.contains("transport is not the one this hook knows"))
        .collect();
    assert_eq!(said.len(), 1, "{}", text(&out.stderr));
    assert!(
        said[0].contains("_ZN8socket_t9send_dataEPKvm"),
        "{}",
        said[0]
    );
    // The program itself was traced as usual: its three synchronize calls.
    let (events, damage, _) = read_trace(&trace);
    assert!(damage.is_none());
    let waits = events
        .iter()
        .filter(|e| e.event_type() == Some(ggml_viz_reader::EventType::BarrierWait))
        .filter(|e| {
            e.label_str()
                .is_some_and(|l| l.starts_with("ggml_backend_synchronize"))
        })
        .count();
    assert_eq!(waits, 3);

    // Without ggml-rpc's C API there is nothing to say.
    let plain = build_c(
        &dir,
        "no_rpc",
        &format!(
            "{PROLOGUE}int main(void) {{\n  ggml_backend_t b = ggml_backend_cpu_init();\n{}  \
             ggml_backend_free(b);\n  return 0;\n}}\n",
            call_sites(1)
        ),
        &[],
    );
    let out = run(with_hook(
        Command::new(&plain),
        &[("GGML_VIZ_OUTPUT", dir.join("u.ggmlviz").to_str().unwrap())],
    ));
    assert!(out.status.success());
    assert!(
        !text(&out.stderr).contains("transport is not"),
        "{}",
        text(&out.stderr)
    );
}

/// A C program (built against this llama.cpp's `llama.h`) decodes two batches and prints what it
/// put in them and the logits:
/// - a classic `llama_batch` through `llama_decode`: 3 prompt tokens shared by sequences 2 and 3
///   (`n_seq_id` 2), then one token of each: 4 tokens for each sequence in a batch of 5;
/// - a `llama_batch_ext` of input embeddings through `llama_process`: 3 for sequence 0 and 4 for
///   sequence 1, as a multimodal server adds an image's (`llama_batch_ext_add_embd` takes
///   `struct llama_embd` by value, in the caller's stack frame on x86-64).
///
/// With the hook: the same indices and logits, and each decode span holds its batch's tokens by
/// sequence (before: neither batch's sequences were counted).
#[test]
fn input_embeddings_and_classic_batches_are_counted_by_sequence() {
    let dir = scratch("embd-batch");
    let source = r#"#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

int main(int argc, char ** argv) {
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 64;
    cp.n_seq_max = 4;
    cp.kv_unified = true;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!model || !ctx) return 2;

    struct llama_batch classic = llama_batch_init(8, 0, 2);
    for (int i = 0; i < 5; i++) {
        const int shared = i < 3;
        classic.token[i] = 10 + i;
        classic.pos[i] = shared ? i : 3;
        classic.n_seq_id[i] = shared ? 2 : 1;
        classic.seq_id[i][0] = shared ? 2 : i - 1;
        classic.seq_id[i][1] = 3;
        classic.logits[i] = i == 4;
        printf("classic token %d in %d sequence(s)\n", i, classic.n_seq_id[i]);
    }
    classic.n_tokens = 5;
    const int decoded = llama_decode(ctx, classic);
    const float * first = llama_get_logits_ith(ctx, -1);
    printf("decode %d logits %.6f %.6f\n", decoded, first[0], first[1]);
    llama_batch_free(classic);

    const int n_embd = llama_model_n_embd(model);
    float * rows = malloc(sizeof(float) * 4 * n_embd);
    for (int i = 0; i < 4 * n_embd; i++) rows[i] = (float) ((i * 37) % 101) / 101.0f - 0.5f;
    struct llama_batch_ext * batch = llama_batch_ext_init(ctx);
    int last = -1;
    for (int seq = 0; seq < 2; seq++) {
        for (int i = 0; i < 3 + seq; i++) {
            struct llama_embd embd = { rows + (size_t) i * n_embd, 1, (size_t) n_embd };
            last = llama_batch_ext_add_embd(batch, seq, embd);
            llama_pos pos[4] = { i, 0, 0, 0 };
            if (last < 0 || !llama_batch_ext_set_pos(batch, last, pos)) return 3;
            printf("seq %d index %d\n", seq, last);
        }
    }
    llama_batch_ext_set_output_logits(batch, last, true);
    const int ret = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
    const float * logits = llama_get_logits_ith(ctx, -1);
    printf("process %d logits %.6f %.6f %.6f\n", ret, logits[0], logits[1], logits[2]);
    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    free(rows);
    return ret;
}
"#;
    let exe = build_on_llama(&dir, "embd", source);
    let program = || {
        let mut c = Command::new(&exe);
        c.arg(tiny_model());
        c
    };
    let plain = run(program());
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let said = text(&plain.stdout);
    let indices: Vec<&str> = said.lines().filter(|l| l.starts_with("seq ")).collect();
    assert_eq!(indices.len(), 7, "{said}");
    assert!(said.contains("decode 0 logits"), "{said}");
    assert!(said.contains("process 0 logits"), "{said}");

    let trace = dir.join("embd.ggmlviz");
    let hooked = run(with_hook(
        program(),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(hooked.status.success(), "{}", text(&hooked.stderr));
    assert_eq!(
        text(&hooked.stdout),
        said,
        "the hook changed the embeddings' batch"
    );
    let c = collected(&trace);
    let decodes: Vec<_> = (llama_spans(&c).into_iter())
        .filter(|s| s.0 == "llama_decode")
        .map(|s| (s.1, s.2))
        .collect();
    let expected = |n: &str, seqs: &str| (Some(n.to_string()), Some(seqs.to_string()));
    assert_eq!(
        decodes,
        [expected("5", "2:4 3:4"), expected("7", "0:3 1:4")],
        "the classic batch, then the embeddings"
    );
}

/// `llama_decode` and `llama_encode` take `struct llama_batch` by value, whose layout changed:
/// before llama.cpp #9745 it had three more fields (72 bytes, `all_pos_0`, `all_pos_1`,
/// `all_seq_id` after today's seven). A library built with that old struct gets every byte of
/// its caller's batch through the hook, enabled or disabled (before: the hook copied today's 56
/// bytes, and the last three fields arrived as `0 0 167772160`, read from the hook's stack), and
/// the hook still counts the batch's tokens by sequence.
#[test]
fn an_older_llama_batch_reaches_the_library_whole() {
    let dir = scratch("old-batch");
    let batch = "struct llama_batch {\n\
        int n_tokens; int *token; float *embd; int *pos; int *n_seq_id; int **seq_id;\n\
        signed char *logits; int all_pos_0; int all_pos_1; int all_seq_id; };\n";
    let library = format!(
        "#include <stdio.h>\n{batch}\
         static int call(const char *name, void *ctx, struct llama_batch b) {{\n\
           printf(\"%s ctx=%p n_tokens=%d all_pos_0=%d all_pos_1=%d all_seq_id=%d\", name, ctx,\n\
                  b.n_tokens, b.all_pos_0, b.all_pos_1, b.all_seq_id);\n\
           for (int i = 0; i < b.n_tokens; i++)\n\
             printf(\" token%d=%d seq=%d/%d logits=%d\", i, b.token[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i]);\n\
           printf(\"\\n\");\n\
           return 40 + b.n_tokens;\n\
         }}\n\
         int llama_decode(void *ctx, struct llama_batch b) {{ return call(\"decode\", ctx, b); }}\n\
         int llama_encode(void *ctx, struct llama_batch b) {{ return call(\"encode\", ctx, b); }}\n"
    );
    let host = format!(
        "#include <stdio.h>\n{batch}\
         int llama_decode(void *ctx, struct llama_batch b);\n\
         int llama_encode(void *ctx, struct llama_batch b);\n\
         int main(void) {{\n\
           int token[3] = {{11, 12, 13}}, pos[3] = {{0, 1, 2}}, n_seq_id[3] = {{1, 1, 1}};\n\
           int s0 = 0, s1 = 1; int *seq_id[3] = {{&s0, &s0, &s1}};\n\
           signed char logits[3] = {{0, 0, 1}};\n\
           struct llama_batch b = {{3, token, 0, pos, n_seq_id, seq_id, logits, 100, 1, 7}};\n\
           printf(\"decode returned %d\\n\", llama_decode((void *)0x1234, b));\n\
           b.n_tokens = 2; b.all_pos_0 = -5; b.all_pos_1 = 3; b.all_seq_id = 9;\n\
           printf(\"encode returned %d\\n\", llama_encode((void *)0x5678, b));\n\
           return 0;\n\
         }}\n"
    );
    std::fs::write(dir.join("llama_old.c"), library).unwrap();
    std::fs::write(dir.join("host.c"), host).unwrap();
    for args in [
        vec![
            "-shared",
            "-fPIC",
            "-O1",
            "llama_old.c",
            "-o",
            "libllama.so",
        ],
        vec![
            "-O1",
            "host.c",
            "-o",
            "host",
            "-L.",
            "-lllama",
            "-Wl,-rpath,$ORIGIN",
        ],
    ] {
        let built = run({
            let mut cc = Command::new("cc");
            cc.current_dir(&dir).args(args);
            cc
        });
        assert!(built.status.success(), "{}", text(&built.stderr));
    }
    let expected = "decode ctx=0x1234 n_tokens=3 all_pos_0=100 all_pos_1=1 all_seq_id=7 \
        token0=11 seq=1/0 logits=0 token1=12 seq=1/0 logits=0 token2=13 seq=1/1 logits=1\n\
        decode returned 43\n\
        encode ctx=0x5678 n_tokens=2 all_pos_0=-5 all_pos_1=3 all_seq_id=9 \
        token0=11 seq=1/0 logits=0 token1=12 seq=1/0 logits=0\n\
        encode returned 42\n";
    let plain = run(Command::new(dir.join("host")));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    assert_eq!(text(&plain.stdout), expected, "the host itself");

    let trace = dir.join("old.ggmlviz");
    for disable in ["1", "0"] {
        let hooked = run(with_hook(
            Command::new(dir.join("host")),
            &[
                ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
                ("GGML_VIZ_DISABLE", disable),
            ],
        ));
        assert!(hooked.status.success(), "{}", text(&hooked.stderr));
        assert_eq!(text(&hooked.stdout), expected, "GGML_VIZ_DISABLE={disable}");
    }
    let c = collected(&trace);
    let spans = llama_spans(&c);
    let span = |name: &str, n: &str, seqs: Option<&str>| {
        (
            name.to_string(),
            Some(n.to_string()),
            seqs.map(str::to_string),
        )
    };
    assert_eq!(
        spans,
        [
            span("llama_decode", "3", Some("0:2 1:1")),
            span("llama_encode", "2", None)
        ]
    );
}

/// Batches made and freed one after another, more of them than the hook's 64 slots, most at a
/// freed one's address (a C host on this llama.cpp's `llama_batch_ext`, each batch of 1–3
/// tokens of sequence 0 or 1, decoded through `llama_process`, then freed): every decode span
/// carries its own batch's tokens and sequences (before: a batch at a reused address started
/// with the old batch's counts, and past 64 batches the counts were unknown).
#[test]
fn freed_batches_leave_nothing_to_the_next() {
    let dir = scratch("batch-free");
    let source = r#"#include <stdio.h>
#include "llama.h"

int main(int argc, char ** argv) {
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 64;
    cp.n_batch = 16;
    cp.n_seq_max = 2;
    cp.kv_unified = true;
    cp.n_threads = cp.n_threads_batch = 1;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!model || !ctx) return 2;
    struct llama_batch_ext * previous = NULL;
    int reused = 0;
    for (int i = 0; i < 70; i++) {
        struct llama_batch_ext * batch = llama_batch_ext_init(ctx);
        reused += batch == previous;
        previous = batch;
        const int n = 1 + i % 3, seq = i % 2;
        llama_memory_clear(llama_get_memory(ctx), true);
        for (int t = 0; t < n; t++) {
            const int idx = llama_batch_ext_add_token(batch, seq, 10 + t);
            llama_pos pos[4] = { t, 0, 0, 0 };
            if (idx != t || !llama_batch_ext_set_pos(batch, idx, pos)) return 3;
        }
        llama_batch_ext_set_output_logits(batch, n - 1, true);
        const int ret = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
        printf("batch %d: %d token(s) of sequence %d, process %d\n", i, n, seq, ret);
        llama_batch_ext_free(batch);
    }
    printf("reused %d\n", reused);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
"#;
    let exe = build_on_llama(&dir, "batches", source);
    let program = || {
        let mut c = Command::new(&exe);
        c.arg(tiny_model());
        c
    };
    let plain = run(program());
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let said = text(&plain.stdout);
    // What the program says it put in each batch, and that most addresses came back.
    let batches: Vec<(String, String)> = (said.lines())
        .filter_map(|l| {
            let (n, seq) = l.split_once(" token(s) of sequence ")?;
            let n = n.rsplit(' ').next()?;
            let seq = seq.split(',').next()?;
            assert!(l.ends_with("process 0"), "{l}");
            Some((n.to_string(), format!("{seq}:{n}")))
        })
        .collect();
    assert_eq!(batches.len(), 70, "{said}");
    let reused: u32 = said
        .lines()
        .find_map(|l| l.strip_prefix("reused ")?.parse().ok())
        .unwrap();
    assert!(
        reused > 30,
        "addresses were not reused, so this checks little: {said}"
    );

    let trace = dir.join("batches.ggmlviz");
    let hooked = run(with_hook(
        program(),
        &[("GGML_VIZ_OUTPUT", trace.to_str().unwrap())],
    ));
    assert!(hooked.status.success(), "{}", text(&hooked.stderr));
    let c = collected(&trace);
    let decodes: Vec<(String, String)> = (llama_spans(&c).into_iter())
        .filter(|s| s.0 == "llama_decode")
        .map(|s| (s.1.unwrap_or_default(), s.2.unwrap_or_default()))
        .collect();
    assert_eq!(decodes, batches);
}

/// C++ exceptions thrown by a wrapped function toward its caller (llama.cpp's `llama_decode` has
/// no catch; ggml-vulkan rethrows a lost device; `new` fails in a buffer's making): a C++ library
/// whose `llama_decode`, `llama_encode`, `llama_memory_seq_rm` and `ggml_backend_buffer_init`
/// throw, and a host (built -O2, values live in callee-saved registers across each call) that
/// catches them. With the hook, enabled or disabled, the host prints the same lines: every
/// exception reaches its handler, the registers the host kept come back, and decodes after them
/// (more throws than the hook nests calls) are still counted (before: every throw through a
/// wrapper terminated the host).
#[test]
fn exceptions_thrown_through_the_wrappers_reach_the_host() {
    let dir = scratch("exceptions");
    let declarations = "struct llama_batch { int n_tokens; int *token; float *embd; int *pos;\n\
        int *n_seq_id; int **seq_id; signed char *logits; };\n\
        struct iface { void *f[11]; };\n\
        extern \"C\" int llama_decode(void *ctx, llama_batch b);\n\
        extern \"C\" int llama_encode(void *ctx, llama_batch b);\n\
        extern \"C\" bool llama_memory_seq_rm(void *mem, int seq, int p0, int p1);\n\
        extern \"C\" void *ggml_backend_buffer_init(void *buft, iface i, void *ctx, unsigned long size);\n";
    let library = format!(
        "#include <new>\n#include <stdexcept>\n{declarations}\
         int llama_decode(void *, llama_batch b) {{\n\
           if (b.n_tokens < 0) throw std::runtime_error(\"a batch of no tokens\");\n\
           return 40 + b.n_tokens;\n\
         }}\n\
         int llama_encode(void *, llama_batch) {{ throw std::logic_error(\"no encoder\"); }}\n\
         bool llama_memory_seq_rm(void *, int seq, int, int) {{ throw std::out_of_range(\"sequence \" + std::to_string(seq)); }}\n\
         void *ggml_backend_buffer_init(void *, iface, void *, unsigned long) {{ throw std::bad_alloc(); }}\n"
    );
    let host = format!(
        "#include <cstdio>\n#include <cstdlib>\n#include <exception>\n{declarations}\
         template <class F> static long attempt(const char *what, F f, long a, long b, long c, long d, long e) {{\n\
           try {{ long r = f(); std::printf(\"%s returned %ld\\n\", what, r); }}\n\
           catch (const std::exception &x) {{ std::printf(\"%s threw: %s\\n\", what, x.what()); }}\n\
           return a * 3 + b * 5 + c * 7 + d * 11 + e * 13;\n\
         }}\n\
         int main(int argc, char **) {{\n\
           int token[2] = {{1, 2}}, n_seq_id[2] = {{1, 1}}, s0 = 0; int *seq_id[2] = {{&s0, &s0}};\n\
           signed char logits[2] = {{0, 1}};\n\
           llama_batch good = {{2, token, 0, 0, n_seq_id, seq_id, logits}}, bad = good;\n\
           bad.n_tokens = -1;\n\
           long a = argc * 17, b = argc * 19, c = argc * 23, d = argc * 29, e = argc * 31, kept = 0;\n\
           kept += attempt(\"decode\", [&] {{ return (long) llama_decode((void *) 1, good); }}, a, b, c, d, e);\n\
           for (int round = 0; round < 6; round++)\n\
             kept += attempt(\"decode\", [&] {{ return (long) llama_decode((void *) 1, bad); }}, a + round, b, c, d, e);\n\
           kept += attempt(\"encode\", [&] {{ return (long) llama_encode((void *) 1, good); }}, a, b, c, d, e);\n\
           kept += attempt(\"seq_rm\", [&] {{ return (long) llama_memory_seq_rm((void *) 1, 3, 0, -1); }}, a, b, c, d, e);\n\
           iface i = {{}};\n\
           kept += attempt(\"buffer\", [&] {{ return (long) ggml_backend_buffer_init((void *) 1, i, 0, 64); }}, a, b, c, d, e);\n\
           kept += attempt(\"decode\", [&] {{ return (long) llama_decode((void *) 1, good); }}, a, b, c, d, e);\n\
           std::printf(\"kept %ld\\n\", kept + a + b + c + d + e);\n\
           return 0;\n\
         }}\n"
    );
    std::fs::write(dir.join("throwing.cpp"), library).unwrap();
    std::fs::write(dir.join("host.cpp"), host).unwrap();
    for args in [
        vec![
            "-shared",
            "-fPIC",
            "-O1",
            "throwing.cpp",
            "-o",
            "libthrowing.so",
        ],
        vec![
            "-O2",
            "host.cpp",
            "-o",
            "host",
            "-L.",
            "-lthrowing",
            "-Wl,-rpath,$ORIGIN",
        ],
    ] {
        let built = run({
            let mut cxx = Command::new("g++");
            cxx.current_dir(&dir).args(args);
            cxx
        });
        assert!(built.status.success(), "{}", text(&built.stderr));
    }
    let plain = run(Command::new(dir.join("host")));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let expected = text(&plain.stdout);
    assert_eq!(expected.matches(" threw: ").count(), 9, "{expected}");
    assert_eq!(
        expected.matches("decode returned 42").count(),
        2,
        "{expected}"
    );

    let trace = dir.join("t.ggmlviz");
    for disable in ["1", "0"] {
        let hooked = run(with_hook(
            Command::new(dir.join("host")),
            &[
                ("GGML_VIZ_OUTPUT", trace.to_str().unwrap()),
                ("GGML_VIZ_DISABLE", disable),
            ],
        ));
        assert!(
            hooked.status.success(),
            "GGML_VIZ_DISABLE={disable}: {:?} {}",
            hooked.status,
            text(&hooked.stderr)
        );
        assert_eq!(text(&hooked.stdout), expected, "GGML_VIZ_DISABLE={disable}");
    }
    // Traced: both good decodes' spans whole, with their tokens, the last after every throw.
    let c = collected(&trace);
    let whole: Vec<_> = (c.spans.iter())
        .filter(|s| s.name == "llama_decode" && s.end_ns > s.start_ns)
        .filter_map(|s| {
            s.args
                .iter()
                .find(|(k, _)| k == "n_tokens")
                .map(|(_, v)| v.to_string())
        })
        .collect();
    assert!(whole.iter().filter(|n| *n == "2").count() == 2, "{whole:?}");
}
