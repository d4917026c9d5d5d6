/* metrics.h: what a running server shows about itself.
 *
 *   GET /metrics           Prometheus text format (version 0.0.4): requests,
 *                          tokens in / out / cached / computed, TTFT and
 *                          inter-token histograms, queue length, KV blocks
 *                          used / cached / free, bytes, evictions, preemptions,
 *                          the fixed cost, and each live request's KV bytes.
 *   GET /v1/hone/status    the same as one JSON object, with every live
 *                          request (the sessions `hone ps` and the dashboard
 *                          show); also /hone/status.
 *   GET /                  the dashboard (dashboard.c): one static page that
 *                          polls the status endpoint.
 * Both data endpoints sit behind the API key when one is set; the page holds
 * no data and is served without it (as the probes on / always were), and asks
 * for the key when the status endpoint refuses it. The figures come from the
 * srv_engine's stats / sessions calls (NULL for the scripted test engine: then
 * only the server's own counters are reported). */
#ifndef HN_SERVER_METRICS_H
#define HN_SERVER_METRICS_H

#include <jansson.h>

#include "sbuf.h"
#include "srv_int.h"

/* The handlers for R_METRICS, R_STATUS and R_ROOT (simple_get in server.c). */
enum MHD_Result srv_metrics(srv_conn *c);
enum MHD_Result srv_status(srv_conn *c);
enum MHD_Result srv_dashboard(srv_conn *c);

/* The bodies, without HTTP (tests): the Prometheus text into out, and the
 * status object (NULL on out of memory; the caller owns it). */
void srv_metrics_text(srv_server *s, sbuf *out);
json_t *srv_status_json(srv_server *s);

/* The dashboard page (dashboard.c). */
extern const char srv_dashboard_html[];

#endif
