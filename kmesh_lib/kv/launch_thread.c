/* A native thread that launches captured CUDA graphs for the engine's thread (kv/launch_thread.py).
 *
 * The engine thread writes a restore copy's arguments, puts the launch in a ring slot and publishes it by
 * storing num_requested (no call, no lock, no wake-up: on the H200 machine's VM a condition variable's wake
 * cost the engine thread about 25 us and the launch thread 50 us more to run). This thread polls for it: it
 * spins for spin_ns after its last launch, then sleeps poll_ns at a time between looks; it makes the driver
 * call (cuGraphLaunch, or any function of the same shape: tests pass one in) in request order, stamps it
 * (CLOCK_MONOTONIC, Python's time.monotonic_ns) and publishes how many it has made (num_launched). With
 * min_delay_ns set, a launch begins no sooner than that long after its request's stamp (an experiment: on the H200
 * the engine thread stalled when the launch began within ~5 us of the request).
 *
 * A request may name an event to watch (its copy's last event): between launches the thread queries it (query,
 * cuEventQuery; at most once per watch_ns, so it seldom contends with the engine thread's own driver calls) and
 * publishes how many launches' watched events it has seen complete (num_ended), so the engine thread learns that
 * a copy has ended by reading a counter where it would otherwise query the event itself (a driver call through
 * torch, about 8 us on the H200 host with the step's caches cold). A query that fails (neither success nor
 * not-ready) stops the watching for good (watch_err); the engine thread then queries as before.
 *
 * A request may also carry its copy's block ids as a Python list (its object's address, a range of it, where the
 * graph's pinned arguments are): before the launch the thread writes the arguments [src_row0, num, ids...] itself
 * with pack (id_pack.c's kp_pack_into, which reads the list's ints without the GIL), so the engine thread reads
 * none of them. The requester keeps the list alive and unchanged until the launch is made; an id that cannot be
 * packed fails the request (KL_BAD_IDS, no launch made).
 *
 * Invariants: launches are made in request order, one at a time; num_launched only grows, and a slot's
 * stamps and result are written before num_launched passes its ticket (release; the reader acquires, or
 * relies on x86-64's store order); num_ended <= num_launched, only grows, and passes a ticket only once that
 * launch was made and its watched event (if any) was queried complete after it; a slot is rewritten only
 * after its launch was made and its watch settled (the requester waits for room: num_ended, or num_launched
 * once watch_err is set); kl_stop makes every
 * published launch before the thread ends (it does not wait for watches), and joins it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

typedef int (*launch_fn)(void *exec, void *stream);
typedef int (*set_ctx_fn)(void *ctx);
typedef int (*query_fn)(void *event); /* 0: complete; KL_NOT_READY: not yet; else an error */
typedef int (*pack_fn)(int32_t *dst, void *list, int64_t first, int64_t num); /* 0, or -1: an id it cannot pack */

#define KL_NOT_READY 600 /* CUDA_ERROR_NOT_READY */
#define KL_BAD_IDS (-3)  /* a request's block ids could not be packed (or no pack function): no launch made */
#define KL_ARGS_HEADER 2 /* the arguments' int32 header: src_row0, num; the ids follow */

#define KL_RING 256

