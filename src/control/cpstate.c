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

#include <ctype.h>
#include <sys/time.h>

#include "base/metrics.h"
#include "common/pg_prng.h"
#include "control/cpstate.h"
#include "felix.h"
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
#include "access/xact.h"
#include "nodes/pg_list.h"

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
cp_key_ends(const char *name)
{
	return psprintf("ends/%s", name);
}

char *
cp_key_claims(const char *name)
{
	return psprintf("claims/%s", name);
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
	cp_serialize();
	(void) cp_snapshot_read(snap, false, ERROR);
}

/*
 * A key's value as JSON; NULL (logged) when it is not a JSON object.  It
 * lives until the next call: each reader below parses one value and copies
 * out what it keeps, and the copy of the state a process keeps (cache_put)
 * would otherwise hold every record's parse besides the record.
 */
static JsonbContainer *
parse_value(const FelixKV *kv)
{
	static MemoryContext value_cxt = NULL;
	char		err[256];
	JsonbContainer *root;
	MemoryContext old;

	if (value_cxt == NULL)
		value_cxt = AllocSetContextCreate(TopMemoryContext, "felix control-plane value",
										  ALLOCSET_DEFAULT_SIZES);
	MemoryContextReset(value_cxt);
	old = MemoryContextSwitchTo(value_cxt);
	root = felix_json_parse(kv->value, strlen(kv->value), err, sizeof(err));
	MemoryContextSwitchTo(old);

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

/* A JSON array of claims into *out (false: malformed). */
static bool
claims_array(JsonbContainer *claims, CpClaim **out, int *n)
{
	*n = felix_json_length(claims);
	*out = palloc0(sizeof(CpClaim) * (*n + 1));
	for (int i = 0; i < *n; i++)
	{
		JsonbContainer *c = felix_json_elem_object(claims, i);
		CpClaim    *cl = &(*out)[i];
		int64		shard,
					ms;

		if (c == NULL ||
			!felix_json_string(c, "stream", &cl->stream) ||
			!felix_json_int64(c, "shard", &shard) ||
			!felix_json_int64(c, "generation", &cl->generation) ||
			!felix_json_int64(c, "lease_ms", &ms) ||
			shard < 0 || shard > PG_INT32_MAX || ms <= 0 || ms > PG_INT32_MAX)
			return false;
		cl->shard = (int) shard;
		cl->lease_ms = (int) ms;
	}
	return true;
}

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
	/* felix 1.1 before claims/<name> kept them here (read, never written) */
	claims = felix_json_array(o, "claims");
	if (claims != NULL && !claims_array(claims, &n->claims, &n->nclaims))
		return malformed(kv, "node");
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
	felix_json_put_int64(&b, "ends_beat", n->ends_beat);
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

/* ---------------------------------------------------------------------
 * ends/<name>, claims/<name>
 * ---------------------------------------------------------------------
 */

bool
cp_ends_read(const FelixKV *kv, CpNodeEnds *e)
{
	JsonbContainer *o = parse_value(kv);

	memset(e, 0, sizeof(*e));
	if (o == NULL)
		return false;
	if (!felix_json_string(o, "boot", &e->boot) ||
		!string_array(o, "ends", &e->ends, &e->nends, 0))
		return malformed(kv, "record of log ends");
	e->rev = kv->mod_revision;
	return true;
}

char *
cp_ends_write(const char *boot, char *const *ends, int nends)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoChar(&b, '{');
	felix_json_put_string(&b, "boot", boot);
	put_string_array(&b, "ends", ends, nends);
	appendStringInfoChar(&b, '}');
	return b.data;
}

bool
cp_claims_read(const FelixKV *kv, CpNodeClaims *c)
{
	JsonbContainer *o = parse_value(kv);
	JsonbContainer *claims;

	memset(c, 0, sizeof(*c));
	if (o == NULL)
		return false;
	claims = felix_json_array(o, "claims");
	if (claims == NULL || !claims_array(claims, &c->claims, &c->nclaims))
		return malformed(kv, "record of claims");
	c->rev = kv->mod_revision;
	return true;
}

char *
cp_claims_write(const CpClaim *claims, int nclaims)
{
	StringInfoData b;

	initStringInfo(&b);
	appendStringInfoString(&b, "{\"claims\":[");
	for (int i = 0; i < nclaims; i++)
	{
		appendStringInfoString(&b, i ? ",{" : "{");
		felix_json_put_string(&b, "stream", claims[i].stream);
		felix_json_put_int64(&b, "shard", claims[i].shard);
		felix_json_put_int64(&b, "generation", claims[i].generation);
		felix_json_put_int64(&b, "lease_ms", claims[i].lease_ms);
		appendStringInfoChar(&b, '}');
	}
	appendStringInfoString(&b, "]}");
	return b.data;
}

bool
cp_claims_equal(const CpClaim *a, int na, const CpClaim *b, int nb)
{
	if (na != nb)
		return false;
	for (int i = 0; i < na; i++)
		if (a[i].shard != b[i].shard || a[i].generation != b[i].generation ||
			a[i].lease_ms != b[i].lease_ms || strcmp(a[i].stream, b[i].stream) != 0)
			return false;
	return true;
}

