/*-------------------------------------------------------------------------
 *
 * store_etcd.c
 *	  The etcd control-plane store: etcd v3's JSON gateway (POST
 *	  /v3/kv/range and /v3/kv/txn) over http.c.  Keys live under
 *	  felix.etcd_prefix; keys and values travel base64-encoded, int64s as
 *	  strings.
 *
 *	  Endpoints (felix.etcd_endpoints) are tried in turn, starting with the
 *	  one that answered last, until one answers or felix.etcd_timeout runs
 *	  out.  An endpoint that cannot be reached, or whose member has no
 *	  leader, hands the request to the next.  Retrying a transaction is
 *	  safe because every felix transaction compares revisions (or only
 *	  writes what it read): if an earlier attempt did apply, the retry's
 *	  compare fails and the caller, reading again, finds its own write.  A
 *	  transaction whose last attempt may have reached etcd but got no
 *	  answer is FELIX_STORE_UNKNOWN.
 *
 *	  Reads are linearizable (etcd's default): what a read returns was
 *	  the latest committed state at some instant between send and answer,
 *	  which the lease rules rely on.  A guarded read (store.h) is
 *	  serializable: the member answers from its own copy.
 *
 *	  Authentication: with felix.etcd_user set, the password is read from
 *	  felix.etcd_password_file when a token is needed, never kept in a
 *	  setting, never logged; the token is renewed when etcd says it is no
 *	  longer valid.  TLS: https endpoints with felix.etcd_cacert, and a
 *	  client certificate with felix.etcd_cert / felix.etcd_key.
 *
 * Locking rule: none.  State is per process (the endpoint that answered
 * last, the token, the health this process saw).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/base64.h"
#include "control/json.h"
#include "control/store.h"
#include "felix.h"
#include "base/http.h"
#include "nodes/pg_list.h"
#include "storage/fd.h"
#include "utils/memutils.h"

static List *endpoints = NIL;	/* char *, parsed once */
static int	current = 0;		/* the endpoint that answered last */
static char *token = NULL;		/* etcd auth token, TopMemoryContext */
static FelixStoreHealth health;

/* gRPC status codes etcd's gateway puts in an error's "code" */
#define GRPC_INVALID_ARGUMENT	3
#define GRPC_DEADLINE_EXCEEDED	4
#define GRPC_PERMISSION_DENIED	7
#define GRPC_UNAVAILABLE		14
#define GRPC_UNAUTHENTICATED	16

typedef enum EtcdOutcome
{
	ETCD_ANSWER,				/* a 200 with a JSON body: *root */
	ETCD_REFUSED,				/* etcd answered an error that did nothing */
	ETCD_NO_ANSWER				/* no endpoint answered in time */
} EtcdOutcome;

typedef struct EtcdCall
{
	EtcdOutcome outcome;
	bool		maybe_applied;	/* some attempt may have reached etcd */
	JsonbContainer *root;
	char		error[512];
} EtcdCall;

/* ---------------------------------------------------------------------
 * Settings
 * ---------------------------------------------------------------------
 */

static List *
split_endpoints(const char *value)
{
	List	   *out = NIL;
	char	   *copy = pstrdup(value);
	char	   *save = NULL;

	for (char *tok = strtok_r(copy, ", \t", &save); tok != NULL;
		 tok = strtok_r(NULL, ", \t", &save))
	{
		int			len = strlen(tok);

		while (len > 0 && tok[len - 1] == '/')
			tok[--len] = '\0';
		if (len > 0)
			out = lappend(out, pstrdup(tok));
	}
	return out;
}

bool
felix_store_is_etcd(void)
{
	return felix_etcd_endpoints != NULL && felix_etcd_endpoints[0] != '\0';
}