typedef struct {
    /* the requester's: slots first, then num_requested (its store publishes them) */
    _Alignas(64) int64_t num_requested;
    void *exec[KL_RING];
    void *stream[KL_RING];
    int64_t t_request[KL_RING]; /* when each was requested (CLOCK_MONOTONIC; 0: not stamped) */
    void *watch[KL_RING]; /* the event whose completion ends each launch's copy (NULL: nothing to watch) */
    void *ids[KL_RING]; /* a list of block ids to pack before the launch (NULL: the arguments are written) */
    int64_t ids_first[KL_RING], ids_num[KL_RING];
    int32_t *args[KL_RING]; /* ... into these pinned arguments, after the header */
    int32_t src_row0[KL_RING];
    /* the launch thread's */
    _Alignas(64) int64_t num_launched;
    int first_err; /* the first failed launch's result (0: none) */
    int64_t t_packed[KL_RING]; /* when the thread began packing a request's ids (0: it packed none) */
    int64_t t_begin[KL_RING], t_end[KL_RING];
    int err[KL_RING];
    _Alignas(64) int64_t num_ended; /* launches made whose watched event was seen complete (in ticket order) */
    int watch_err; /* the first failed query's result (0: none): no more watching */
    int64_t t_queried; /* the last query's start */
    int64_t t_ended[KL_RING]; /* when the thread saw each watched event complete (0: not yet) */
    /* set at start */
    _Alignas(64) int stop;
    int64_t spin_ns, poll_ns;
    int64_t min_delay_ns; /* a launch begins no sooner than this long after its request's stamp */
    int cpu; /* the CPU the thread keeps to (-1: any) */
    launch_fn launch;
    set_ctx_fn set_ctx;
    void *ctx;
    query_fn query; /* NULL: no watching (num_ended follows num_launched) */
    pack_fn pack; /* NULL: requests carrying ids fail (KL_BAD_IDS) */
    int64_t watch_ns;
    pthread_t thread;
} kl_state;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *run(void *arg) {
    kl_state *s = (kl_state *)arg;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* a poll's sleep ends when asked, not up to 50 us later */
    if (s->cpu >= 0) { /* its own core: its spinning never takes the engine thread's */
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(s->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    if (s->set_ctx && s->ctx) s->set_ctx(s->ctx); /* the engine's CUDA context, current on this thread too */
    int64_t last = now_ns();
    for (;;) {
        int64_t requested = __atomic_load_n(&s->num_requested, __ATOMIC_ACQUIRE);
        int64_t made = s->num_launched;
        if (requested > made) {
            int k = (int)(made % KL_RING);
            int64_t delay = __atomic_load_n(&s->min_delay_ns, __ATOMIC_RELAXED);
            if (delay > 0 && now_ns() < s->t_request[k] + delay) {
                relax();
                continue;
            }
            int err = 0;
            s->t_packed[k] = 0;
            if (s->ids[k] != NULL) { /* the arguments, written here: the engine thread read none of the ids */
                pack_fn pack = __atomic_load_n(&s->pack, __ATOMIC_ACQUIRE);
                int32_t *a = s->args[k];
                s->t_packed[k] = now_ns();
                a[0] = s->src_row0[k];
                a[1] = (int32_t)s->ids_num[k];
                if (pack == NULL || pack(a + KL_ARGS_HEADER, s->ids[k], s->ids_first[k], s->ids_num[k]) != 0)
                    err = KL_BAD_IDS;
            }
            s->t_begin[k] = now_ns();
            if (!err) err = s->launch(s->exec[k], s->stream[k]);
            s->t_end[k] = last = now_ns();
            s->err[k] = err;
            if (err && !s->first_err) __atomic_store_n(&s->first_err, err, __ATOMIC_RELEASE);
            __atomic_store_n(&s->num_launched, made + 1, __ATOMIC_RELEASE);
            continue;
        }
        if (__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
            /* the requests published before the stop may have landed after this pass read num_requested (a loaded
               CI machine dropped the last 44 of 300 launches so): read it again now the stop is seen, and make them */
            if (__atomic_load_n(&s->num_requested, __ATOMIC_ACQUIRE) > s->num_launched) continue;
            break;
        }
        int64_t ended = s->num_ended;
        if (ended < made) { /* the oldest launch whose copy is not seen ended yet */
            int k = (int)(ended % KL_RING);
            void *ev = s->watch[k];
            if (s->num_requested - ended > KL_RING) { /* cannot happen: the requester waits for room (num_ended) */
                __atomic_store_n(&s->watch_err, -1, __ATOMIC_RELEASE);
            } else if (ev == NULL || s->query == NULL) { /* nothing to watch: ended as far as anyone asks */
                s->t_ended[k] = 0;
                __atomic_store_n(&s->num_ended, ended + 1, __ATOMIC_RELEASE);
                continue;
            } else if (!s->watch_err) {
                int64_t t = now_ns();
                if (t - s->t_queried >= s->watch_ns) {
                    s->t_queried = t;
                    int r = s->query(ev);
                    if (r == 0) {
                        s->t_ended[k] = now_ns();
                        __atomic_store_n(&s->num_ended, ended + 1, __ATOMIC_RELEASE);
                        continue;
                    }
                    if (r != KL_NOT_READY) __atomic_store_n(&s->watch_err, r, __ATOMIC_RELEASE);
                }
                /* not ended yet: spin or sleep as between requests (a copy takes tens to hundreds of us) */
            }
        }
        if (now_ns() - last < __atomic_load_n(&s->spin_ns, __ATOMIC_RELAXED)) {
            relax();
            continue;
        }
        struct timespec ts = {0, (long)s->poll_ns};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

void *kl_start(launch_fn launch, set_ctx_fn set_ctx, void *ctx, int64_t spin_ns, int64_t poll_ns, int cpu,
               query_fn query, int64_t watch_ns) {
    kl_state *s = NULL;
    if (posix_memalign((void **)&s, 64, sizeof(kl_state)) != 0) return NULL;
    *s = (kl_state){0};
    s->launch = launch;
    s->set_ctx = set_ctx;
    s->ctx = ctx;
    s->spin_ns = spin_ns;
    s->cpu = cpu;
    s->query = query;
    s->watch_ns = watch_ns;
    s->poll_ns = poll_ns > 0 && poll_ns < 1000000000LL ? poll_ns : 20000;
    if (pthread_create(&s->thread, NULL, run, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* Where the requester writes: the slot arrays and num_requested (Python stores into them in place). */
void **kl_exec_slots(void *handle) { return ((kl_state *)handle)->exec; }
void **kl_ids_slots(void *handle) { return ((kl_state *)handle)->ids; }
int64_t *kl_ids_first_slots(void *handle) { return ((kl_state *)handle)->ids_first; }
int64_t *kl_ids_num_slots(void *handle) { return ((kl_state *)handle)->ids_num; }
int32_t **kl_args_slots(void *handle) { return ((kl_state *)handle)->args; }
int32_t *kl_src_row0_slots(void *handle) { return ((kl_state *)handle)->src_row0; }

/* The function that packs a request's ids (kp_pack_into), from now on; set before the first request with ids. */
void kl_set_pack(void *handle, pack_fn pack) { __atomic_store_n(&((kl_state *)handle)->pack, pack, __ATOMIC_RELEASE); }
void **kl_stream_slots(void *handle) { return ((kl_state *)handle)->stream; }
void **kl_watch_slots(void *handle) { return ((kl_state *)handle)->watch; }
int64_t *kl_requested(void *handle) { return &((kl_state *)handle)->num_requested; }

/* The portable request (a release store; the caller has checked there is room): returns its ticket. ids: NULL, or
 * a list whose [first, first + num) the thread packs into args after the header (src_row0, num) before launching. */
int64_t kl_request(void *handle, void *exec, void *stream, void *watch, void *ids, int64_t first, int64_t num,
                   int32_t *args, int32_t src_row0) {
    kl_state *s = (kl_state *)handle;
    int64_t ticket = s->num_requested + 1;
    int k = (int)((ticket - 1) % KL_RING);
    s->exec[k] = exec;
    s->stream[k] = stream;
    s->watch[k] = watch;
    s->ids[k] = ids;
    s->ids_first[k] = first;
    s->ids_num[k] = num;
    s->args[k] = args;
    s->src_row0[k] = src_row0;
    s->t_request[k] = now_ns();
    __atomic_store_n(&s->num_requested, ticket, __ATOMIC_RELEASE);
    return ticket;
}

/* Where the requester stamps each request (in place, beside the slots). */
int64_t *kl_request_stamps(void *handle) { return ((kl_state *)handle)->t_request; }

/* How long after its request's stamp a launch may begin at the soonest, from now on (0: at once). */
void kl_set_min_delay(void *handle, int64_t ns) { __atomic_store_n(&((kl_state *)handle)->min_delay_ns, ns, __ATOMIC_RELAXED); }

/* How long the thread spins after a launch before it polls, from now on. */
void kl_set_spin(void *handle, int64_t spin_ns) { __atomic_store_n(&((kl_state *)handle)->spin_ns, spin_ns, __ATOMIC_RELAXED); }

/* The address of num_launched: the engine thread polls it (an aligned 8-byte load) instead of calling in. */
int64_t *kl_counter(void *handle) { return &((kl_state *)handle)->num_launched; }

/* The address of num_ended (read in place, as num_launched) and of watch_err. */
int64_t *kl_ended_counter(void *handle) { return &((kl_state *)handle)->num_ended; }
int *kl_watch_error(void *handle) { return &((kl_state *)handle)->watch_err; }

/* The address of first_err: set before num_launched passes the failed launch's ticket, so a reader that saw
 * the counter reach a ticket and reads 0 here knows every launch up to it succeeded. */
int *kl_error_flag(void *handle) { return &((kl_state *)handle)->first_err; }

/* A made launch's stamps and result, and when the thread began packing its ids (0: none); -1 while the ticket is not
 * made yet, or its slot was reused. Called by the requesting thread (num_requested is its own). */
int kl_slot_of(void *handle, int64_t ticket, int64_t *t_begin_ns, int64_t *t_end_ns, int *err, int64_t *t_ended_ns,
               int64_t *t_packed_ns) {
    kl_state *s = (kl_state *)handle;
    int64_t launched = __atomic_load_n(&s->num_launched, __ATOMIC_ACQUIRE);
    if (ticket < 1 || ticket > launched || s->num_requested - ticket >= KL_RING) return -1;
    int k = (int)((ticket - 1) % KL_RING);
    *t_begin_ns = s->t_begin[k];
    *t_end_ns = s->t_end[k];
    *err = s->err[k];
    *t_ended_ns = ticket <= __atomic_load_n(&s->num_ended, __ATOMIC_ACQUIRE) ? s->t_ended[k] : 0;
    *t_packed_ns = s->t_packed[k];
    return 0;
}

/* The thread's own CPU time so far (ns), what its polling and spinning cost a core; -1 if unreadable. */
int64_t kl_cpu_ns(void *handle) {
    kl_state *s = (kl_state *)handle;
    clockid_t clock;
    struct timespec ts;
    if (pthread_getcpuclockid(s->thread, &clock) != 0 || clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A launch that only takes time: spins for (intptr_t)exec nanoseconds on the calling thread and returns 0. Handed
 * in where there is no driver (the CPU build's tests and benchmark), or beside the driver's launch to tell what a
 * busy thread does to the engine thread from what the driver call does (benchmarks/bench_launch_interference.py). */
int kl_busy_launch(void *exec, void *stream) {
    (void)stream;
    int64_t until = now_ns() + (int64_t)(intptr_t)exec;
    while (now_ns() < until) relax();
    return 0;
}

/* Makes every published launch, ends the thread, joins it and frees the state. */
void kl_stop(void *handle) {
    kl_state *s = (kl_state *)handle;
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_join(s->thread, NULL);
    free(s);
}
