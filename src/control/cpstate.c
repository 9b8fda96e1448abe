/*-------------------------------------------------------------------------
 *
 * cpstate.c
 *	  The control plane's records in and out of JSON, and the snapshot of
 *	  the whole state every control-plane call starts from.  See
 *	  cpstate.h for what each key holds.
 *
 *	  A value that does not parse as its record is logged and treated as
 *	  absent: whoever writes the key next replaces it, and nothing is
 *	  decided on a guess.
 *
 * Locking rule: none.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/time.h>

#include "common/pg_prng.h"
#include "control/cpstate.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/wait_event.h"
#include "control/json.h"
#include "utils/json.h"

char *
cp_key_node(const char *name)
{
	return psprintf("nodes/%s", name);
}

char *
cp_key_clash(const char *name)
{
	return psprintf("clashes/%s", name);
}

char *
cp_key_leads(const char *name)
{
	return psprintf("leads/%s", name);
}

char *
cp_key_stream(const char *name)
{
	return psprintf("streams/%s", name);
}

char *
cp_key_shard(const char *stream, int shard)
{
	return psprintf("shards/%s/%06d", stream, shard);
}

char *
cp_key_reports(const char *stream, int shard)
{
	return psprintf("reports/%s/%06d", stream, shard);
}

int64
cp_now_ms(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (int64) tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

void
cp_backoff(int attempt)
{
	long		ms = 1 + (long) (pg_prng_uint32(&pg_global_prng_state) % (uint32) (2 * Min(attempt, 10) + 1));

	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms,
					 PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}

static JsonbContainer *
parse_value(const FelixKV *kv)
{
	char		err[256];
	JsonbContainer *root = felix_json_parse(kv->value, strlen(kv->value), err, sizeof(err));

	if (root == NULL || !JsonContainerIsObject(root))
	{
		ereport(LOG,
				(errmsg("felix: control-plane key \"%s\" holds a value felix cannot read; it is ignored",
						kv->key),
				 errdetail("%s", root == NULL ? err : "not a JSON object")));
		return NULL;
	}
	return root;
}

static bool
malformed(const FelixKV *kv, const char *what)
{
	ereport(LOG,
			(errmsg("felix: control-plane key \"%s\" is not a valid %s; it is ignored",
					kv->key, what)));
	return false;
}

/* Optional string: NULL when absent or null. */
static char *
opt_string(JsonbContainer *o, const char *name)
{
	char	   *s = NULL;

	return felix_json_string(o, name, &s) ? s : NULL;
}

static int64
opt_int64(JsonbContainer *o, const char *name, int64 dflt)
{
	int64		v;

	return felix_json_int64(o, name, &v) ? v : dflt;
}

/* A JSON array of strings into a palloc'd array; false if not one. */
static bool
string_array(JsonbContainer *o, const char *name, char ***out, int *n, int max)
{
	JsonbContainer *arr = felix_json_array(o, name);

	*n = 0;
	*out = NULL;
	if (arr == NULL)
		return false;
	*n = felix_json_length(arr);
	if (max > 0 && *n > max)
		return false;
	*out = palloc0(sizeof(char *) * (*n + 1));
	for (int i = 0; i < *n; i++)
		if (!felix_json_elem_string(arr, i, &(*out)[i]))
			return false;
	return true;
}

static void
put_string_array(StringInfo buf, const char *name, char *const *items, int n)
{
	felix_json_put_string(buf, name, NULL);
	buf->len -= 4;				/* "null" */
	buf->data[buf->len] = '\0';
	appendStringInfoChar(buf, '[');
	for (int i = 0; i < n; i++)
	{
		if (i)
			appendStringInfoChar(buf, ',');
		escape_json(buf, items[i]);
	}
	appendStringInfoChar(buf, ']');
}

/* ---------------------------------------------------------------------
 * nodes/<name>
 * ---------------------------------------------------------------------
 */