void
felix_store_check_settings(void)
{
	List	   *list;
	ListCell   *lc;

	if (!felix_store_is_etcd())
		return;
	if (felix_control_conninfo != NULL && felix_control_conninfo[0] != '\0')
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.control_conninfo and felix.etcd_endpoints are both set"),
				 errdetail("A node keeps its control plane either in a felix database (felix.control_conninfo) or in etcd, not both."),
				 errhint("Leave felix.control_conninfo empty on a node whose control plane is in etcd.")));
	list = split_endpoints(felix_etcd_endpoints);
	if (list == NIL)
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.etcd_endpoints names no endpoint"),
				 errhint("List the client URLs of the etcd members, e.g. 'http://h1:2379,http://h2:2379,http://h3:2379', or leave it empty for the embedded store.")));
	foreach(lc, list)
	{
		const char *url = lfirst(lc);
		const char *rest;

		if (strncmp(url, "http://", 7) == 0)
			rest = url + 7;
		else if (strncmp(url, "https://", 8) == 0)
			rest = url + 8;
		else
			ereport(FATAL,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("felix.etcd_endpoints: an endpoint must start with http:// or https://"),
					 errhint("List the client URLs of the etcd members, separated by commas.")));
		/* credentials in a URL would end up in logs and views */
		if (strchr(rest, '@') != NULL)
			ereport(FATAL,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("felix.etcd_endpoints must not hold credentials"),
					 errhint("Name the etcd user in felix.etcd_user and put its password in the file felix.etcd_password_file names.")));
		if (rest[0] == '\0' || strchr(rest, '/') != NULL)
			ereport(FATAL,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("felix.etcd_endpoints: an endpoint is a scheme, a host and a port, with no path"),
					 errhint("For example http://127.0.0.1:2379.")));
	}
	if (felix_etcd_prefix == NULL || felix_etcd_prefix[0] != '/')
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.etcd_prefix must start with /"),
				 errhint("Every node of one felix cluster uses the same prefix, e.g. /felix/.")));
	if (felix_etcd_user[0] != '\0' && felix_etcd_password_file[0] == '\0')
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("felix.etcd_user is set but felix.etcd_password_file is not"),
				 errhint("Put the etcd user's password in a file readable only by the server's operating-system user and name it in felix.etcd_password_file.")));
	list_free_deep(list);
}

static void
endpoints_init(void)
{
	MemoryContext old;

	if (endpoints != NIL)
		return;
	old = MemoryContextSwitchTo(TopMemoryContext);
	endpoints = split_endpoints(felix_etcd_endpoints);
	MemoryContextSwitchTo(old);
	if (endpoints == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("felix.etcd_endpoints names no endpoint")));
}

/* ---------------------------------------------------------------------
 * Encoding
 * ---------------------------------------------------------------------
 */

static char *
b64(const char *data, int len)
{
	int			cap = pg_b64_enc_len(len) + 1;
	char	   *out = palloc(cap);
	int			n = pg_b64_encode(data, len, out, cap);

	out[Max(n, 0)] = '\0';
	return out;
}

/* Decode a base64 field; NULL if it is not base64. */
static char *
unb64(const char *text, int *len)
{
	int			inlen = strlen(text);
	char	   *out = palloc(pg_b64_dec_len(inlen) + 1);
	int			n = pg_b64_decode(text, inlen, out, pg_b64_dec_len(inlen));

	if (n < 0)
		return NULL;
	out[n] = '\0';
	if (len)
		*len = n;
	return out;
}

static char *
full_key(const char *key)
{
	return psprintf("%s%s", felix_etcd_prefix, key);
}

/* The first key past every key that starts with prefix. */
static char *
prefix_end(const char *prefix)
{
	char	   *end = pstrdup(prefix);
	int			len = strlen(end);

	while (len > 0)
	{
		if ((unsigned char) end[len - 1] < 0xff)
		{
			end[len - 1]++;
			end[len] = '\0';
			return end;
		}
		len--;
	}
	return pstrdup("\\0");		/* unreachable for felix's ASCII prefixes */
}

static void
put_b64(StringInfo buf, const char *name, const char *data)
{
	felix_json_put_string(buf, name, b64(data, strlen(data)));
}

/* ---------------------------------------------------------------------
 * Requests
 * ---------------------------------------------------------------------
 */

static void
read_password(char *buf, Size len)
{
	FILE	   *f = AllocateFile(felix_etcd_password_file, "r");
	int			n;

	if (f == NULL)
		ereport(ERROR,
				(errcode_for_file_access(),
				 errmsg("could not open felix.etcd_password_file \"%s\": %m",
						felix_etcd_password_file)));
	n = fread(buf, 1, len - 1, f);
	FreeFile(f);
	buf[Max(n, 0)] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
		buf[--n] = '\0';
}