bool
cp_ends_equal(char *const *a, int na, char *const *b, int nb)
{
	if (na != nb)
		return false;
	for (int i = 0; i < na; i++)
		if (strcmp(a[i], b[i]) != 0)
			return false;
	return true;
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
	void	   *ptr;			/* node: its claim */
	int			pos;			/* snapshot: the record's place in its array */
	int64		end;			/* node: its log end (-1: none given) */
	int64		last_generation;	/* node: of its last record (-1: not given) */
	int64		copy_epoch;		/* node: its copy's epoch (0: not given) */
	bool		copy_first;		/* node: ... its first in the node's boot */
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

/*
 * The entry of key tag + name (its first len bytes; len -1: all of it) +
 * "/shard" (shard -1: none), entered when enter; NULL if absent.  Built
 * by hand, not by printf: rules look up thousands of keys per call.
 */
static CpIndexEntry *
index_probe(HTAB *index, bool enter, char tag, const char *name, int len, int shard)
{
	char		key[CP_INDEX_KEY_LEN];
	int			n = 0;
	bool		found;
	CpIndexEntry *e;

	if (tag)
		key[n++] = tag;
	if (len < 0)
		len = strlen(name);
	len = Min(len, CP_INDEX_KEY_LEN - 16);
	memcpy(key + n, name, len);
	n += len;
	if (shard >= 0)
	{
		key[n++] = '/';
		n += pg_ltoa(shard, key + n);
	}
	key[n] = '\0';
	e = hash_search(index, key, enter ? HASH_ENTER : HASH_FIND, &found);
	if (enter && !found)
	{
		e->ptr = NULL;
		e->pos = -1;
		e->end = -1;
		e->last_generation = -1;
		e->copy_epoch = 0;
		e->copy_first = false;
		e->unable = false;
	}
	return e;
}

/*
 * A node's shards it cannot serve, its log ends and its claims, each by
 * "stream/shard", built at the first lookup (a record in this process's
 * copy of the state comes with them built): its content must not change
 * after it.
 */
static HTAB *
unable_index(const CpNode *n)
{
	if (n->unable_index == NULL)
	{
		HTAB	   *index = index_create("felix node index", n->nunable);

		for (int i = 0; i < n->nunable; i++)
			index_probe(index, true, 0, n->unable[i], -1, -1)->unable = true;
		((CpNode *) n)->unable_index = index;
	}
	return n->unable_index;
}

struct HTAB *
cp_ends_index(char *const *ends, int nends)
{
	HTAB	   *index = index_create("felix node index", nends);

	for (int i = 0; i < nends; i++)
	{
		/*
		 * "stream/shard=next_seq[:last_generation:copy_epoch[:first]]":
		 * the end follows the last '='; the generation of the last record,
		 * the copy's epoch and whether it is the copy's first in the boot
		 * (agent_held_ends) come with it when every record written was
		 * durable.
		 */
		const char *eq = strrchr(ends[i], '=');
		int64		nums[4] = {-1, -1, 0, 0};
		int			nnums = 0;
		bool		bad = false;
		const char *p;
		CpIndexEntry *e;

		if (eq == NULL)
			continue;
		for (p = eq + 1;;)
		{
			char	   *tail;

			if (!isdigit((unsigned char) *p))
			{
				bad = true;
				break;
			}
			errno = 0;
			nums[nnums++] = strtoll(p, &tail, 10);
			if (errno != 0)
			{
				bad = true;
				break;
			}
			p = tail;
			if (*p == '\0')
				break;
			if (*p != ':' || nnums == 4)
			{
				bad = true;
				break;
			}
			p++;
		}
		if (bad || nnums == 2 || (nnums == 4 && nums[3] > 1))
			continue;
		e = index_probe(index, true, 0, ends[i], (int) (eq - ends[i]), -1);
		if (e->end < 0)
		{
			e->end = nums[0];
			if (nnums >= 3 && nums[2] > 0)
			{
				e->last_generation = nums[1];
				e->copy_epoch = nums[2];
				e->copy_first = nums[3] == 1;
			}
		}
	}
	return index;
}

struct HTAB *
cp_claims_index(const CpClaim *claims, int nclaims)
{
	HTAB	   *index = index_create("felix node index", nclaims);

	for (int i = 0; i < nclaims; i++)
	{
		CpIndexEntry *e = index_probe(index, true, 0, claims[i].stream, -1, claims[i].shard);

		if (e->ptr == NULL)
			e->ptr = (void *) &claims[i];
	}
	return index;
}

bool
cp_node_unable(const CpNode *n, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(unable_index(n), false, 0, stream, -1, shard);

	return e != NULL && e->unable;
}

int64
cp_node_end(const CpNode *n, const char *stream, int shard)
{
	CpIndexEntry *e;

	if (n->ends_index == NULL)
		((CpNode *) n)->ends_index = cp_ends_index(n->ends, n->nends);
	e = index_probe(n->ends_index, false, 0, stream, -1, shard);
	return e != NULL ? e->end : -1;
}

bool
cp_node_copy(const CpNode *n, const char *stream, int shard, CpCopy *copy)
{
	CpIndexEntry *e;

	if (n->ends_index == NULL)
		((CpNode *) n)->ends_index = cp_ends_index(n->ends, n->nends);
	e = index_probe(n->ends_index, false, 0, stream, -1, shard);
	if (e == NULL || e->end < 0 || e->copy_epoch <= 0)
		return false;
	copy->end = e->end;
	copy->last_generation = e->last_generation;
	copy->token = psprintf("%s#" INT64_FORMAT, n->boot, e->copy_epoch);
	copy->first_token = e->copy_first ? cp_first_copy_token(n) : NULL;
	return true;
}

char *
cp_first_copy_token(const CpNode *n)
{
	return psprintf("%s#0", n->boot);
}

bool
cp_copy_kept(const CpCopy *copy, const char *token)
{
	return strcmp(copy->token, token) == 0 ||
		(copy->first_token != NULL && strcmp(copy->first_token, token) == 0);
}

int64
cp_node_last_generation(const CpNode *n, const char *stream, int shard)
{
	CpCopy		copy;

	return cp_node_copy(n, stream, shard, &copy) ? copy.last_generation : -1;
}

const CpClaim *
cp_node_claim(const CpNode *n, const char *stream, int shard)
{
	CpIndexEntry *e;

	if (n->claims_index == NULL)
		((CpNode *) n)->claims_index = cp_claims_index(n->claims, n->nclaims);
	e = index_probe(n->claims_index, false, 0, stream, -1, shard);
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
	s->grant_last_generation = opt_int64(o, "grant_last_generation", -1);
	s->taken_end = opt_int64(o, "taken_end", -1);
	s->taken_last_generation = opt_int64(o, "taken_last_generation", -1);
	if (felix_json_array(o, "taken_copy_nodes") != NULL)
	{
		char	  **nodes;
		char	  **tokens;
		int			ntokens;

		if (!string_array(o, "taken_copy_nodes", &nodes, &s->ntaken_copies, CP_MAX_REPLICAS + 1) ||
			!string_array(o, "taken_copy_tokens", &tokens, &ntokens, CP_MAX_REPLICAS + 1) ||
			ntokens != s->ntaken_copies)
			return malformed(kv, "shard assignment");
		for (int i = 0; i < s->ntaken_copies; i++)
		{
			s->taken_copy_node[i] = nodes[i];
			s->taken_copy_token[i] = tokens[i];
		}
	}
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
	if (s->grant_last_generation >= 0)
		felix_json_put_int64(&b, "grant_last_generation", s->grant_last_generation);
	if (s->taken_generation > 0 && s->taken_end >= 0 && s->taken_last_generation >= 0)
	{
		felix_json_put_int64(&b, "taken_end", s->taken_end);
		felix_json_put_int64(&b, "taken_last_generation", s->taken_last_generation);
		put_string_array(&b, "taken_copy_nodes", s->taken_copy_node, s->ntaken_copies);
		put_string_array(&b, "taken_copy_tokens", s->taken_copy_token, s->ntaken_copies);
	}
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

static HTAB *index_snapshot(const CpSnapshot *snap);
static struct CpShardOrder *shard_order_build(const CpSnapshot *snap);

/* ---------------------------------------------------------------------
 * The snapshot, and this process's copy of the state it is made from
 * ---------------------------------------------------------------------
 */

typedef enum CachedKind
{
	CK_NONE,					/* a key no record is read from, or malformed */
	CK_NODE,
	CK_ENDS,
	CK_CLAIMS,
	CK_LEADS,
	CK_STREAM,
	CK_SHARD,
	CK_REPORTS,
	CK_CLASH,
	CK_DUTY,
	CK_ALIVE,
	CK_STORE_ID,
	CK_MARK						/* a key whose revision is all it says */
} CachedKind;

/* One key of the state, decoded. */
typedef struct CachedKey
{
	char		key[CP_INDEX_KEY_LEN];	/* hash key */
	int64		mod_revision;
	char	   *text;			/* the value it was decoded from */
	CachedKind	kind;
	union
	{
		CpNode		node;
		CpNodeEnds	ends;
		CpNodeClaims claims;
		CpStream	stream;
		CpShard		shard;
		CpReports  *reports;	/* its own allocation: snapshots point at it */
		CpClash		clash;
		CpDuty		duty;
		CpAlive		alive;
		char	   *store_id;
	}			rec;
	char	   *report_stream;	/* CK_REPORTS: of (report_stream, report_shard) */
	int			report_shard;
	struct HTAB *index;			/* CK_ENDS, CK_CLAIMS: cp_ends_index, ... */
	MemoryContext own;			/* CK_NODE, CK_ENDS, CK_CLAIMS: the record's
								 * own memory */
	uint64		seen;			/* the whole read that last found it */
} CachedKey;

/*
 * The state as this process last read it, decoded, key by key.  A process
 * reads the state several times a second, and nearly all of it is what it
 * was: reading and decoding thousands of records anew each time was most
 * of what an idle control plane cost.  So a read asks the store only for
 * the keys written since the newest revision already held
 * (felix_store_range_changed), and decodes those.
 *
 * When it reads everything again: a deletion among the changes (the store
 * marks each one), a store behind the copy (put back from a backup), and a
 * transaction of this process that aborted (embedded store: a read in it
 * may have seen its own writes, which never happened).  A whole read keeps
 * a record only for the very value it was decoded from.
 *
 * A key written or deleted without felix's marks (by hand) would not show
 * in a read of what changed.  Guarding against that is one process's
 * work, not every reader's: every reader reading the whole state once a
 * minute was most of an idle cluster's control-plane traffic at thousands
 * of shards (3.9 MB a read).  The duty holder calls cp_snapshot_guard at
 * every tick: every felix.store_guard_interval it reads the whole state
 * again, a page of keys per tick (a read of the whole at once took longer
 * than the holder's duty lease at 3,000 shards, and the duties changed
 * hands), and compares each page with its copy; when the copy had missed
 * something the holder writes the deletions key, which sends every other
 * reader to a whole read of its own.
 *
 * Lifetime rule.  A snapshot copies records by value (a report it points
 * at instead: the largest record, in an allocation of its own), but their
 * strings and arrays stay in this copy: a replaced record's memory is
 * freed only at cp_snapshot_quiesce, which a process calls when no
 * snapshot is in use -- a backend at the end of each transaction, a worker
 * that called cp_snapshot_cache_enable at the top of each loop.  Other
 * background workers read without a copy.  Nothing a snapshot points at
 * is in a hash entry (entries are reused).
 */
typedef struct StateCache
{
	bool		enabled;
	HTAB	   *keys;			/* CachedKey by key */
	MemoryContext cxt;			/* keys, and every record but nodes' */
	CachedKey **order;			/* entries in key order (NULL: to sort) */
	int			norder;
	struct HTAB *index;			/* index_snapshot of a snapshot in that
								 * order (NULL: to build) */
	struct CpShardOrder *shard_order;	/* shard_order_build of one (NULL:
										 * to build; again when a shard
										 * record changes) */
	int64		since;			/* newest mod_revision held */
	int64		ends_since;		/* ... of every ends/ key (cache_refresh) */
	char	   *ends_own;		/* whose ends/ key is held up to since
								 * regardless (NULL: none); in cxt */
	int64		revision;		/* the store's revision at the last read */
	bool		need_full;
	bool		read_own_writes;	/* read after this transaction wrote */
	uint64		conflicts;		/* felix_store_conflicts() as of the last read */
	int64		guard_at_ns;	/* when the guard's last pass began */
	char	   *guard_after;	/* its next page starts after this key (NULL:
								 * no pass under way); TopMemoryContext */
	uint64		reads;			/* whole reads so far */
	int64		live_bytes;		/* about what the records in use take */
	int64		garbage_bytes;	/* ... and the replaced ones not yet freed */
	List	   *retired;		/* node records' contexts to free */
	char	   *store;			/* which store and prefix the copy is of */
	CachedKey **by_kind[CK_MARK + 1];	/* order, split by kind (made with it) */
	int			nby_kind[CK_MARK + 1];

	/*
	 * The bulk of a snapshot -- its streams, shards and reports -- as the
	 * last one built them, copied whole into the next while no record of
	 * that kind changed (tmpl_ok): most reads bring a node's record and
	 * nothing else, and walking every record at every read was most of
	 * what an idle control plane still cost at thousands of shards.
	 */
	CpSnapshot	tmpl;
	bool		tmpl_ok[CK_MARK + 1];
} StateCache;

static StateCache cache;

static void cache_put(const FelixKV *kv, bool seen);
static void cache_tidy(bool may_compact);

/*
 * The guard reads this many keys a tick: some 300 KB at most, a small
 * part of a tick (a shard record or report is under 1 KB).
 */
#define CACHE_GUARD_PAGE		400
/*
 * The guard is not a need: when a page cannot be read, the holder goes on
 * with a read of what changed, and the pass starts again this much later.
 */
#define CACHE_GUARD_RETRY_NS	(INT64CONST(10) * 1000000000)
/* Replaced records kept before the copy is thrown away at a quiet point. */
#define CACHE_GARBAGE_MIN		(16 * 1024 * 1024)

/* About what decoding a value takes, for the accounts above. */
static int64
cost_of(const CachedKey *e)
{
	return e->text ? 3 * (int64) strlen(e->text) + 256 +
		(e->kind == CK_REPORTS ? (int64) sizeof(CpReports) : 0) : 0;
}

/* Decode kv into e (kind CK_NONE when it holds no record felix reads). */
static void
decode_kv(const FelixKV *kv, CachedKey *e)
{
	const char *k = kv->key;
	char	   *stream;
	int			shard;

	e->kind = CK_NONE;
	if (strncmp(k, "nodes/", 6) == 0)
	{
		if (cp_node_read(kv, &e->rec.node) && strcmp(e->rec.node.name, k + 6) == 0)
			e->kind = CK_NODE;
	}
	else if (strncmp(k, "ends/", 5) == 0)
	{
		if (cp_ends_read(kv, &e->rec.ends))
			e->kind = CK_ENDS;
	}
	else if (strncmp(k, "claims/", 7) == 0)
	{
		if (cp_claims_read(kv, &e->rec.claims))
			e->kind = CK_CLAIMS;
	}
	else if (strncmp(k, "leads/", 6) == 0)
		e->kind = CK_LEADS;
	else if (strncmp(k, "streams/", 8) == 0)
	{
		if (cp_stream_read(kv, &e->rec.stream) && strcmp(e->rec.stream.name, k + 8) == 0)
			e->kind = CK_STREAM;
	}
	else if (strncmp(k, "shards/", 7) == 0)
	{
		if (split_shard_key(k + 7, &stream, &shard) &&
			cp_shard_read(kv, &e->rec.shard) &&
			strcmp(e->rec.shard.stream, stream) == 0 && e->rec.shard.shard == shard)
			e->kind = CK_SHARD;
	}
	else if (strncmp(k, "reports/", 8) == 0)
	{
		e->rec.reports = palloc(sizeof(CpReports));
		if (split_shard_key(k + 8, &stream, &shard) &&
			cp_reports_read(kv, e->rec.reports))
		{
			e->kind = CK_REPORTS;
			e->report_stream = stream;
			e->report_shard = shard;
		}
	}
	else if (strncmp(k, "clashes/", 8) == 0)
	{
		if (cp_clash_read(kv, &e->rec.clash) && strcmp(e->rec.clash.node, k + 8) == 0)
			e->kind = CK_CLASH;
	}
	else if (strcmp(k, CP_KEY_DUTY) == 0)
		e->kind = cp_duty_read(kv, &e->rec.duty) ? CK_DUTY : CK_NONE;
	else if (strcmp(k, CP_KEY_ALIVE) == 0)
		e->kind = cp_alive_read(kv, &e->rec.alive) ? CK_ALIVE : CK_NONE;
	else if (strcmp(k, CP_KEY_STORE_ID) == 0)
		e->kind = cp_store_id_read(kv, &e->rec.store_id) ? CK_STORE_ID : CK_NONE;
	else if (strcmp(k, CP_KEY_ADDRESSES) == 0 || strcmp(k, FELIX_STORE_KEY_DELETIONS) == 0)
		e->kind = CK_MARK;
}

/* The kinds whose records make the bulk of a snapshot (see StateCache.tmpl). */
static bool
bulk_kind(CachedKind kind)
{
	return kind == CK_STREAM || kind == CK_SHARD || kind == CK_REPORTS;
}

/* Room in snap for n records of each kind (of the bulk kinds too if bulk). */
static void
snap_alloc(CpSnapshot *snap, const int *count, bool bulk)
{
	snap->nodes = palloc0(sizeof(CpNode) * (count[CK_NODE] + 1));
	if (bulk)
	{
		snap->streams = palloc0(sizeof(CpStream) * (count[CK_STREAM] + 1));
		snap->shards = palloc0(sizeof(CpShard) * (count[CK_SHARD] + 1));
		snap->reports = palloc0(sizeof(CpReports *) * (count[CK_REPORTS] + 1));
		snap->report_stream = palloc0(sizeof(char *) * (count[CK_REPORTS] + 1));
		snap->report_shard = palloc0(sizeof(int) * (count[CK_REPORTS] + 1));
	}
	snap->leads_node = palloc0(sizeof(char *) * (count[CK_LEADS] + 1));
	snap->leads_rev = palloc0(sizeof(int64) * (count[CK_LEADS] + 1));
	snap->clashes = palloc0(sizeof(CpClash) * (count[CK_CLASH] + 1));
}

/* Add the record of e (taken in key order) to snap. */
static void
snap_add(CpSnapshot *snap, const CachedKey *e)
{
	switch (e->kind)
	{
		case CK_NONE:
			break;
		case CK_NODE:
			snap->nodes[snap->nnodes++] = e->rec.node;
			break;
		case CK_ENDS:
		case CK_CLAIMS:
			break;				/* joined to their node (snap_build) */
		case CK_LEADS:
			snap->leads_node[snap->nleads] = pstrdup(e->key + 6);
			snap->leads_rev[snap->nleads++] = e->mod_revision;
			break;
		case CK_STREAM:
			snap->streams[snap->nstreams++] = e->rec.stream;
			break;
		case CK_SHARD:
			snap->shards[snap->nshards++] = e->rec.shard;
			break;
		case CK_REPORTS:
			snap->reports[snap->nreports] = e->rec.reports;
			snap->report_stream[snap->nreports] = e->report_stream;
			snap->report_shard[snap->nreports++] = e->report_shard;
			break;
		case CK_CLASH:
			snap->clashes[snap->nclashes++] = e->rec.clash;
			break;
		case CK_DUTY:
			snap->have_duty = true;
			snap->duty = e->rec.duty;
			break;
		case CK_ALIVE:
			snap->have_alive = true;
			snap->alive = e->rec.alive;
			break;
		case CK_STORE_ID:
			snap->store_id = e->rec.store_id;
			break;
		case CK_MARK:
			if (strcmp(e->key, CP_KEY_ADDRESSES) == 0)
				snap->addresses_rev = e->mod_revision;
			else
				snap->deletions_rev = e->mod_revision;
			break;
	}
}

/*
 * An abort undoes this transaction's writes to the embedded store; if the
 * copy read after one of them, it may hold values that never were.  (An
 * abort before any write -- a heartbeat that timed out reading -- leaves
 * the copy good: throwing it away then made the next call slower still.)
 */
static void
cache_xact_callback(XactEvent event, void *arg)
{
	if ((event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT) &&
		cache.read_own_writes)
		cache.need_full = true;
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
		cache.read_own_writes = false;
	/* nothing is decoded while a transaction aborts */
	if ((event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT) && !IsBackgroundWorker)
		cache_tidy(event == XACT_EVENT_COMMIT);
}

static void
cache_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && cache.read_own_writes)
		cache.need_full = true;
}