bool
cp_node_read(const FelixKV *kv, CpNode *n)
{
	JsonbContainer *o = parse_value(kv);
	JsonbContainer *claims;
	JsonbContainer *peers;

	memset(n, 0, sizeof(*n));
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "name", &n->name) ||
		!felix_json_string(o, "conninfo", &n->conninfo) ||
		!felix_json_string(o, "incarnation", &n->incarnation) ||
		!felix_json_int64(o, "starts", &n->starts) ||
		!felix_json_string(o, "boot", &n->boot) ||
		!felix_json_int64(o, "beat", &n->beat) ||
		!string_array(o, "unable", &n->unable, &n->nunable, 0))
		return malformed(kv, "node");
	/* absent in records written before nodes gave their log ends */
	if (felix_json_array(o, "ends") != NULL &&
		!string_array(o, "ends", &n->ends, &n->nends, 0))
		return malformed(kv, "node");
	claims = felix_json_array(o, "claims");
	n->nclaims = felix_json_length(claims);
	n->claims = palloc0(sizeof(CpClaim) * (n->nclaims + 1));
	for (int i = 0; i < n->nclaims; i++)
	{
		JsonbContainer *c = felix_json_elem_object(claims, i);
		CpClaim    *cl = &n->claims[i];
		int64		shard,
					ms;

		if (!felix_json_string(c, "stream", &cl->stream) ||
			!felix_json_int64(c, "shard", &shard) ||
			!felix_json_int64(c, "generation", &cl->generation) ||
			!felix_json_int64(c, "lease_ms", &ms) ||
			shard < 0 || shard > PG_INT32_MAX || ms <= 0 || ms > PG_INT32_MAX)
			return malformed(kv, "node");
		cl->shard = (int) shard;
		cl->lease_ms = (int) ms;
	}
	n->ends_beat = opt_int64(o, "ends_beat", 0);
	n->prev_boot = opt_string(o, "prev_boot");
	n->prev_beat = opt_int64(o, "prev_beat", 0);
	n->registered_ms = opt_int64(o, "registered_ms", 0);
	n->heartbeat_ms = opt_int64(o, "heartbeat_ms", 0);
	peers = felix_json_object(o, "peers");
	n->peers = peers ? JsonbToCString(NULL, peers, 64) : pstrdup("{}");
	n->rev = kv->mod_revision;
	return true;
}

char *
cp_node_write(const CpNode *n)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "name", n->name);
	felix_json_put_string(&b, "conninfo", n->conninfo);
	felix_json_put_string(&b, "incarnation", n->incarnation);
	felix_json_put_int64(&b, "starts", n->starts);
	felix_json_put_string(&b, "boot", n->boot);
	felix_json_put_int64(&b, "beat", n->beat);
	put_string_array(&b, "unable", n->unable, n->nunable);
	put_string_array(&b, "ends", n->ends, n->nends);
	felix_json_put_int64(&b, "ends_beat", n->ends_beat);
	appendStringInfoString(&b, ",\"claims\":[");
	for (int i = 0; i < n->nclaims; i++)
	{
		appendStringInfoString(&b, i ? ",{" : "{");
		felix_json_put_string(&b, "stream", n->claims[i].stream);
		felix_json_put_int64(&b, "shard", n->claims[i].shard);
		felix_json_put_int64(&b, "generation", n->claims[i].generation);
		felix_json_put_int64(&b, "lease_ms", n->claims[i].lease_ms);
		appendStringInfoChar(&b, '}');
	}
	appendStringInfoChar(&b, ']');
	if (n->prev_boot)
	{
		felix_json_put_string(&b, "prev_boot", n->prev_boot);
		felix_json_put_int64(&b, "prev_beat", n->prev_beat);
	}
	felix_json_put_int64(&b, "registered_ms", n->registered_ms);
	felix_json_put_int64(&b, "heartbeat_ms", n->heartbeat_ms);
	appendStringInfo(&b, ",\"peers\":%s", n->peers ? n->peers : "{}");
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
cp_node_unable(const CpNode *n, const char *stream, int shard)
{
	char	   *name = psprintf("%s/%d", stream, shard);

	for (int i = 0; i < n->nunable; i++)
		if (strcmp(n->unable[i], name) == 0)
			return true;
	return false;
}

int64
cp_node_end(const CpNode *n, const char *stream, int shard)
{
	char	   *prefix = psprintf("%s/%d=", stream, shard);
	size_t		len = strlen(prefix);

	for (int i = 0; i < n->nends; i++)
	{
		int64		end;
		char	   *tail;

		if (strncmp(n->ends[i], prefix, len) != 0)
			continue;
		errno = 0;
		end = strtoll(n->ends[i] + len, &tail, 10);
		if (errno == 0 && *tail == '\0' && tail != n->ends[i] + len && end >= 0)
			return end;
	}
	return -1;
}

const CpClaim *
cp_node_claim(const CpNode *n, const char *stream, int shard)
{
	for (int i = 0; i < n->nclaims; i++)
		if (n->claims[i].shard == shard && strcmp(n->claims[i].stream, stream) == 0)
			return &n->claims[i];
	return NULL;
}