static void
note_error(EtcdCall *call, const char *endpoint, const char *what)
{
	snprintf(call->error, sizeof(call->error), "%s: %s", endpoint, what);
}

/* One POST to one endpoint; true when it answered (200 or an etcd error). */
static bool
post_one(const char *endpoint, const char *path, const char *body,
		 int64 deadline_ns, int connect_ms, EtcdCall *call, long *status,
		 JsonbContainer **root)
{
	FelixHttpTls tls = {felix_etcd_cacert, felix_etcd_cert, felix_etcd_key};
	FelixHttpResult res;
	const char *headers[2] = {NULL, NULL};
	char	   *url = psprintf("%s%s", endpoint, path);
	char		err[256];

	if (token != NULL && strcmp(path, "/v3/auth/authenticate") != 0)
		headers[0] = psprintf("Authorization: %s", token);
	felix_http_post(url, body, headers, &tls, deadline_ns, connect_ms, &res);
	if (res.maybe_sent)
		call->maybe_applied = true;
	if (!res.done)
	{
		note_error(call, endpoint, res.error);
		return false;
	}
	*status = res.status;
	*root = felix_json_parse(res.body.data, res.body.len, err, sizeof(err));
	if (*root == NULL)
	{
		note_error(call, endpoint,
				   psprintf("HTTP %ld with a body that is not JSON (is this an etcd v3 client URL?)",
							res.status));
		return false;
	}
	return true;
}

static bool authenticate(int64 deadline_ns, EtcdCall *call);

/*
 * What a try at one endpoint may take, in ms (0: the base share,
 * felix.etcd_timeout over the members).  A try that ran out of it passes
 * the request on with twice the share: etcd sends the first byte of an
 * answer only once the whole answer is built, so a large read (the whole
 * state, several MB at thousands of shards) on a loaded member can need
 * more than the base share every time -- and failed at every member, at
 * every heartbeat, for as long as the load lasted.  The share stays grown
 * while answers take more than half the base share.
 */
static int	try_share_ms = 0;

/*
 * POST body to path on the endpoints in turn until one answers.  A member
 * without a leader, or one that cannot be reached, passes the request on;
 * an expired token is renewed once.
 */
static void
etcd_call(const char *path, const char *body, bool is_write, EtcdCall *call)
{
	int64		start = felix_monotonic_ns();
	int64		deadline = start + (int64) felix_etcd_timeout * 1000000;
	int			n;
	int			connect_ms;
	int			base_ms;
	bool		reauthed = false;

	endpoints_init();
	memset(call, 0, sizeof(*call));
	call->outcome = ETCD_NO_ANSWER;
	n = list_length(endpoints);
	connect_ms = Max(100, felix_etcd_timeout / n);
	base_ms = Max(connect_ms, 300);
	if (try_share_ms < base_ms)
		try_share_ms = base_ms;

	if (felix_etcd_user[0] != '\0' && token == NULL && !authenticate(deadline, call))
		goto done;

	for (int tries = 0; tries < 2 * n + 1 && felix_monotonic_ns() < deadline; tries++)
	{
		const char *endpoint = list_nth(endpoints, current % n);
		long		status = 0;
		JsonbContainer *root = NULL;
		char	   *message = NULL;
		int64		code = 0;

		/*
		 * One endpoint gets its share of the time: a member that accepts the
		 * connection but does not answer (stopped, partitioned) must not use
		 * up the whole request.
		 */
		int64		sent = felix_monotonic_ns();
		int64		try_deadline = Min(deadline, sent + (int64) try_share_ms * 1000000);

		if (!post_one(endpoint, path, body, try_deadline, connect_ms, call, &status, &root))
		{
			if (felix_monotonic_ns() >= try_deadline)
				try_share_ms = Min(2 * try_share_ms, felix_etcd_timeout);
			current = (current + 1) % n;
			continue;
		}
		if (felix_monotonic_ns() - sent < (int64) base_ms * 1000000 / 2)
			try_share_ms = base_ms;
		if (status == 200)
		{
			call->outcome = ETCD_ANSWER;
			call->root = root;
			strlcpy(health.endpoint, endpoint, sizeof(health.endpoint));
			goto done;
		}
		(void) felix_json_int64(root, "code", &code);
		if (!felix_json_string(root, "message", &message) &&
			!felix_json_string(root, "error", &message))
			message = psprintf("HTTP %ld", status);
		note_error(call, endpoint, message);

		if (code == GRPC_UNAUTHENTICATED && felix_etcd_user[0] != '\0' && !reauthed)
		{
			reauthed = true;
			if (token)
				pfree(token);
			token = NULL;
			if (!authenticate(deadline, call))
				goto done;
			continue;
		}
		if (code == GRPC_UNAVAILABLE || code == GRPC_DEADLINE_EXCEEDED || status >= 500)
		{
			/* no leader there, or it timed out: another member may do */
			current = (current + 1) % n;
			continue;
		}
		/* an answer that says no: nothing was done */
		call->outcome = ETCD_REFUSED;
		if (!is_write || code == GRPC_INVALID_ARGUMENT || code == GRPC_PERMISSION_DENIED)
			call->maybe_applied = false;
		goto done;
	}
	if (call->error[0] == '\0')
		snprintf(call->error, sizeof(call->error), "no endpoint answered within %d ms",
				 felix_etcd_timeout);

done:
	if (call->outcome == ETCD_ANSWER)
	{
		health.last_error[0] = '\0';
		health.last_ok_ns = felix_monotonic_ns();
	}
	else
		strlcpy(health.last_error, call->error, sizeof(health.last_error));
}