void
cp_snapshot_cache_enable(void)
{
	if (cache.enabled)
		return;
	RegisterXactCallback(cache_xact_callback, NULL);
	RegisterSubXactCallback(cache_subxact_callback, NULL);
	cache.enabled = true;
}

/*
 * A key came or went, or changed kind: the snapshot's records move in
 * their arrays.  The old order and index are garbage, freed with the copy.
 */
static void
cache_reorder(void)
{
	if (cache.order != NULL)
		cache.garbage_bytes += (int64) cache.norder * (sizeof(CachedKey *) + 256);
	cache.order = NULL;
	cache.index = NULL;
	cache.shard_order = NULL;
	memset(cache.tmpl_ok, 0, sizeof(cache.tmpl_ok));
}

/* Throw the whole copy away (at a quiet point only). */
static void
cache_drop(void)
{
	ListCell   *lc;
	HASH_SEQ_STATUS seq;
	CachedKey  *e;

	if (cache.keys != NULL)
	{
		hash_seq_init(&seq, cache.keys);
		while ((e = hash_seq_search(&seq)) != NULL)
			if (e->own)
				cache.retired = lappend(cache.retired, e->own);
	}
	foreach(lc, cache.retired)
		MemoryContextDelete((MemoryContext) lfirst(lc));
	list_free(cache.retired);
	cache.retired = NIL;
	if (cache.cxt)
		MemoryContextDelete(cache.cxt);
	cache.cxt = NULL;
	cache.keys = NULL;
	cache.order = NULL;
	cache.index = NULL;
	cache.shard_order = NULL;
	cache.norder = 0;
	cache.since = 0;
	cache.ends_since = 0;
	cache.ends_own = NULL;
	cache.revision = 0;
	cache.live_bytes = 0;
	cache.garbage_bytes = 0;
	cache.store = NULL;
	memset(cache.by_kind, 0, sizeof(cache.by_kind));
	memset(cache.nby_kind, 0, sizeof(cache.nby_kind));
	memset(&cache.tmpl, 0, sizeof(cache.tmpl));
	memset(cache.tmpl_ok, 0, sizeof(cache.tmpl_ok));
}