/* ---------------------------------------------------------------------
 * leads/<name>
 * ---------------------------------------------------------------------
 */

/* Its value does not matter: writing it is what changes its revision. */
const char *
cp_leads_value(void)
{
	return "{}";
}

/* ---------------------------------------------------------------------
 * streams/<name>
 * ---------------------------------------------------------------------
 */

bool
cp_stream_read(const FelixKV *kv, CpStream *s)
{
	JsonbContainer *o = parse_value(kv);
	int64		shards,
				rf;

	memset(s, 0, sizeof(*s));
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "name", &s->name) ||
		!felix_json_string(o, "schema", &s->schema) ||
		!felix_json_string(o, "creation_id", &s->creation_id) ||
		!felix_json_int64(o, "shards", &shards) ||
		!felix_json_int64(o, "replication_factor", &rf) ||
		!felix_json_string(o, "consistency", &s->consistency) ||
		!felix_json_string(o, "payload_type", &s->payload_type) ||
		!felix_json_string(o, "storage", &s->storage) ||
		shards <= 0 || shards > PG_INT32_MAX || rf <= 0 || rf > CP_MAX_REPLICAS)
		return malformed(kv, "stream");
	s->shards = (int) shards;
	s->replication_factor = (int) rf;
	s->retention_bytes = opt_int64(o, "retention_bytes", -1);
	{
		JsonbContainer *r = felix_json_object(o, "retention");
		int64		m,
					d;

		if (r != NULL)
		{
			if (!felix_json_int64(r, "months", &m) || !felix_json_int64(r, "days", &d) ||
				!felix_json_int64(r, "usec", &s->retention_usec) ||
				m < PG_INT32_MIN || m > PG_INT32_MAX || d < PG_INT32_MIN || d > PG_INT32_MAX)
				return malformed(kv, "stream");
			s->has_retention = true;
			s->retention_months = (int32) m;
			s->retention_days = (int32) d;
		}
	}
	s->created_ms = opt_int64(o, "created_ms", 0);
	s->rev = kv->mod_revision;
	return true;
}

char *
cp_stream_write(const CpStream *s)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "name", s->name);
	felix_json_put_string(&b, "schema", s->schema);
	felix_json_put_string(&b, "creation_id", s->creation_id);
	felix_json_put_int64(&b, "shards", s->shards);
	felix_json_put_int64(&b, "replication_factor", s->replication_factor);
	felix_json_put_string(&b, "consistency", s->consistency);
	felix_json_put_string(&b, "payload_type", s->payload_type);
	felix_json_put_string(&b, "storage", s->storage);
	if (s->retention_bytes >= 0)
		felix_json_put_int64(&b, "retention_bytes", s->retention_bytes);
	if (s->has_retention)
	{
		appendStringInfoString(&b, ",\"retention\":{");
		felix_json_put_int64(&b, "months", s->retention_months);
		felix_json_put_int64(&b, "days", s->retention_days);
		felix_json_put_int64(&b, "usec", s->retention_usec);
		appendStringInfoChar(&b, '}');
	}
	felix_json_put_int64(&b, "created_ms", s->created_ms);
	appendStringInfoChar(&b, '}');
	return b.data;
}

/* ---------------------------------------------------------------------
 * shards/<stream>/<shard>
 * ---------------------------------------------------------------------
 */

bool
cp_shard_read(const FelixKV *kv, CpShard *s)
{
	JsonbContainer *o = parse_value(kv);
	char	  **replicas;
	int64		shard;

	memset(s, 0, sizeof(*s));
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "stream", &s->stream) ||
		!felix_json_int64(o, "shard", &shard) ||
		!felix_json_int64(o, "generation", &s->generation) ||
		!string_array(o, "replicas", &replicas, &s->nreplicas, CP_MAX_REPLICAS + 1) ||
		shard < 0 || shard > PG_INT32_MAX || s->generation < 1 || s->nreplicas < 1)
		return malformed(kv, "shard assignment");
	s->shard = (int) shard;
	for (int i = 0; i < s->nreplicas; i++)
		s->replicas[i] = replicas[i];
	s->leader = opt_string(o, "leader");
	s->leader_incarnation = opt_string(o, "leader_incarnation");
	s->joining = opt_string(o, "joining");
	s->leaving = opt_string(o, "leaving");
	s->taken_generation = opt_int64(o, "taken_generation", 0);
	s->taken_boot = opt_string(o, "taken_boot");
	s->unplaced_reason = opt_string(o, "unplaced_reason");
	s->assigned_ms = opt_int64(o, "assigned_ms", 0);
	s->acked_floor = opt_int64(o, "acked_floor", 0);
	s->grant_end = opt_int64(o, "grant_end", 0);
	/* nothing outside the replica set ever leads: it holds no copy */
	if (s->leader && !cp_shard_has_replica(s, s->leader))
		return malformed(kv, "shard assignment");
	if ((s->joining == NULL) != (s->leaving == NULL) ||
		(s->joining && (!cp_shard_has_replica(s, s->joining) ||
						!cp_shard_has_replica(s, s->leaving))))
		return malformed(kv, "shard assignment");
	s->rev = kv->mod_revision;
	return true;
}