static bool
authenticate(int64 deadline_ns, EtcdCall *call)
{
	char		password[1024];
	StringInfoData body;
	int			n = list_length(endpoints);

	read_password(password, sizeof(password));
	initStringInfo(&body);
	appendStringInfoChar(&body, '{');
	felix_json_put_string(&body, "name", felix_etcd_user);
	felix_json_put_string(&body, "password", password);
	appendStringInfoChar(&body, '}');
	explicit_bzero(password, sizeof(password));

	for (int tries = 0; tries < n && felix_monotonic_ns() < deadline_ns; tries++)
	{
		const char *endpoint = list_nth(endpoints, current % n);
		long		status = 0;
		JsonbContainer *root = NULL;
		char	   *tok = NULL;
		char	   *message = NULL;

		if (!post_one(endpoint, "/v3/auth/authenticate", body.data, deadline_ns,
					  Max(100, felix_etcd_timeout / n), call, &status, &root))
		{
			current = (current + 1) % n;
			continue;
		}
		if (status == 200 && felix_json_string(root, "token", &tok))
		{
			token = MemoryContextStrdup(TopMemoryContext, tok);
			explicit_bzero(body.data, body.len);
			return true;
		}
		if (!felix_json_string(root, "message", &message))
			message = psprintf("HTTP %ld", status);
		/* never the password: only what etcd said */
		note_error(call, endpoint,
				   psprintf("authentication as etcd user \"%s\" failed: %s",
							felix_etcd_user, message));
		call->outcome = ETCD_REFUSED;
		explicit_bzero(body.data, body.len);
		return false;
	}
	explicit_bzero(body.data, body.len);
	return false;
}

static void
report_failure(int elevel, const EtcdCall *call, const char *what)
{
	const char *hint;

	if (strstr(call->error, "too many operations in txn") != NULL)
		hint = "Run the etcd members with --max-txn-ops of at least felix.max_shards_per_stream + 1 (a stream is created in one transaction).";
	else if (call->outcome == ETCD_REFUSED &&
			 (strstr(call->error, "permission") != NULL || strstr(call->error, "auth") != NULL ||
			  strstr(call->error, "user") != NULL))
		hint = "Check felix.etcd_user, felix.etcd_password_file and the user's permissions on felix.etcd_prefix.";
	else if (call->outcome == ETCD_REFUSED)
		hint = "etcd refused the request as malformed: this is a felix bug; report it with this message.";
	else
		hint = "Check that a majority of the etcd members in felix.etcd_endpoints is running and reachable.";
	ereport(elevel,
			(errcode(call->outcome == ETCD_REFUSED ? ERRCODE_SYSTEM_ERROR
					 : ERRCODE_CONNECTION_FAILURE),
			 errmsg("felix: the etcd control-plane store did not %s: %s", what, call->error),
			 errhint("%s", hint)));
}