/* An empty copy of the state of store tag. */
static void
cache_create(const char *tag)
{
	HASHCTL		ctl;

	cache.cxt = AllocSetContextCreate(TopMemoryContext, "felix control-plane state",
									  ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = CP_INDEX_KEY_LEN;
	ctl.entrysize = sizeof(CachedKey);
	ctl.hcxt = cache.cxt;
	cache.keys = hash_create("felix control-plane state", 1024, &ctl,
							 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	cache.store = MemoryContextStrdup(cache.cxt, tag);
}

/*
 * Make the copy anew from itself, each key decoded again from the value
 * it holds into fresh memory, and the replaced records' memory freed (at a
 * quiet point only).  Throwing the copy away instead meant reading the
 * whole state again: under load at 3,000 shards the duty holder and the
 * reporters did so every 5-10 s each, 3.9 MB a read, most of what a loaded
 * cluster read besides the log ends.  What the copy holds is what it held:
 * how far it is current (since, ends_since, ends_own, revision) stays.
 */
static void
cache_compact(void)
{
	MemoryContext tmp = AllocSetContextCreate(TopMemoryContext, "felix control-plane compaction",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(tmp);
	FelixKV    *kvs = palloc(sizeof(FelixKV) * (hash_get_num_entries(cache.keys) + 1));
	int			n = 0;
	HASH_SEQ_STATUS seq;
	CachedKey  *e;
	char	   *tag = pstrdup(cache.store);
	char	   *ends_own = cache.ends_own ? pstrdup(cache.ends_own) : NULL;
	int64		since = cache.since;
	int64		ends_since = cache.ends_since;
	int64		revision = cache.revision;

	hash_seq_init(&seq, cache.keys);
	while ((e = hash_seq_search(&seq)) != NULL)
	{
		kvs[n].key = pstrdup(e->key);
		kvs[n].value = pstrdup(e->text);
		kvs[n++].mod_revision = e->mod_revision;
	}
	MemoryContextSwitchTo(old);
	cache_drop();
	cache_create(tag);
	/* an error half-way leaves a copy that is read whole next time */
	cache.need_full = true;
	for (int i = 0; i < n; i++)
		cache_put(&kvs[i], false);
	cache.need_full = false;
	cache.since = since;
	cache.ends_since = ends_since;
	cache.ends_own = ends_own ? MemoryContextStrdup(cache.cxt, ends_own) : NULL;
	cache.revision = revision;
	MemoryContextDelete(tmp);
}

/*
 * Free what replaced records took: compacted when they outweigh the live
 * ones (may_compact; else the copy is thrown away, and read whole next
 * time), or else the node records retired since the last quiet point.
 */
static void
cache_tidy(bool may_compact)
{
	ListCell   *lc;

	if (cache.garbage_bytes > Max(CACHE_GARBAGE_MIN, cache.live_bytes))
	{
		/* a copy due a whole read anyway may hold writes that never happened */
		if (may_compact && !cache.need_full && cache.keys != NULL)
			cache_compact();
		else
			cache_drop();
		return;
	}
	/* cache.retired is in TopMemoryContext */
	foreach(lc, cache.retired)
		MemoryContextDelete((MemoryContext) lfirst(lc));
	list_free(cache.retired);
	cache.retired = NIL;
}

void
cp_snapshot_quiesce(void)
{
	cache_tidy(true);
}

/* What the copy is of: the store, and for etcd the prefix. */
static const char *
store_tag(void)
{
	return felix_store_is_etcd() ? psprintf("etcd %s", felix_etcd_prefix) : "embedded";
}

/* The entry of e's key no longer holds what it did: its memory is garbage. */
static void
cache_retire(CachedKey *e)
{
	cache.live_bytes -= cost_of(e);
	cache.garbage_bytes += e->own ? 0 : cost_of(e);
	if (e->own)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		cache.retired = lappend(cache.retired, e->own);
		MemoryContextSwitchTo(old);
		e->own = NULL;
	}
}

/* Hold kv in the copy, decoded (found by a whole read when seen). */
static void
cache_put(const FelixKV *kv, bool seen)
{
	CachedKey  *e;
	bool		found;
	MemoryContext old;
	CachedKind	old_kind;

	if (strlen(kv->key) >= CP_INDEX_KEY_LEN)
		return;					/* no record's key is that long */
	e = hash_search(cache.keys, kv->key, HASH_ENTER, &found);
	if (!found)
		memset((char *) e + CP_INDEX_KEY_LEN, 0, sizeof(CachedKey) - CP_INDEX_KEY_LEN);
	if (seen)
		e->seen = cache.reads;
	if (found && e->mod_revision == kv->mod_revision && strcmp(e->text, kv->value) == 0)
		return;
	if (found)
		cache_retire(e);
	else
		cache_reorder();
	if (strncmp(kv->key, "nodes/", 6) == 0 || strncmp(kv->key, "ends/", 5) == 0 ||
		strncmp(kv->key, "claims/", 7) == 0)
		e->own = AllocSetContextCreate(cache.cxt, "felix control-plane node record",
									   ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(e->own ? e->own : cache.cxt);
	e->mod_revision = kv->mod_revision;
	e->text = pstrdup(kv->value);
	old_kind = e->kind;
	decode_kv(kv, e);
	cache.tmpl_ok[old_kind] = false;
	cache.tmpl_ok[e->kind] = false;
	if (found && e->kind != old_kind)
		cache_reorder();
	else if (e->kind == CK_SHARD && cache.shard_order != NULL)
	{
		/* a shard's leader or revision changed: its order is garbage */
		cache.garbage_bytes += (int64) cache.norder * 2 * sizeof(int);
		cache.shard_order = NULL;
	}
	e->index = e->kind == CK_ENDS ? cp_ends_index(e->rec.ends.ends, e->rec.ends.nends)
		: e->kind == CK_CLAIMS ? cp_claims_index(e->rec.claims.claims, e->rec.claims.nclaims)
		: NULL;
	MemoryContextSwitchTo(old);
	cache.live_bytes += cost_of(e);
}

static void
cache_forget(CachedKey *e)
{
	cache_retire(e);
	(void) hash_search(cache.keys, e->key, HASH_REMOVE, NULL);
	cache_reorder();
}

static int
cached_key_cmp(const void *a, const void *b)
{
	return strcmp((*(CachedKey *const *) a)->key, (*(CachedKey *const *) b)->key);
}

/*
 * How many keys of a page of the store differ from the copy in a way that
 * no read of what changed explains.  The page holds every key in
 * (after, last] (last NULL: to the end) as of revision rev, and the copy
 * has been brought up to date since, so it holds every change up to a
 * revision past rev:
 *   - a key of the page the copy lacks, unless a deletion was marked
 *     after rev (the copy would have read everything again);
 *   - a key the copy holds at another revision, if the copy's is not
 *     later than rev;
 *   - a key the copy holds at rev or earlier, in the page's range, that
 *     the page lacks.
 * Each is a key written or deleted without felix's marks.
 */
static int
cache_drift(const FelixKV *kvs, int n, const char *after, const char *last, int64 rev)
{
	CachedKey  *deletions = hash_search(cache.keys, FELIX_STORE_KEY_DELETIONS, HASH_FIND, NULL);
	int64		deleted_at = deletions ? deletions->mod_revision : 0;
	int			drift = 0;
	HASH_SEQ_STATUS seq;
	CachedKey  *e;
	HTAB	   *present;
	HASHCTL		ctl;

	ctl.keysize = CP_INDEX_KEY_LEN;
	ctl.entrysize = CP_INDEX_KEY_LEN;
	ctl.hcxt = CurrentMemoryContext;
	present = hash_create("felix control-plane guard", Max(n, 16), &ctl,
						  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	for (int i = 0; i < n; i++)
	{
		const FelixKV *kv = &kvs[i];

		if (strlen(kv->key) >= CP_INDEX_KEY_LEN)
			continue;			/* never held (cache_put) */
		(void) hash_search(present, kv->key, HASH_ENTER, NULL);
		e = hash_search(cache.keys, kv->key, HASH_FIND, NULL);
		if (e == NULL ? deleted_at <= rev
			: e->mod_revision != kv->mod_revision ? e->mod_revision <= rev
			: strcmp(e->text, kv->value) != 0)
			drift++;
	}
	hash_seq_init(&seq, cache.keys);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->mod_revision <= rev && strcmp(e->key, after) > 0 &&
			(last == NULL || strcmp(e->key, last) <= 0) &&
			hash_search(present, e->key, HASH_FIND, NULL) == NULL)
			drift++;
	hash_destroy(present);
	return drift;
}

/* Read the whole state into the copy; false (reported) if the read failed. */
static bool
cache_read_whole(bool guarded, int64 *revision, int elevel)
{
	FelixKV    *kvs;
	int			n;
	FelixStoreStatus st;
	HASH_SEQ_STATUS seq;
	CachedKey  *e;

	st = guarded ? felix_store_range_guarded("", true, &kvs, &n, revision, elevel)
		: felix_store_range("", true, &kvs, &n, revision, elevel);
	if (st != FELIX_STORE_OK)
		return false;
	felix_count(FELIX_CTR_STORE_WHOLE_READS, 1);
	cache.read_own_writes |= !felix_store_is_etcd() && felix_store_table_wrote();
	cache.reads++;
	cache.since = 0;
	for (int i = 0; i < n; i++)
	{
		cache_put(&kvs[i], true);
		/* one read of one state: every change up to its newest is in it */
		cache.since = Max(cache.since, kvs[i].mod_revision);
	}
	cache.ends_since = cache.since;
	hash_seq_init(&seq, cache.keys);
	while ((e = hash_seq_search(&seq)) != NULL)
		if (e->seen != cache.reads)
			cache_forget(e);
	cache.need_full = false;
	cache.revision = *revision;
	return true;
}

/*
 * Bring the copy up to the store's state; false (reported) if a read
 * failed.  With own_node, the other nodes' ends/ keys may stay as an
 * earlier read left them (cp_snapshot_read_for_heartbeat): a node's log
 * ends are rewritten every few heartbeats while it is written to, they
 * were most of what a loaded cluster's heartbeats read, and a heartbeat
 * needs another node's only when it takes a generation.
 */
static bool
cache_refresh(bool guarded, int64 *revision, int elevel, const char *own_node)
{
	FelixKV    *kvs;
	int			n;
	FelixStoreStatus st;
	const char *tag = store_tag();
	bool		full;
	int64		complete_to;
	FelixStoreApart ends;

	if (cache.keys == NULL || cache.store == NULL || strcmp(cache.store, tag) != 0)
	{
		cache_drop();
		cache_create(tag);
		cache.need_full = true;
	}
	/*
	 * The embedded store's rules compare under its lock, which no other
	 * writer holds meanwhile: a compare that failed since the last read
	 * compared this copy with a store that holds something else (keys
	 * rewritten by hand, the store put back).
	 */
	if (!felix_store_is_etcd() && felix_store_conflicts() != cache.conflicts)
		cache.need_full = true;
	cache.conflicts = felix_store_conflicts();
	if (cache.need_full)
		return cache_read_whole(guarded, revision, elevel);

	/*
	 * Every ends/ key is held as of ends_since, and ends_own's as of
	 * since.  A read for own_node reads that node's key alone, which it
	 * may do once it is held up to since: it is ends_own's, or all are.
	 */
	if (own_node != NULL && cache.ends_since < cache.since &&
		(cache.ends_own == NULL || strcmp(cache.ends_own, own_node) != 0))
		own_node = NULL;
	ends.section = "ends/";
	ends.changed_after = own_node ? cache.since : cache.ends_since;
	ends.only_key = own_node ? cp_key_ends(own_node) : NULL;
	st = felix_store_range_changed("", cache.since, guarded, &ends, &kvs, &n, revision,
								   &complete_to, elevel);
	if (st != FELIX_STORE_OK)
		return false;
	/* a store behind this copy was put back from an older one */
	full = !guarded && *revision < cache.revision;
	for (int i = 0; i < n && !full; i++)
		full = strcmp(kvs[i].key, FELIX_STORE_KEY_DELETIONS) == 0;
	if (full)
		return cache_read_whole(guarded, revision, elevel);
	cache.read_own_writes |= !felix_store_is_etcd() && felix_store_table_wrote();
	for (int i = 0; i < n; i++)
		cache_put(&kvs[i], false);
	cache.since = Max(cache.since, complete_to);
	if (own_node == NULL)
		cache.ends_since = cache.since;
	else if (cache.ends_own == NULL || strcmp(cache.ends_own, own_node) != 0)
		cache.ends_own = MemoryContextStrdup(cache.cxt, own_node);
	cache.revision = Max(cache.revision, *revision);
	*revision = cache.revision;
	return true;
}

/*
 * Split entries (in key order) by kind, each list in key order (in
 * CurrentMemoryContext).
 */
static void
split_by_kind(CachedKey *const *entries, int n, CachedKey ***lists, int *count)
{
	int			filled[CK_MARK + 1] = {0};

	memset(count, 0, sizeof(int) * (CK_MARK + 1));
	for (int i = 0; i < n; i++)
		count[entries[i]->kind]++;
	for (int k = 0; k <= CK_MARK; k++)
		lists[k] = palloc(sizeof(CachedKey *) * (count[k] + 1));
	for (int i = 0; i < n; i++)
		lists[entries[i]->kind][filled[entries[i]->kind]++] = entries[i];
}

/* Make the copy's template of each bulk kind whose records changed. */
static void
tmpl_refresh(void)
{
	MemoryContext old = MemoryContextSwitchTo(cache.cxt);
	CpSnapshot *t = &cache.tmpl;
	const int  *count = cache.nby_kind;

	if (!cache.tmpl_ok[CK_STREAM])
	{
		if (t->streams)
			pfree(t->streams);
		t->streams = palloc0(sizeof(CpStream) * (count[CK_STREAM] + 1));
		t->nstreams = 0;
	}
	if (!cache.tmpl_ok[CK_SHARD])
	{
		if (t->shards)
			pfree(t->shards);
		t->shards = palloc0(sizeof(CpShard) * (count[CK_SHARD] + 1));
		t->nshards = 0;
	}
	if (!cache.tmpl_ok[CK_REPORTS])
	{
		if (t->reports)
		{
			pfree(t->reports);
			pfree(t->report_stream);
			pfree(t->report_shard);
		}
		t->reports = palloc0(sizeof(CpReports *) * (count[CK_REPORTS] + 1));
		t->report_stream = palloc0(sizeof(char *) * (count[CK_REPORTS] + 1));
		t->report_shard = palloc0(sizeof(int) * (count[CK_REPORTS] + 1));
		t->nreports = 0;
	}
	for (int k = 0; k <= CK_MARK; k++)
	{
		if (!bulk_kind(k) || cache.tmpl_ok[k])
			continue;
		for (int i = 0; i < count[k]; i++)
			snap_add(t, cache.by_kind[k][i]);
		cache.tmpl_ok[k] = true;
	}
	MemoryContextSwitchTo(old);
}

/* n elements of size each from src, and a zeroed one after them. */
static void *
copy_array(const void *src, Size size, int n)
{
	char	   *dst = palloc(size * (n + 1));

	memcpy(dst, src, size * n);
	memset(dst + size * n, 0, size);
	return dst;
}

/*
 * The entry of list (n entries in key order, each key a prefix skip long
 * and a node's name) for node name, or NULL; *at moves on, so nodes taken
 * in name order are each found in one walk of the list.
 */
static const CachedKey *
entry_of_node(CachedKey *const *list, int n, int skip, int *at, const char *name)
{
	while (*at < n && strcmp(list[*at]->key + skip, name) < 0)
		(*at)++;
	return *at < n && strcmp(list[*at]->key + skip, name) == 0 ? list[*at] : NULL;
}

/*
 * The snapshot of the records in lists (each kind's in key order): each
 * node joined to its ends and claims; the bulk kinds copied from the
 * template when cached, else added one by one.  Ends count only for the
 * boot that gave them.  A node whose keys do not exist keeps what its own
 * record held (felix 1.1 before they had keys of their own).
 */
static void
snap_build(CpSnapshot *snap, CachedKey **const *lists, const int *count, bool cached)
{
	int			j_ends = 0;
	int			j_claims = 0;

	snap_alloc(snap, count, !cached);
	if (cached)
	{
		const CpSnapshot *t = &cache.tmpl;

		snap->streams = copy_array(t->streams, sizeof(CpStream), t->nstreams);
		snap->nstreams = t->nstreams;
		snap->shards = copy_array(t->shards, sizeof(CpShard), t->nshards);
		snap->nshards = t->nshards;
		snap->reports = copy_array(t->reports, sizeof(CpReports *), t->nreports);
		snap->report_stream = copy_array(t->report_stream, sizeof(char *), t->nreports);
		snap->report_shard = copy_array(t->report_shard, sizeof(int), t->nreports);
		snap->nreports = t->nreports;
	}
	for (int k = 0; k <= CK_MARK; k++)
	{
		if (cached && bulk_kind(k))
			continue;
		for (int i = 0; i < count[k]; i++)
			snap_add(snap, lists[k][i]);
	}

	/* nodes, ends and claims are each in name order: joined as they go */
	for (int i = 0; i < snap->nnodes; i++)
	{
		CpNode	   *node = &snap->nodes[i];
		const CachedKey *e;

		node->unable_index = NULL;
		node->ends_index = NULL;
		node->claims_index = NULL;
		if ((e = entry_of_node(lists[CK_ENDS], count[CK_ENDS], strlen("ends/"),
							   &j_ends, node->name)) != NULL)
		{
			node->ends_rev = e->rec.ends.rev;
			node->nends = 0;
			node->ends = NULL;
			if (strcmp(e->rec.ends.boot, node->boot) == 0)
			{
				node->nends = e->rec.ends.nends;
				node->ends = e->rec.ends.ends;
				node->ends_index = e->index;
			}
		}
		if ((e = entry_of_node(lists[CK_CLAIMS], count[CK_CLAIMS], strlen("claims/"),
							   &j_claims, node->name)) != NULL)
		{
			node->claims_rev = e->rec.claims.rev;
			node->nclaims = e->rec.claims.nclaims;
			node->claims = e->rec.claims.claims;
			node->claims_index = e->index;
		}
	}
}

/* Decode kvs without a copy to keep: the snapshot of exactly them. */
static void
snap_build_uncached(CpSnapshot *snap, const FelixKV *kvs, int n)
{
	CachedKey **entries = palloc(sizeof(CachedKey *) * (n + 1));
	CachedKey **lists[CK_MARK + 1];
	int			count[CK_MARK + 1];
	int			m = 0;

	for (int i = 0; i < n; i++)
	{
		CachedKey  *e;

		if (strlen(kvs[i].key) >= CP_INDEX_KEY_LEN)
			continue;			/* no record's key is that long */
		e = palloc0(sizeof(CachedKey));
		strlcpy(e->key, kvs[i].key, CP_INDEX_KEY_LEN);
		decode_kv(&kvs[i], e);
		if (e->kind == CK_NONE)
		{
			pfree(e);
			continue;
		}
		entries[m++] = e;
	}
	split_by_kind(entries, m, lists, count);
	snap_build(snap, lists, count, false);
	snap->index = index_snapshot(snap);
}

/*
 * Serialize with the store's other writers (felix_store_serialize), this
 * process's copy of the state brought up to date first.  A cold copy (a
 * new session, or a whole read due) decodes every record, which takes
 * most of a second at thousands of shards: done under the embedded
 * store's lock, it held up every other caller, and after the host
 * restarted each heartbeat timed out behind the others, its session
 * closed, and the next one was cold again.  Read here, outside the lock,
 * the read under it brings only what changed meanwhile.  A copy that is
 * warm is left to that read.  (On etcd there is no lock.)
 */
void
cp_serialize(void)
{
	if (!felix_store_is_etcd())
	{
		int64		revision;

		if (!cache.enabled && !IsBackgroundWorker)
			cp_snapshot_cache_enable();
		if (cache.enabled && (cache.keys == NULL || cache.need_full))
			(void) cache_refresh(false, &revision, DEBUG1, NULL);
	}
	felix_store_serialize();
}

int
cp_snapshot_guard(int elevel)
{
	int64		now = felix_monotonic_ns();
	int64		page_rev;
	int64		revision;
	FelixKV    *kvs;
	int			n;
	bool		more;
	int			drift;
	char	   *after;

	/* a copy that is cold or due a whole read anyway has nothing to compare */
	if (!cache.enabled || cache.keys == NULL || cache.need_full || cache.reads == 0)
	{
		if (cache.guard_after)
			pfree(cache.guard_after);
		cache.guard_after = NULL;
		cache.guard_at_ns = now;
		return 0;
	}
	if (cache.guard_after == NULL)
	{
		if (now - cache.guard_at_ns < (int64) felix_store_guard_interval * NS_PER_MS)
			return 0;
		cache.guard_at_ns = now;
		cache.guard_after = MemoryContextStrdup(TopMemoryContext, "");
	}
	after = cache.guard_after;
	if (felix_store_range_page(after, CACHE_GUARD_PAGE, &kvs, &n, &more, &page_rev,
							   elevel) != FELIX_STORE_OK ||
		!cache_refresh(false, &revision, elevel, NULL))
	{
		/* the pass starts over later */
		pfree(after);
		cache.guard_after = NULL;
		cache.guard_at_ns = now - (int64) felix_store_guard_interval * NS_PER_MS +
			CACHE_GUARD_RETRY_NS;
		return 0;
	}
	drift = cache_drift(kvs, n, after, more && n > 0 ? kvs[n - 1].key : NULL, page_rev);
	cache.guard_after = more && n > 0 ? MemoryContextStrdup(TopMemoryContext, kvs[n - 1].key) : NULL;
	pfree(after);
	return drift;
}

void
cp_snapshot_forget(void)
{
	cache.need_full = true;
}

/* A snapshot (cp_snapshot_read), all of it current but for own_node's peers' ends. */
static bool
snapshot_read(CpSnapshot *snap, bool guarded, int elevel, const char *own_node)
{
	memset(snap, 0, sizeof(*snap));
	if (!cache.enabled && !IsBackgroundWorker)
		cp_snapshot_cache_enable();
	if (!cache.enabled)
	{
		/* a worker that never says when no snapshot is in use: no copy */
		FelixKV    *kvs;
		int			n;

		if ((guarded ? felix_store_range_guarded("", true, &kvs, &n, &snap->revision, elevel)
			 : felix_store_range("", true, &kvs, &n, &snap->revision, elevel)) != FELIX_STORE_OK)
			return false;
		felix_count(FELIX_CTR_STORE_WHOLE_READS, 1);
		snap_build_uncached(snap, kvs, n);
		return true;
	}
	if (!cache_refresh(guarded, &snap->revision, elevel, own_node))
		return false;
	if (cache.order == NULL)
	{
		HASH_SEQ_STATUS seq;
		CachedKey  *e;
		MemoryContext old;

		cache.norder = 0;
		cache.order = MemoryContextAlloc(cache.cxt, sizeof(CachedKey *) *
										 (hash_get_num_entries(cache.keys) + 1));
		hash_seq_init(&seq, cache.keys);
		while ((e = hash_seq_search(&seq)) != NULL)
			cache.order[cache.norder++] = e;
		qsort(cache.order, cache.norder, sizeof(CachedKey *), cached_key_cmp);
		old = MemoryContextSwitchTo(cache.cxt);
		split_by_kind(cache.order, cache.norder, cache.by_kind, cache.nby_kind);
		MemoryContextSwitchTo(old);
	}
	tmpl_refresh();
	snap_build(snap, cache.by_kind, cache.nby_kind, true);
	if (cache.index == NULL || cache.shard_order == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(cache.cxt);

		if (cache.index == NULL)
			cache.index = index_snapshot(snap);
		snap->index = cache.index;
		if (cache.shard_order == NULL)
			cache.shard_order = shard_order_build(snap);
		MemoryContextSwitchTo(old);
	}
	snap->index = cache.index;
	snap->shard_order = cache.shard_order;
	return true;
}

bool
cp_snapshot_read(CpSnapshot *snap, bool guarded, int elevel)
{
	return snapshot_read(snap, guarded, elevel, NULL);
}

bool
cp_snapshot_read_for_heartbeat(CpSnapshot *snap, const char *node, int elevel)
{
	return snapshot_read(snap, false, elevel, node);
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
	snap_build_uncached(snap, all, nall);
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

/*
 * Where the first record of each name is in snap's arrays, as a scan in
 * key order would find it (in CurrentMemoryContext).  Records taken from
 * this process's copy of the state come in the same places as long as no
 * key comes or goes, and that copy keeps the index until then.
 */
static HTAB *
index_snapshot(const CpSnapshot *snap)
{
	HTAB	   *index = index_create("felix snapshot index",
									 snap->nnodes + snap->nstreams + snap->nshards + snap->nreports);
	CpIndexEntry *e;

	for (int i = 0; i < snap->nnodes; i++)
		if ((e = index_probe(index, true, 'n', snap->nodes[i].name, -1, -1))->pos < 0)
			e->pos = i;
	for (int i = 0; i < snap->nstreams; i++)
		if ((e = index_probe(index, true, 's', snap->streams[i].name, -1, -1))->pos < 0)
			e->pos = i;
	for (int i = 0; i < snap->nshards; i++)
		if ((e = index_probe(index, true, 'h', snap->shards[i].stream, -1,
							 snap->shards[i].shard))->pos < 0)
			e->pos = i;
	for (int i = 0; i < snap->nreports; i++)
		if ((e = index_probe(index, true, 'r', snap->report_stream[i], -1,
							 snap->report_shard[i]))->pos < 0)
			e->pos = i;
	return index;
}

/*
 * A snapshot's shards by leader and by revision.  The places in
 * snap->shards stay as long as no key comes or goes, and leaders and
 * revisions as long as no shard record changes: this process's copy keeps
 * an order until then (cache_put), a snapshot read without a copy builds
 * its own at the first lookup.
 */
typedef struct CpShardOrder
{
	int		   *by_rev;			/* every place, newest revision first */
	int		   *by_leader;		/* every led place, a leader's together, each
								 * in place order */
	HTAB	   *leaders;		/* leader name -> its run in by_leader */
	int		   *stream_at;		/* by place: its stream's place (-1: none) */
} CpShardOrder;

typedef struct LeaderRun
{
	char		name[NAMEDATALEN];
	int			first;
	int			n;
} LeaderRun;

static int
rev_desc_cmp(const void *a, const void *b, void *arg)
{
	const CpShard *shards = arg;
	int64		ra = shards[*(const int *) a].rev;
	int64		rb = shards[*(const int *) b].rev;

	return ra > rb ? -1 : ra < rb ? 1 : *(const int *) a - *(const int *) b;
}

static struct CpShardOrder *
shard_order_build(const CpSnapshot *snap)
{
	CpShardOrder *o = palloc(sizeof(CpShardOrder));
	HASHCTL		ctl;
	LeaderRun  *run;
	HASH_SEQ_STATUS seq;
	int			next = 0;
	bool		found;

	o->by_rev = palloc(sizeof(int) * (snap->nshards + 1));
	o->stream_at = palloc(sizeof(int) * (snap->nshards + 1));
	for (int i = 0; i < snap->nshards; i++)
	{
		const CpStream *st;

		o->by_rev[i] = i;
		/* a stream's shards come together, in key order */
		if (i > 0 && o->stream_at[i - 1] >= 0 &&
			strcmp(snap->shards[i].stream, snap->shards[i - 1].stream) == 0)
			o->stream_at[i] = o->stream_at[i - 1];
		else
			o->stream_at[i] = (st = cp_snapshot_stream(snap, snap->shards[i].stream)) ?
				(int) (st - snap->streams) : -1;
	}
	qsort_arg(o->by_rev, snap->nshards, sizeof(int), rev_desc_cmp, snap->shards);

	ctl.keysize = NAMEDATALEN;
	ctl.entrysize = sizeof(LeaderRun);
	ctl.hcxt = CurrentMemoryContext;
	o->leaders = hash_create("felix shards by leader", Max(snap->nnodes, 16), &ctl,
							 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	/* count each leader's shards, give each its run, then fill the runs */
	for (int i = 0; i < snap->nshards; i++)
	{
		if (snap->shards[i].leader == NULL ||
			strlen(snap->shards[i].leader) >= NAMEDATALEN)
			continue;
		run = hash_search(o->leaders, snap->shards[i].leader, HASH_ENTER, &found);
		if (!found)
			run->n = 0;
		run->n++;
	}
	hash_seq_init(&seq, o->leaders);
	while ((run = hash_seq_search(&seq)) != NULL)
	{
		run->first = next;
		next += run->n;
		run->n = 0;
	}
	o->by_leader = palloc(sizeof(int) * (next + 1));
	for (int i = 0; i < snap->nshards; i++)
	{
		if (snap->shards[i].leader == NULL ||
			strlen(snap->shards[i].leader) >= NAMEDATALEN)
			continue;
		run = hash_search(o->leaders, snap->shards[i].leader, HASH_FIND, NULL);
		o->by_leader[run->first + run->n++] = i;
	}
	return o;
}

static const CpShardOrder *
shard_order(const CpSnapshot *snap)
{
	if (snap->shard_order == NULL)
		((CpSnapshot *) snap)->shard_order = shard_order_build(snap);
	return snap->shard_order;
}

const int *
cp_snapshot_led_by(const CpSnapshot *snap, const char *node, int *n)
{
	const CpShardOrder *o = shard_order(snap);
	LeaderRun  *run = NULL;

	if (node != NULL && strlen(node) < NAMEDATALEN)
		run = hash_search(o->leaders, node, HASH_FIND, NULL);
	*n = run ? run->n : 0;
	return run ? o->by_leader + run->first : o->by_leader;
}

CpStream *
cp_snapshot_stream_at(const CpSnapshot *snap, int place)
{
	int			j = shard_order(snap)->stream_at[place];

	return j >= 0 ? &snap->streams[j] : NULL;
}

const int *
cp_snapshot_shards_since(const CpSnapshot *snap, int64 since, int *n)
{
	const CpShardOrder *o = shard_order(snap);
	int			lo = 0;
	int			hi = snap->nshards;

	/* by_rev is newest first: the first place at or below since */
	while (lo < hi)
	{
		int			mid = (lo + hi) / 2;

		if (snap->shards[o->by_rev[mid]].rev > since)
			lo = mid + 1;
		else
			hi = mid;
	}
	*n = lo;
	return o->by_rev;
}

CpNode *
cp_snapshot_node(const CpSnapshot *snap, const char *name)
{
	CpIndexEntry *e;

	if (name == NULL)
		return NULL;
	e = index_probe(snap->index, false, 'n', name, -1, -1);
	return e ? &snap->nodes[e->pos] : NULL;
}

CpStream *
cp_snapshot_stream(const CpSnapshot *snap, const char *name)
{
	CpIndexEntry *e = index_probe(snap->index, false, 's', name, -1, -1);

	return e ? &snap->streams[e->pos] : NULL;
}

CpShard *
cp_snapshot_shard(const CpSnapshot *snap, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(snap->index, false, 'h', stream, -1, shard);

	return e ? &snap->shards[e->pos] : NULL;
}

const CpReports *
cp_snapshot_reports(const CpSnapshot *snap, const char *stream, int shard)
{
	CpIndexEntry *e = index_probe(snap->index, false, 'r', stream, -1, shard);

	return e ? snap->reports[e->pos] : NULL;
}

int64
cp_snapshot_leads_rev(const CpSnapshot *snap, const char *node)
{
	for (int i = 0; i < snap->nleads; i++)
		if (strcmp(snap->leads_node[i], node) == 0)
			return snap->leads_rev[i];
	return 0;
}