char *
cp_shard_write(const CpShard *s)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "stream", s->stream);
	felix_json_put_int64(&b, "shard", s->shard);
	felix_json_put_int64(&b, "generation", s->generation);
	felix_json_put_string(&b, "leader", s->leader);
	felix_json_put_string(&b, "leader_incarnation", s->leader_incarnation);
	put_string_array(&b, "replicas", s->replicas, s->nreplicas);
	if (s->joining)
	{
		felix_json_put_string(&b, "joining", s->joining);
		felix_json_put_string(&b, "leaving", s->leaving);
	}
	felix_json_put_int64(&b, "taken_generation", s->taken_generation);
	if (s->taken_boot)
		felix_json_put_string(&b, "taken_boot", s->taken_boot);
	if (s->unplaced_reason)
		felix_json_put_string(&b, "unplaced_reason", s->unplaced_reason);
	felix_json_put_int64(&b, "assigned_ms", s->assigned_ms);
	if (s->acked_floor > 0)
		felix_json_put_int64(&b, "acked_floor", s->acked_floor);
	if (s->grant_end > 0)
		felix_json_put_int64(&b, "grant_end", s->grant_end);
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
cp_shard_has_replica(const CpShard *s, const char *node)
{
	for (int i = 0; i < s->nreplicas; i++)
		if (strcmp(s->replicas[i], node) == 0)
			return true;
	return false;
}

/* ---------------------------------------------------------------------
 * reports/<stream>/<shard>
 * ---------------------------------------------------------------------
 */

bool
cp_reports_read(const FelixKV *kv, CpReports *r)
{
	JsonbContainer *o = parse_value(kv);
	JsonbContainer *rows;

	memset(r, 0, sizeof(*r));
	if (o == NULL)
		return false;
	rows = felix_json_array(o, "rows");
	if (rows == NULL || felix_json_length(rows) > CP_MAX_REPLICAS + 1)
		return malformed(kv, "set of replica reports");
	for (int i = 0; i < felix_json_length(rows); i++)
	{
		JsonbContainer *e = felix_json_elem_object(rows, i);
		CpReport   *x = &r->rows[i];

		if (!felix_json_string(e, "follower", &x->follower) ||
			!felix_json_string(e, "incarnation", &x->incarnation) ||
			!felix_json_int64(e, "generation", &x->generation) ||
			!felix_json_string(e, "leader", &x->leader) ||
			!felix_json_int64(e, "acked_end", &x->acked_end) ||
			!felix_json_bool(e, "caught_up", &x->caught_up))
			return malformed(kv, "set of replica reports");
		x->halted = opt_string(e, "halted");
		x->halted_since_ms = opt_int64(e, "halted_since_ms", 0);
		x->position = opt_int64(e, "position", -1);
		x->token = opt_int64(e, "token", 0);
		x->leader_beat = opt_int64(e, "leader_beat", 0);
		x->reported_ms = opt_int64(e, "reported_ms", 0);
		r->n++;
	}
	r->rev = kv->mod_revision;
	return true;
}

