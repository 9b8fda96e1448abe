/*-------------------------------------------------------------------------
 *
 * http.h
 *	  felix's HTTP client (libcurl), usable from a background worker and
 *	  from a backend: one request at a time per process, with a deadline,
 *	  waiting on the process latch so that interrupts are serviced and
 *	  postmaster death is noticed.  See http.c.
 *
 * Locking rule: none.  The curl handles are private to the process.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_BASE_HTTP_H
#define FELIX_BASE_HTTP_H

#include "postgres.h"

#include "lib/stringinfo.h"

/* Client-side TLS and credentials of a request; NULL or "" fields unused. */
typedef struct FelixHttpTls
{
	const char *cacert;			/* CA bundle that verifies the server */
	const char *cert;			/* client certificate (PEM) */
	const char *key;			/* its private key (PEM) */
} FelixHttpTls;

/* What a request came to. */
typedef struct FelixHttpResult
{
	bool		done;			/* a complete HTTP answer arrived */
	bool		maybe_sent;		/* the request may have reached the server */
	long		status;			/* HTTP status when done */
	StringInfoData body;		/* the answer's body (palloc'd) */
	char		error[256];		/* why not done (no secrets) */
} FelixHttpResult;

/*
 * POST body (JSON) to url, with extra headers ("Name: value" strings,
 * NULL-terminated list, or NULL), until deadline_ns (felix_monotonic_ns);
 * connecting may take at most connect_timeout_ms of it.  Never raises for
 * a network failure: the result says what happened.  Interrupts
 * (a cancel, a shutdown) are serviced while waiting and may raise.
 */
extern void felix_http_post(const char *url, const char *body,
							const char *const *headers,
							const FelixHttpTls *tls,
							int64 deadline_ns, int connect_timeout_ms,
							FelixHttpResult *result);

#endif							/* FELIX_BASE_HTTP_H */
