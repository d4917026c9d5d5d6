/* clock.h: the time the program measures with.
 *
 * hn_now_ms / hn_now_s read CLOCK_MONOTONIC (from an arbitrary start, never
 * stepped by NTP or the user), for durations: request timings, benchmark and
 * tuner timings, idle timeouts. hn_deadline_ms makes the absolute
 * CLOCK_REALTIME deadline that pthread_cond_timedwait takes. */
#ifndef HN_CLOCK_H
#define HN_CLOCK_H

#include <time.h>

/* Returns the monotonic time in milliseconds. Cannot fail. */
double hn_now_ms(void);

/* Returns the monotonic time in seconds. Cannot fail. */
double hn_now_s(void);

/* Fills *ts with the wall-clock time ms milliseconds from now (ms >= 0), the
 * deadline form pthread_cond_timedwait takes. */
void hn_deadline_ms(struct timespec *ts, long ms);

#endif