char *
cp_reports_write(const CpReports *r)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoString(&b, "{\"rows\":[");
	for (int i = 0; i < r->n; i++)
	{
		const CpReport *x = &r->rows[i];

		appendStringInfoString(&b, i ? ",{" : "{");
		felix_json_put_string(&b, "follower", x->follower);
		felix_json_put_string(&b, "incarnation", x->incarnation);
		felix_json_put_int64(&b, "generation", x->generation);
		felix_json_put_string(&b, "leader", x->leader);
		felix_json_put_int64(&b, "acked_end", x->acked_end);
		felix_json_put_bool(&b, "caught_up", x->caught_up);
		if (x->halted)
		{
			felix_json_put_string(&b, "halted", x->halted);
			felix_json_put_int64(&b, "halted_since_ms", x->halted_since_ms);
		}
		if (x->position >= 0)
			felix_json_put_int64(&b, "position", x->position);
		if (x->token != 0)
			felix_json_put_int64(&b, "token", x->token);
		felix_json_put_int64(&b, "leader_beat", x->leader_beat);
		felix_json_put_int64(&b, "reported_ms", x->reported_ms);
		appendStringInfoChar(&b, '}');
	}
	appendStringInfoString(&b, "]}");
	return b.data;
}

/* ---------------------------------------------------------------------
 * duty, alive
 * ---------------------------------------------------------------------
 */

bool
cp_duty_read(const FelixKV *kv, CpDuty *d)
{
	JsonbContainer *o = parse_value(kv);

	memset(d, 0, sizeof(*d));
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "node", &d->node) ||
		!felix_json_string(o, "boot", &d->boot) ||
		!felix_json_int64(o, "beat", &d->beat))
		return malformed(kv, "duty holder");
	d->since_ms = opt_int64(o, "since_ms", 0);
	d->rev = kv->mod_revision;
	return true;
}

char *
cp_duty_write(const CpDuty *d)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "node", d->node);
	felix_json_put_string(&b, "boot", d->boot);
	felix_json_put_int64(&b, "beat", d->beat);
	felix_json_put_int64(&b, "since_ms", d->since_ms);
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
cp_alive_read(const FelixKV *kv, CpAlive *a)
{
	JsonbContainer *o = parse_value(kv);

	memset(a, 0, sizeof(*a));
	if (o == NULL)
		return false;
	if (!string_array(o, "nodes", &a->nodes, &a->n, 0))
		return malformed(kv, "list of alive nodes");
	a->rev = kv->mod_revision;
	return true;
}

char *
cp_alive_write(const CpAlive *a)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	put_string_array(&b, "nodes", a->nodes, a->n);
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
cp_clash_read(const FelixKV *kv, CpClash *c)
{
	JsonbContainer *o = parse_value(kv);

	memset(c, 0, sizeof(*c));
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "node", &c->node) ||
		!felix_json_string(o, "incarnation", &c->incarnation) ||
		!felix_json_string(o, "conninfo", &c->conninfo) ||
		!felix_json_int64(o, "at_ms", &c->at_ms))
		return malformed(kv, "name clash");
	return true;
}

char *
cp_clash_write(const CpClash *c)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "node", c->node);
	felix_json_put_string(&b, "incarnation", c->incarnation);
	felix_json_put_string(&b, "conninfo", c->conninfo);
	felix_json_put_int64(&b, "at_ms", c->at_ms);
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
cp_alive_has(const CpAlive *a, const char *node)
{
	for (int i = 0; i < a->n; i++)
		if (strcmp(a->nodes[i], node) == 0)
			return true;
	return false;
}

/* ---------------------------------------------------------------------
 * The snapshot
 * ---------------------------------------------------------------------
 */

/* "stream/NNNNNN" after a prefix into (stream, shard); false if not so. */
static bool
split_shard_key(const char *rest, char **stream, int *shard)
{
	const char *slash = strrchr(rest, '/');
	char	   *end;
	long		v;

	if (slash == NULL || slash == rest)
		return false;
	errno = 0;
	v = strtol(slash + 1, &end, 10);
	if (errno != 0 || *end != '\0' || v < 0 || v > PG_INT32_MAX)
		return false;
	*stream = pnstrdup(rest, slash - rest);
	*shard = (int) v;
	return true;
}

