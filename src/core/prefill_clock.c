/* prefill_clock.c -- the per-worker prefill rate and expected end of pending prefills; see
 * prefill_clock.h for the model. */
#include "core/prefill_clock.h"

#include "base/kvr.h"

void kvr_prefill_clock_dispatch(kvr_prefill_clock_t *c, uint64_t tokens, uint64_t now_ns) {
  if (c->rate <= 0)
    return;
  uint64_t start = KVR_MAX(c->busy_until_ns, now_ns);
  c->busy_until_ns = start + (uint64_t)((double)tokens / c->rate * 1e9);
}

void kvr_prefill_clock_first_token(kvr_prefill_clock_t *c, uint64_t tokens, uint64_t dispatched_ns,
                                   bool alone, uint64_t pending_after, uint64_t now_ns) {
  if (alone && tokens >= KVR_PREFILL_SAMPLE_MIN_TOKENS && now_ns > dispatched_ns) {
    double sample = (double)tokens / ((double)(now_ns - dispatched_ns) / 1e9);
    c->rate = c->samples == 0
                  ? sample
                  : (1 - KVR_PREFILL_RATE_ALPHA) * c->rate + KVR_PREFILL_RATE_ALPHA * sample;
    c->samples++;
  }
  if (c->rate > 0)
    c->busy_until_ns = now_ns + (uint64_t)((double)pending_after / c->rate * 1e9);
}

void kvr_prefill_clock_cancel(kvr_prefill_clock_t *c, uint64_t tokens, uint64_t now_ns) {
  if (c->rate <= 0 || c->busy_until_ns <= now_ns)
    return;
  uint64_t share = (uint64_t)((double)tokens / c->rate * 1e9);
  c->busy_until_ns = c->busy_until_ns - now_ns > share ? c->busy_until_ns - share : now_ns;
}

uint64_t kvr_prefill_clock_backlog(const kvr_prefill_clock_t *c, uint64_t pending,
                                   uint64_t now_ns) {
  if (c->rate <= 0 || pending == 0)
    return pending;
  double overdue = (double)pending * KVR_PREFILL_OVERDUE_SHARE;
  if (c->busy_until_ns <= now_ns)
    return (uint64_t)(overdue + 0.5);
  double left = (double)(c->busy_until_ns - now_ns) / 1e9 * c->rate;
  return (uint64_t)(KVR_MIN((double)pending, KVR_MAX(left, overdue)) + 0.5);
}
