/* A native thread that launches captured CUDA graphs for the engine's thread (kv/launch_thread.py).
 *
 * The engine thread writes a restore copy's arguments, then hands the launch over (kl_request: a lock, a
 * ring slot, a wake-up) and goes on with its step; this thread, on its own core and without the GIL,
 * makes the driver call (cuGraphLaunch, or any function of the same shape: tests pass one in) in the
 * order the requests came, stamps it (CLOCK_MONOTONIC, Python's time.monotonic_ns) and publishes how many
 * it has made (num_launched, read by the engine thread without a call: kl_counter).
 *
 * Invariants: launches are made in request order, one at a time; num_launched only grows, and a slot's
 * stamps and result are written before num_launched passes its ticket; a request waits while the ring is
 * full; kl_stop makes every queued launch before the thread ends and joins it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef int (*launch_fn)(void *exec, void *stream);
typedef int (*set_ctx_fn)(void *ctx);

#define KL_RING 256

typedef struct {
    void *exec, *stream;
    int64_t t_begin_ns, t_end_ns;
    int err;
} kl_slot;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake, room;
    kl_slot ring[KL_RING];
    int64_t num_requested;
    int64_t num_launched; /* written with release order by the thread; read by Python from kl_counter */
    int first_err;        /* the first launch's error (0: none) */
    int stop;
    launch_fn launch;
    set_ctx_fn set_ctx;
    void *ctx;
    pthread_t thread;
} kl_state;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void *run(void *arg) {
    kl_state *s = (kl_state *)arg;
    if (s->set_ctx && s->ctx) s->set_ctx(s->ctx); /* the engine's CUDA context, current on this thread too */
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->num_launched == s->num_requested && !s->stop) pthread_cond_wait(&s->wake, &s->mu);
        if (s->num_launched == s->num_requested) break; /* stopped, nothing queued */
        kl_slot *slot = &s->ring[s->num_launched % KL_RING];
        pthread_mutex_unlock(&s->mu);
        slot->t_begin_ns = now_ns();
        slot->err = s->launch(slot->exec, slot->stream);
        slot->t_end_ns = now_ns();
        pthread_mutex_lock(&s->mu);
        if (slot->err && !s->first_err) __atomic_store_n(&s->first_err, slot->err, __ATOMIC_RELEASE);
        __atomic_store_n(&s->num_launched, s->num_launched + 1, __ATOMIC_RELEASE);
        pthread_cond_signal(&s->room);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

void *kl_start(launch_fn launch, set_ctx_fn set_ctx, void *ctx) {
    kl_state *s = (kl_state *)calloc(1, sizeof(kl_state));
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->room, NULL);
    s->launch = launch;
    s->set_ctx = set_ctx;
    s->ctx = ctx;
    if (pthread_create(&s->thread, NULL, run, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

/* Queues one launch; returns its ticket (1, 2, ...): it has been made once kl_counter reaches the ticket. */
int64_t kl_request(void *handle, void *exec, void *stream) {
    kl_state *s = (kl_state *)handle;
    pthread_mutex_lock(&s->mu);
    while (s->num_requested - s->num_launched >= KL_RING) pthread_cond_wait(&s->room, &s->mu);
    kl_slot *slot = &s->ring[s->num_requested % KL_RING];
    slot->exec = exec;
    slot->stream = stream;
    slot->err = 0;
    slot->t_begin_ns = slot->t_end_ns = 0;
    int64_t ticket = ++s->num_requested;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    return ticket;
}

/* The address of num_launched: the engine thread polls it (an aligned 8-byte load) instead of calling in. */
int64_t *kl_counter(void *handle) { return &((kl_state *)handle)->num_launched; }

/* The address of first_err: set before num_launched passes the failed launch's ticket, so a reader that saw
 * the counter reach a ticket and reads 0 here knows every launch up to it succeeded. */
int *kl_error_flag(void *handle) { return &((kl_state *)handle)->first_err; }

/* A made launch's stamps and result; -1 while the ticket is not made yet, or its slot was reused. Called by
 * the requesting thread (num_requested is its own). */
int kl_slot_of(void *handle, int64_t ticket, int64_t *t_begin_ns, int64_t *t_end_ns, int *err) {
    kl_state *s = (kl_state *)handle;
    int64_t launched = __atomic_load_n(&s->num_launched, __ATOMIC_ACQUIRE);
    if (ticket < 1 || ticket > launched || s->num_requested - ticket >= KL_RING) return -1; /* rewritten since */
    kl_slot *slot = &s->ring[(ticket - 1) % KL_RING];
    *t_begin_ns = slot->t_begin_ns;
    *t_end_ns = slot->t_end_ns;
    *err = slot->err;
    return 0;
}

/* Makes every queued launch, ends the thread, joins it and frees the state. */
void kl_stop(void *handle) {
    kl_state *s = (kl_state *)handle;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->room);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
