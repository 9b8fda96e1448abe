/*-------------------------------------------------------------------------
 *
 * http.c
 *	  felix's HTTP client, over libcurl's multi interface so that nothing
 *	  blocks inside curl: the request is driven with curl_multi_perform and
 *	  every wait is a WaitLatchOrSocket on the process latch (interrupts
 *	  serviced when it is set, postmaster death exits), bounded by the
 *	  caller's deadline.  One easy handle lives for the process, so its
 *	  connections are kept alive from one request to the next.
 *
 *	  curl never installs signal handlers here (CURLOPT_NOSIGNAL), and
 *	  an error raised while waiting (a cancel) detaches the transfer
 *	  before it propagates, so the next request starts clean.
 *
 * Locking rule: none.  The handles are private to the process.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <curl/curl.h>

#include "felix.h"
#include "base/http.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/wait_event.h"

static CURL *easy = NULL;
static CURLM *multi = NULL;

/* Longest a single wait lasts when curl has more than one socket. */
#define HTTP_POLL_MS	10

static size_t
collect(char *data, size_t size, size_t nmemb, void *arg)
{
	StringInfo	body = (StringInfo) arg;
	size_t		n = size * nmemb;

	/* refuse an answer too large to be one of ours rather than grow forever */
	if (body->len + n > 64 * 1024 * 1024)
		return 0;
	appendBinaryStringInfo(body, data, (int) n);
	return n;
}

static void
handles_init(void)
{
	if (easy != NULL)
		return;
	if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("felix: could not initialise libcurl")));
	multi = curl_multi_init();
	easy = curl_easy_init();
	if (multi == NULL || easy == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("felix: could not create a libcurl handle")));
}

/* Wait for curl's sockets, the latch, or at most wait_ms. */
static void
wait_for_curl(long wait_ms)
{
	fd_set		rd,
				wr,
				ex;
	int			maxfd = -1;
	int			events = WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH;
	int			rc;

	FD_ZERO(&rd);
	FD_ZERO(&wr);
	FD_ZERO(&ex);
	if (curl_multi_fdset(multi, &rd, &wr, &ex, &maxfd) != CURLM_OK)
		maxfd = -1;

	if (maxfd >= 0)
	{
		int			nfds = 0;
		int			fd = -1;

		for (int i = 0; i <= maxfd; i++)
			if (FD_ISSET(i, &rd) || FD_ISSET(i, &wr))
			{
				nfds++;
				fd = i;
			}
		if (nfds == 1)
		{
			if (FD_ISSET(fd, &rd))
				events |= WL_SOCKET_READABLE;
			if (FD_ISSET(fd, &wr))
				events |= WL_SOCKET_WRITEABLE;
			rc = WaitLatchOrSocket(MyLatch, events, fd, wait_ms, PG_WAIT_EXTENSION);
		}
		else
			rc = WaitLatch(MyLatch, events, Min(wait_ms, HTTP_POLL_MS), PG_WAIT_EXTENSION);
	}
	else
		rc = WaitLatch(MyLatch, events, Min(wait_ms, HTTP_POLL_MS), PG_WAIT_EXTENSION);

	if (rc & WL_LATCH_SET)
	{
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

static void
set_tls(const FelixHttpTls *tls)
{
	curl_easy_setopt(easy, CURLOPT_CAINFO,
					 tls && tls->cacert && tls->cacert[0] ? tls->cacert : NULL);
	curl_easy_setopt(easy, CURLOPT_SSLCERT,
					 tls && tls->cert && tls->cert[0] ? tls->cert : NULL);
	curl_easy_setopt(easy, CURLOPT_SSLKEY,
					 tls && tls->key && tls->key[0] ? tls->key : NULL);
}

void
felix_http_post(const char *url, const char *body, const char *const *headers,
				const FelixHttpTls *tls, int64 deadline_ns, int connect_timeout_ms,
				FelixHttpResult *result)
{
	struct curl_slist *list = NULL;
	volatile CURLcode code = CURLE_OK;
	volatile bool finished = false;
	char		errbuf[CURL_ERROR_SIZE];
	int64		now = felix_monotonic_ns();
	long		total_ms;

	memset(result, 0, sizeof(*result));
	initStringInfo(&result->body);
	if (now >= deadline_ns)
	{
		strlcpy(result->error, "no time left for the request", sizeof(result->error));
		return;
	}
	total_ms = (long) ((deadline_ns - now) / 1000000) + 1;

	handles_init();
	list = curl_slist_append(list, "Content-Type: application/json");
	for (int i = 0; headers != NULL && headers[i] != NULL; i++)
		list = curl_slist_append(list, headers[i]);

	errbuf[0] = '\0';
	curl_easy_setopt(easy, CURLOPT_URL, url);
	curl_easy_setopt(easy, CURLOPT_POST, 1L);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, (long) strlen(body));
	curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list);
	curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(easy, CURLOPT_WRITEDATA, &result->body);
	curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, total_ms);
	curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS,
					 (long) Max(1, Min(connect_timeout_ms, total_ms)));
	curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 0L);
	set_tls(tls);

	if (curl_multi_add_handle(multi, easy) != CURLM_OK)
	{
		curl_slist_free_all(list);
		strlcpy(result->error, "libcurl refused the request", sizeof(result->error));
		return;
	}

	PG_TRY();
	{
		for (;;)
		{
			int			running = 0;
			long		curl_wait = -1;
			long		left;
			CURLMsg    *msg;
			int			queued;

			(void) curl_multi_perform(multi, &running);
			while ((msg = curl_multi_info_read(multi, &queued)) != NULL)
			{
				if (msg->msg == CURLMSG_DONE && msg->easy_handle == easy)
				{
					code = msg->data.result;
					finished = true;
				}
			}
			if (finished || running == 0)
				break;
			now = felix_monotonic_ns();
			if (now >= deadline_ns)
			{
				code = CURLE_OPERATION_TIMEDOUT;
				finished = true;
				break;
			}
			left = (long) ((deadline_ns - now + 999999) / 1000000);
			(void) curl_multi_timeout(multi, &curl_wait);
			if (curl_wait < 0 || curl_wait > left)
				curl_wait = left;
			if (curl_wait > 0)
				wait_for_curl(curl_wait);
		}
	}
	PG_FINALLY();
	{
		long		sent = 0;

		(void) curl_easy_getinfo(easy, CURLINFO_REQUEST_SIZE, &sent);
		result->maybe_sent = sent > 0;
		curl_multi_remove_handle(multi, easy);
		curl_easy_setopt(easy, CURLOPT_HTTPHEADER, NULL);
		curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, NULL);
		curl_slist_free_all(list);
	}
	PG_END_TRY();

	if (finished && code == CURLE_OK)
	{
		(void) curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &result->status);
		result->done = true;
		return;
	}
	if (!finished)
		code = CURLE_OPERATION_TIMEDOUT;
	snprintf(result->error, sizeof(result->error), "%s",
			 errbuf[0] ? errbuf : curl_easy_strerror(code));
}