/* ---------------------------------------------------------------------
 * The store
 * ---------------------------------------------------------------------
 */

static bool
read_header_revision(JsonbContainer *root, int64 *revision)
{
	JsonbContainer *header = felix_json_object(root, "header");

	return header != NULL && felix_json_int64(header, "revision", revision);
}

/* kvs[] of a range answer (or of a txn's range response) into out. */
static bool
read_kvs(JsonbContainer *resp, FelixKV **out, int *n)
{
	JsonbContainer *kvs = felix_json_array(resp, "kvs");
	int			count = felix_json_length(kvs);
	int			plen = strlen(felix_etcd_prefix);

	*out = count > 0 ? palloc0(sizeof(FelixKV) * count) : NULL;
	*n = 0;
	for (int i = 0; i < count; i++)
	{
		JsonbContainer *kv = felix_json_elem_object(kvs, i);
		char	   *k64 = NULL;
		char	   *v64 = NULL;
		char	   *key;
		FelixKV    *dst = &(*out)[*n];

		if (!felix_json_string(kv, "key", &k64) ||
			!felix_json_int64(kv, "mod_revision", &dst->mod_revision))
			return false;
		key = unb64(k64, NULL);
		if (key == NULL || strncmp(key, felix_etcd_prefix, plen) != 0)
			return false;
		dst->key = pstrdup(key + plen);
		/* an empty value is left out of the JSON */
		if (felix_json_string(kv, "value", &v64))
		{
			dst->value = unb64(v64, NULL);
			if (dst->value == NULL)
				return false;
		}
		else
			dst->value = pstrdup("");
		(*n)++;
	}
	return true;
}

/*
 * One /v3/kv/range request (body) and its answer: the keys, the store's
 * revision, and (when more is not NULL) whether more keys follow.
 */
static FelixStoreStatus
range_call(const char *body, FelixKV **kvs, int *nkvs, bool *more, int64 *revision,
		   int elevel)
{
	EtcdCall	call;

	etcd_call("/v3/kv/range", body, false, &call);
	if (call.outcome != ETCD_ANSWER)
	{
		report_failure(elevel, &call, "answer a read");
		return FELIX_STORE_FAILED;
	}
	if (!read_header_revision(call.root, revision) ||
		!read_kvs(call.root, kvs, nkvs))
	{
		ereport(elevel,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("felix: the etcd control-plane store answered a read with something felix cannot read"),
				 errhint("Check that felix.etcd_endpoints names etcd v3 client URLs.")));
		return FELIX_STORE_FAILED;
	}
	/* proto3 JSON leaves false out */
	if (more != NULL)
		(void) felix_json_bool(call.root, "more", more);
	return FELIX_STORE_OK;
}

static FelixStoreStatus
etcd_range(const char *key, bool prefix, bool guarded, int64 changed_after,
		   FelixKV **kvs, int *nkvs, int64 *revision, int elevel)
{
	StringInfoData body;
	char	   *k = full_key(key);

	*kvs = NULL;
	*nkvs = 0;
	initStringInfo(&body);
	appendStringInfoChar(&body, '{');
	put_b64(&body, "key", k);
	if (prefix)
		put_b64(&body, "range_end", prefix_end(k));
	if (guarded)
		felix_json_put_bool(&body, "serializable", true);
	if (changed_after > 0)
		felix_json_put_string(&body, "min_mod_revision",
							  psprintf(INT64_FORMAT, changed_after + 1));
	appendStringInfoChar(&body, '}');
	return range_call(body.data, kvs, nkvs, NULL, revision, elevel);
}

static FelixStoreStatus
etcd_page(const char *after, int limit, FelixKV **kvs, int *nkvs, bool *more,
		  int64 *revision, int elevel)
{
	StringInfoData body;
	char	   *k = full_key(after);

	*kvs = NULL;
	*nkvs = 0;
	*more = false;
	initStringInfo(&body);
	appendStringInfoChar(&body, '{');
	/* the first key after `after`: it with a zero byte appended */
	felix_json_put_string(&body, "key", b64(k, strlen(k) + (after[0] != '\0' ? 1 : 0)));
	put_b64(&body, "range_end", prefix_end(full_key("")));
	felix_json_put_string(&body, "limit", psprintf("%d", limit));
	appendStringInfoChar(&body, '}');
	return range_call(body.data, kvs, nkvs, more, revision, elevel);
}

