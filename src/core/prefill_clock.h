/* prefill_clock.h -- how much of the prefill work the router has sent a worker is still ahead.
 *
 * The router knows exactly which uncached prompt tokens it has sent a worker that are not
 * prefilled yet (queued_prefill_tokens: added on dispatch, removed at the request's first token).
 * It does not know how far the worker has got through them, and that is what a new request waits
 * for: joining a worker that has just started a 7,000-token prefill costs ~700 ms of TTFT on an
 * H200, joining one that is about to finish it costs nothing. This module estimates the remainder
 * from what the router observes itself, so it works against any vLLM without extra signals:
 *
 *   rate       the worker's prefill rate in tokens per second: an EWMA of prefill_tokens / TTFT
 *              over requests of at least KVR_PREFILL_SAMPLE_MIN_TOKENS that found no other prefill
 *              pending on the worker when dispatched (their TTFT was their own prefill);
 *   busy_until when the tokens dispatched so far should be prefilled: each dispatch pushes it by
 *              tokens / rate (vLLM schedules waiting requests first come, first served); each first
 *              token resets it to now + (tokens still pending) / rate, because that request's
 *              prefill is done and only the later ones remain, so errors do not accumulate.
 *
 * backlog(now) = min(pending, max((busy_until - now) * rate, pending / 10)): the tokens the worker
 * probably still has to prefill. The floor covers a worker slower than measured (past busy_until
 * its pending work should end any moment, but an idle worker still ranks ahead of it). Until the
 * first rate sample the backlog is the pending count, which is what the router used before.
 *
 * Pure arithmetic on times passed in by the caller (router.c passes kvr_now_ns()), so it is tested
 * without a clock.
 */
#ifndef KVR_PREFILL_CLOCK_H
#define KVR_PREFILL_CLOCK_H

#include <stdbool.h>
#include <stdint.h>

#define KVR_PREFILL_SAMPLE_MIN_TOKENS 512 /* shorter prefills are dominated by fixed step costs */
#define KVR_PREFILL_RATE_ALPHA 0.2        /* EWMA weight of a new sample */
#define KVR_PREFILL_OVERDUE_SHARE 0.1     /* weight of pending tokens past their expected end */

typedef struct kvr_prefill_clock_s {
  double rate;            /* measured prefill tokens per second; 0 until the first sample */
  uint64_t samples;       /* rate samples taken */
  uint64_t busy_until_ns; /* expected end of the pending prefills (valid once rate > 0) */
} kvr_prefill_clock_t;

/* A request with `tokens` uncached prompt tokens was sent to the worker at now_ns. */
void kvr_prefill_clock_dispatch(kvr_prefill_clock_t *c, uint64_t tokens, uint64_t now_ns);

/* A request's first token arrived at now_ns: its `tokens` were prefilled since dispatched_ns.
 * alone: no other prefill was pending on the worker when it was dispatched. pending_after: the
 * worker's pending prefill tokens once this request's are removed. */
void kvr_prefill_clock_first_token(kvr_prefill_clock_t *c, uint64_t tokens, uint64_t dispatched_ns,
                                   bool alone, uint64_t pending_after, uint64_t now_ns);

/* The tokens of `pending` the worker probably has not prefilled yet at now_ns (see above). */
/* A request of tokens prefill tokens ended before its first token (refused, failed, abandoned):
 * its share leaves the expected end (not before now_ns), so it leaves no residue in the backlog. */
void kvr_prefill_clock_cancel(kvr_prefill_clock_t *c, uint64_t tokens, uint64_t now_ns);

uint64_t kvr_prefill_clock_backlog(const kvr_prefill_clock_t *c, uint64_t pending, uint64_t now_ns);

#endif
