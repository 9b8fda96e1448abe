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
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

/* Lookup keys: "stream/shard", a node or stream name, or a store key, with a tag. */
#define CP_INDEX_KEY_LEN	(2 * NAMEDATALEN + 32)

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

char *
cp_new_uuid(void)
{
	return DatumGetCString(DirectFunctionCall1(uuid_out,
											   DirectFunctionCall1(gen_random_uuid, (Datum) 0)));
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

void
cp_snapshot_read_attempt(CpSnapshot *snap, int attempt)
{
	if (attempt > 0)
		cp_backoff(attempt);
	felix_store_serialize();
	(void) cp_snapshot_read(snap, false, ERROR);
}

/*
 * Parsed values, by key, for as long as the key holds the same text.  A
 * process reads the whole state several times a second, and nearly all of
 * it is what it was the last time: parsing thousands of JSON values anew
 * each time was most of what an idle control plane cost.  An entry is
 * used only for the very text it was parsed from, so a key rewritten
 * (or a store put back from a backup) is parsed again.  Records take
 * copies of what they read, so freeing a replaced entry frees nothing a
 * snapshot points at.  Entries of keys a whole read no longer finds are
 * dropped at that read (parse_cache_prune).
 */
typedef struct ParsedValue
{
	char		key[CP_INDEX_KEY_LEN];
	char	   *text;			/* in parse_cxt */
	Jsonb	   *jb;				/* in parse_cxt */
	uint64		seen;			/* the whole read that last found it */
} ParsedValue;

static HTAB *parse_cache = NULL;
static MemoryContext parse_cxt = NULL;
static uint64 parse_reads = 0;	/* whole reads so far */

static JsonbContainer *
parse_value(const FelixKV *kv)
{
	char		err[256];
	JsonbContainer *root;
	ParsedValue *pv = NULL;
	bool		found;

	if (parse_cache == NULL)
	{
		HASHCTL		ctl;

		parse_cxt = AllocSetContextCreate(TopMemoryContext, "felix parsed control-plane values",
										  ALLOCSET_DEFAULT_SIZES);
		ctl.keysize = CP_INDEX_KEY_LEN;
		ctl.entrysize = sizeof(ParsedValue);
		ctl.hcxt = parse_cxt;
		parse_cache = hash_create("felix parsed control-plane values", 1024, &ctl,
								  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	if (strlen(kv->key) < CP_INDEX_KEY_LEN)
	{
		pv = hash_search(parse_cache, kv->key, HASH_ENTER, &found);
		if (!found)
			pv->text = NULL, pv->jb = NULL;
		pv->seen = parse_reads;
		if (pv->text != NULL && strcmp(pv->text, kv->value) == 0)
			return &pv->jb->root;
	}

	root = felix_json_parse(kv->value, strlen(kv->value), err, sizeof(err));
	if (root == NULL || !JsonContainerIsObject(root))
	{
		ereport(LOG,
				(errmsg("felix: control-plane key \"%s\" holds a value felix cannot read; it is ignored",
						kv->key),
				 errdetail("%s", root == NULL ? err : "not a JSON object")));
		return NULL;
	}
	if (pv == NULL)
		return root;
	if (pv->text != NULL)
	{
		pfree(pv->text);
		pfree(pv->jb);
	}
	{
		/* root is the container of a whole jsonb datum */
		Jsonb	   *jb = (Jsonb *) ((char *) root - offsetof(Jsonb, root));

		pv->jb = MemoryContextAlloc(parse_cxt, VARSIZE(jb));
		memcpy(pv->jb, jb, VARSIZE(jb));
		pv->text = MemoryContextStrdup(parse_cxt, kv->value);
	}
	return &pv->jb->root;
}

/* After a whole read (parse_reads was advanced before it): drop what it did not find. */
static void
parse_cache_prune(void)
{
	HASH_SEQ_STATUS seq;
	ParsedValue *pv;

	if (parse_cache == NULL)
		return;
	hash_seq_init(&seq, parse_cache);
	while ((pv = hash_seq_search(&seq)) != NULL)
	{
		if (pv->seen == parse_reads)
			continue;
		if (pv->text != NULL)
		{
			pfree(pv->text);
			pfree(pv->jb);
		}
		(void) hash_search(parse_cache, pv->key, HASH_REMOVE, NULL);
	}
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

/*
 * Lookups by shard.  A snapshot of thousands of shards is looked up once
 * per shard by every rule, so each lookup is a hash probe, not a scan.
 * Keys are "stream/shard" (a stream's name may hold '/' but the shard
 * number after the last one does not, so no two shards share a key),
 * prefixed in a snapshot by what they name.
 */
typedef struct CpIndexEntry
{
	char		key[CP_INDEX_KEY_LEN];
	void	   *ptr;			/* snapshot: the record; node: its claim */
	int64		end;			/* node: its log end (-1: none given) */
	bool		unable;			/* node: it cannot serve the shard */
} CpIndexEntry;

static HTAB *
index_create(const char *what, long n)
{
	HASHCTL		ctl;

	ctl.keysize = CP_INDEX_KEY_LEN;
	ctl.entrysize = sizeof(CpIndexEntry);
	ctl.hcxt = CurrentMemoryContext;
	return hash_create(what, Max(n, 16), &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/* The entry of key (a printf format), entered when enter; NULL if absent. */
static CpIndexEntry *
index_probe(HTAB *index, bool enter, const char *fmt,...) pg_attribute_printf(3, 4);

static CpIndexEntry *
index_probe(HTAB *index, bool enter, const char *fmt,...)
{
	char		key[CP_INDEX_KEY_LEN];
	va_list		ap;
	bool		found;
	CpIndexEntry *e;

	memset(key, 0, sizeof(key));
	va_start(ap, fmt);
	vsnprintf(key, sizeof(key), fmt, ap);
	va_end(ap);
	e = hash_search(index, key, enter ? HASH_ENTER : HASH_FIND, &found);
	if (enter && !found)
	{
		e->ptr = NULL;
		e->end = -1;
		e->unable = false;
	}
	return e;
}

static HTAB *
node_index(const CpNode *n)
{
	HTAB	   *index;

	if (n->index != NULL)
		return n->index;
	index = index_create("felix node index", n->nunable + n->nends + n->nclaims);
	for (int i = 0; i < n->nunable; i++)
		index_probe(index, true, "%s", n->unable[i])->unable = true;
	for (int i = 0; i < n->nends; i++)
	{
		/* "stream/shard=next_seq": the end follows the last '=' */
		const char *eq = strrchr(n->ends[i], '=');
		int64		end;
		char	   *tail;
		CpIndexEntry *e;

		if (eq == NULL)
			continue;
		errno = 0;
		end = strtoll(eq + 1, &tail, 10);
		if (errno != 0 || *tail != '\0' || tail == eq + 1 || end < 0)
			continue;
		e = index_probe(index, true, "%.*s", (int) (eq - n->ends[i]), n->ends[i]);
		if (e->end < 0)
			e->end = end;
	}
	for (int i = 0; i < n->nclaims; i++)
	{
		CpIndexEntry *e = index_probe(index, true, "%s/%d",
									  n->claims[i].stream, n->claims[i].shard);

		if (e->ptr == NULL)
			e->ptr = &n->claims[i];
	}
	/* a cache: the node's content is what it was */
	((CpNode *) n)->index = index;
	return index;
}

bool
cp_node_unable(const CpNode *n, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(node_index(n), false, "%s/%d", stream, shard);

	return e != NULL && e->unable;
}

int64
cp_node_end(const CpNode *n, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(node_index(n), false, "%s/%d", stream, shard);

	return e != NULL ? e->end : -1;
}

const CpClaim *
cp_node_claim(const CpNode *n, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(node_index(n), false, "%s/%d", stream, shard);

	return e != NULL ? e->ptr : NULL;
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
cp_store_id_read(const FelixKV *kv, char **id)
{
	JsonbContainer *o = parse_value(kv);

	*id = NULL;
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "id", id))
		return malformed(kv, "store id");
	return true;
}

char *
cp_store_id_write(const char *id)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "id", id);
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

static void index_snapshot(CpSnapshot *snap);
static void parse_snapshot(CpSnapshot *snap, const FelixKV *kvs, int n);

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
	parse_reads++;
	parse_snapshot(snap, kvs, n);
	parse_cache_prune();
	return true;
}

bool
cp_snapshot_read_parts(CpSnapshot *snap, const char *const *prefixes, int nprefixes,
					   int elevel)
{
	FelixKV    *all = NULL;
	int			nall = 0;

	memset(snap, 0, sizeof(*snap));
	for (int p = 0; p < nprefixes; p++)
	{
		FelixKV    *kvs;
		int			n;
		int64		rev;

		if (felix_store_range(prefixes[p], true, &kvs, &n, &rev, elevel) != FELIX_STORE_OK)
			return false;
		all = all ? repalloc(all, sizeof(FelixKV) * (nall + n + 1))
			: palloc(sizeof(FelixKV) * (n + 1));
		memcpy(all + nall, kvs, sizeof(FelixKV) * n);
		nall += n;
		snap->revision = Max(snap->revision, rev);
	}
	parse_snapshot(snap, all, nall);
	return true;
}

static void
parse_snapshot(CpSnapshot *snap, const FelixKV *kvs, int n)
{
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
		else if (strcmp(k, CP_KEY_STORE_ID) == 0)
			(void) cp_store_id_read(&kvs[i], &snap->store_id);
	}
	index_snapshot(snap);
}

CpClash *
cp_snapshot_clash(const CpSnapshot *snap, const char *node)
{
	for (int i = 0; i < snap->nclashes; i++)
		if (strcmp(snap->clashes[i].node, node) == 0)
			return &snap->clashes[i];
	return NULL;
}

/* The first record of each name, as a scan in key order would find it. */
static void
index_snapshot(CpSnapshot *snap)
{
	CpIndexEntry *e;

	snap->index = index_create("felix snapshot index",
							   snap->nnodes + snap->nstreams + snap->nshards + snap->nreports);
	for (int i = 0; i < snap->nnodes; i++)
		if ((e = index_probe(snap->index, true, "n%s", snap->nodes[i].name))->ptr == NULL)
			e->ptr = &snap->nodes[i];
	for (int i = 0; i < snap->nstreams; i++)
		if ((e = index_probe(snap->index, true, "s%s", snap->streams[i].name))->ptr == NULL)
			e->ptr = &snap->streams[i];
	for (int i = 0; i < snap->nshards; i++)
		if ((e = index_probe(snap->index, true, "h%s/%d", snap->shards[i].stream,
							 snap->shards[i].shard))->ptr == NULL)
			e->ptr = &snap->shards[i];
	for (int i = 0; i < snap->nreports; i++)
		if ((e = index_probe(snap->index, true, "r%s/%d", snap->report_stream[i],
							 snap->report_shard[i]))->ptr == NULL)
			e->ptr = &snap->reports[i];
}

CpNode *
cp_snapshot_node(const CpSnapshot *snap, const char *name)
{
	CpIndexEntry *e;

	if (name == NULL)
		return NULL;
	e = index_probe(snap->index, false, "n%s", name);
	return e ? e->ptr : NULL;
}

CpStream *
cp_snapshot_stream(const CpSnapshot *snap, const char *name)
{
	CpIndexEntry *e = index_probe(snap->index, false, "s%s", name);

	return e ? e->ptr : NULL;
}

CpShard *
cp_snapshot_shard(const CpSnapshot *snap, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(snap->index, false, "h%s/%d", stream, shard);

	return e ? e->ptr : NULL;
}

CpReports *
cp_snapshot_reports(const CpSnapshot *snap, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(snap->index, false, "r%s/%d", stream, shard);

	return e ? e->ptr : NULL;
}

int64
cp_snapshot_leads_rev(const CpSnapshot *snap, const char *node)
{
	for (int i = 0; i < snap->nleads; i++)
		if (strcmp(snap->leads_node[i], node) == 0)
			return snap->leads_rev[i];
	return 0;
}