static FelixStoreStatus
etcd_txn(const FelixStoreCmp *cmps, int ncmps, const FelixStoreOp *ops, int nops,
		 int64 *revision, int elevel)
{
	StringInfoData body;
	EtcdCall	call;
	bool		succeeded = false;

	initStringInfo(&body);
	appendStringInfoString(&body, "{\"compare\":[");
	for (int i = 0; i < ncmps; i++)
	{
		appendStringInfoString(&body, i ? ",{" : "{");
		put_b64(&body, "key", full_key(cmps[i].key));
		felix_json_put_string(&body, "target", "MOD");
		felix_json_put_string(&body, "result", "EQUAL");
		felix_json_put_string(&body, "mod_revision",
							  psprintf(INT64_FORMAT, cmps[i].mod_revision));
		appendStringInfoChar(&body, '}');
	}
	appendStringInfoString(&body, "],\"success\":[");
	for (int i = 0; i < nops; i++)
	{
		appendStringInfoString(&body, i ? "," : "");
		if (ops[i].value != NULL)
		{
			appendStringInfoString(&body, "{\"request_put\":{");
			put_b64(&body, "key", full_key(ops[i].key));
			put_b64(&body, "value", ops[i].value);
			appendStringInfoString(&body, "}}");
		}
		else
		{
			appendStringInfoString(&body, "{\"request_delete_range\":{");
			put_b64(&body, "key", full_key(ops[i].key));
			appendStringInfoString(&body, "}}");
		}
	}
	appendStringInfoString(&body, "]}");

	etcd_call("/v3/kv/txn", body.data, true, &call);
	if (call.outcome != ETCD_ANSWER)
	{
		report_failure(elevel, &call, call.maybe_applied
					   ? "confirm a change (it may or may not have been made)"
					   : "make a change");
		return call.maybe_applied && call.outcome == ETCD_NO_ANSWER
			? FELIX_STORE_UNKNOWN : FELIX_STORE_FAILED;
	}
	if (!read_header_revision(call.root, revision))
	{
		ereport(elevel,
				(errcode(ERRCODE_PROTOCOL_VIOLATION),
				 errmsg("felix: the etcd control-plane store answered a change with something felix cannot read")));
		return FELIX_STORE_UNKNOWN;
	}
	/* proto3 JSON leaves false out */
	(void) felix_json_bool(call.root, "succeeded", &succeeded);
	return succeeded ? FELIX_STORE_OK : FELIX_STORE_CONFLICT;
}

const FelixStoreMethods felix_store_etcd = {
	"etcd",
	etcd_range,
	etcd_page,
	etcd_txn,
	NULL
};

/*
 * Which member leads, as the endpoint that answers says, by name (from
 * the member list).  For felix_nodes; false (reported at elevel) when no
 * endpoint answered.
 */
bool
felix_store_etcd_status(int elevel)
{
	EtcdCall	call;
	char	   *leader = NULL;
	JsonbContainer *members;

	etcd_call("/v3/maintenance/status", "{}", false, &call);
	if (call.outcome != ETCD_ANSWER)
	{
		report_failure(elevel, &call, "say who leads it");
		return false;
	}
	if (!felix_json_string(call.root, "leader", &leader))
	{
		strlcpy(health.leader, "(none)", sizeof(health.leader));
		return true;
	}
	snprintf(health.leader, sizeof(health.leader), "member %s", leader);

	etcd_call("/v3/cluster/member/list", "{}", false, &call);
	if (call.outcome != ETCD_ANSWER)
		return true;
	members = felix_json_array(call.root, "members");
	for (int i = 0; i < felix_json_length(members); i++)
	{
		JsonbContainer *m = felix_json_elem_object(members, i);
		char	   *id = NULL;
		char	   *name = NULL;

		if (felix_json_string(m, "ID", &id) && strcmp(id, leader) == 0 &&
			felix_json_string(m, "name", &name))
		{
			strlcpy(health.leader, name, sizeof(health.leader));
			break;
		}
	}
	return true;
}

const FelixStoreHealth *
felix_store_health(void)
{
	return &health;
}