bool
cp_snapshot_read(CpSnapshot *snap, bool guarded, int elevel)
{
	FelixKV    *kvs;
	int			n;
	FelixStoreStatus st;

	memset(snap, 0, sizeof(*snap));
	st = guarded ? felix_store_range_guarded("", true, &kvs, &n, &snap->revision, elevel)
		: felix_store_range("", true, &kvs, &n, &snap->revision, elevel);
	if (st != FELIX_STORE_OK)
		return false;
	snap->nodes = palloc0(sizeof(CpNode) * (n + 1));
	snap->streams = palloc0(sizeof(CpStream) * (n + 1));
	snap->shards = palloc0(sizeof(CpShard) * (n + 1));
	snap->reports = palloc0(sizeof(CpReports) * (n + 1));
	snap->report_stream = palloc0(sizeof(char *) * (n + 1));
	snap->report_shard = palloc0(sizeof(int) * (n + 1));
	snap->leads_node = palloc0(sizeof(char *) * (n + 1));
	snap->leads_rev = palloc0(sizeof(int64) * (n + 1));
	snap->clashes = palloc0(sizeof(CpClash) * (n + 1));
	for (int i = 0; i < n; i++)
	{
		const char *k = kvs[i].key;
		char	   *stream;
		int			shard;

		if (strncmp(k, "nodes/", 6) == 0)
		{
			if (cp_node_read(&kvs[i], &snap->nodes[snap->nnodes]) &&
				strcmp(snap->nodes[snap->nnodes].name, k + 6) == 0)
				snap->nnodes++;
		}
		else if (strncmp(k, "leads/", 6) == 0)
		{
			snap->leads_node[snap->nleads] = pstrdup(k + 6);
			snap->leads_rev[snap->nleads++] = kvs[i].mod_revision;
		}
		else if (strncmp(k, "streams/", 8) == 0)
		{
			if (cp_stream_read(&kvs[i], &snap->streams[snap->nstreams]) &&
				strcmp(snap->streams[snap->nstreams].name, k + 8) == 0)
				snap->nstreams++;
		}
		else if (strncmp(k, "shards/", 7) == 0)
		{
			if (split_shard_key(k + 7, &stream, &shard) &&
				cp_shard_read(&kvs[i], &snap->shards[snap->nshards]) &&
				strcmp(snap->shards[snap->nshards].stream, stream) == 0 &&
				snap->shards[snap->nshards].shard == shard)
				snap->nshards++;
		}
		else if (strncmp(k, "reports/", 8) == 0)
		{
			if (split_shard_key(k + 8, &stream, &shard) &&
				cp_reports_read(&kvs[i], &snap->reports[snap->nreports]))
			{
				snap->report_stream[snap->nreports] = stream;
				snap->report_shard[snap->nreports++] = shard;
			}
		}
		else if (strncmp(k, "clashes/", 8) == 0)
		{
			if (cp_clash_read(&kvs[i], &snap->clashes[snap->nclashes]) &&
				strcmp(snap->clashes[snap->nclashes].node, k + 8) == 0)
				snap->nclashes++;
		}
		else if (strcmp(k, CP_KEY_DUTY) == 0)
			snap->have_duty = cp_duty_read(&kvs[i], &snap->duty);
		else if (strcmp(k, CP_KEY_ALIVE) == 0)
			snap->have_alive = cp_alive_read(&kvs[i], &snap->alive);
	}
	return true;
}

CpClash *
cp_snapshot_clash(const CpSnapshot *snap, const char *node)
{
	for (int i = 0; i < snap->nclashes; i++)
		if (strcmp(snap->clashes[i].node, node) == 0)
			return &snap->clashes[i];
	return NULL;
}

CpNode *
cp_snapshot_node(const CpSnapshot *snap, const char *name)
{
	if (name == NULL)
		return NULL;
	for (int i = 0; i < snap->nnodes; i++)
		if (strcmp(snap->nodes[i].name, name) == 0)
			return &snap->nodes[i];
	return NULL;
}

CpStream *
cp_snapshot_stream(const CpSnapshot *snap, const char *name)
{
	for (int i = 0; i < snap->nstreams; i++)
		if (strcmp(snap->streams[i].name, name) == 0)
			return &snap->streams[i];
	return NULL;
}

CpShard *
cp_snapshot_shard(const CpSnapshot *snap, const char *stream, int shard)
{
	for (int i = 0; i < snap->nshards; i++)
		if (snap->shards[i].shard == shard && strcmp(snap->shards[i].stream, stream) == 0)
			return &snap->shards[i];
	return NULL;
}

CpReports *
cp_snapshot_reports(const CpSnapshot *snap, const char *stream, int shard)
{
	for (int i = 0; i < snap->nreports; i++)
		if (snap->report_shard[i] == shard && strcmp(snap->report_stream[i], stream) == 0)
			return &snap->reports[i];
	return NULL;
}

int64
cp_snapshot_leads_rev(const CpSnapshot *snap, const char *node)
{
	for (int i = 0; i < snap->nleads; i++)
		if (strcmp(snap->leads_node[i], node) == 0)
			return snap->leads_rev[i];
	return 0;
}
