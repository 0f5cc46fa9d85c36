// A reference for the op-timing benchmark: the cheapest possible user of the mechanism ggml-viz's
// op timing relies on. Preloaded, it installs an eval callback that asks for every node and
// records nothing around each ggml_backend_sched_graph_compute_async, so each node is computed
// and synchronized on its own exactly as with op timing. What op timing costs beyond this is ours.
//
//   cc -O2 -shared -fPIC -o noop_eval_callback.so noop_eval_callback.c -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>

typedef bool (*eval_callback)(void *tensor, bool ask, void *user_data);
typedef int (*compute_fn)(void *sched, void *graph);
typedef void (*set_callback_fn)(void *sched, eval_callback cb, void *user_data);

static bool every_node(void *tensor, bool ask, void *user_data) {
    (void)tensor; (void)ask; (void)user_data;
    return true;
}

int ggml_backend_sched_graph_compute_async(void *sched, void *graph) {
    static compute_fn real;
    static set_callback_fn set;
    if (!real) {
        real = (compute_fn)dlsym(RTLD_NEXT, "ggml_backend_sched_graph_compute_async");
        set = (set_callback_fn)dlsym(RTLD_NEXT, "ggml_backend_sched_set_eval_callback");
    }
    set(sched, every_node, 0);
    int status = real(sched, graph);
    set(sched, 0, 0);
    return status;
}
