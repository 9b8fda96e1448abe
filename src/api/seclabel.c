/*-------------------------------------------------------------------------
 *
 * seclabel.c
 *	  A stream's settings, carried by its table through pg_dump.
 *
 *	  felix is a security label provider.  Every stream's table carries the
 *	  label FOR felix that states the stream's settings, as a JSON object:
 *	    {"shards": 3, "replication_factor": 3, "consistency": "quorum",
 *	     "storage": "local", "retention_bytes": 1000000, "retention": "P30D"}
 *	  (retention_bytes and retention only when set; retention as ISO 8601,
 *	  which reads back the same under every IntervalStyle; the payload type
 *	  is the payload column's).  The table gets it when it is created
 *	  (felix_stream_create_local).  pg_dump writes it out right after the
 *	  table and before its records, so a restore -- psql or pg_restore, on
 *	  a server with felix preloaded -- sets it on a table USING felix that
 *	  is not a stream yet, and the check here turns that table into the
 *	  stream the label describes (felix_stream_adopt).  On a stream's table
 *	  the label can only be set to what it is.
 *
 * Locking rule: none of its own; the caller's transaction holds what
 * ExecSecLabelStmt locked (the table) and what felix_stream_adopt takes.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/objectaddress.h"
#include "catalog/pg_class.h"
#include "commands/seclabel.h"
#include "utils/builtins.h"
#include "miscadmin.h"
#include "utils/datetime.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"

#include "core/catalog.h"
#include "api/seclabel.h"
#include "api/stream.h"
#include "control/json.h"

#define FELIX_LABEL_PROVIDER	"felix"

char *
felix_stream_label(const FelixStreamSettings *s)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	felix_json_put_int64(&buf, "shards", s->shards);
	felix_json_put_int64(&buf, "replication_factor", s->replication_factor);
	felix_json_put_string(&buf, "consistency", s->consistency);
	felix_json_put_string(&buf, "storage", s->storage);
	if (s->retention_bytes > 0)
		felix_json_put_int64(&buf, "retention_bytes", s->retention_bytes);
	if (s->retention != NULL)
	{
		struct pg_itm itm;
		char		iso[MAXDATELEN + 1];

		interval2itm(*s->retention, &itm);
		EncodeInterval(&itm, INTSTYLE_ISO_8601, iso);
		felix_json_put_string(&buf, "retention", iso);
	}
	appendStringInfoChar(&buf, '}');
	return buf.data;
}

void
felix_stream_set_label(Oid relid, const FelixStreamSettings *s)
{
	ObjectAddress addr;

	ObjectAddressSet(addr, RelationRelationId, relid);
	SetSecurityLabel(&addr, FELIX_LABEL_PROVIDER, felix_stream_label(s));
}

/* Read a label back into settings; ERROR naming the table if it is not one. */
static void
parse_label(const char *table, const char *label, FelixStreamSettings *s)
{
	char		err[256];
	JsonbContainer *obj;
	int64		v;
	char	   *str;

#define BAD_LABEL(what) \
	ereport(ERROR, \
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE), \
			 errmsg("security label for felix on table \"%s\" is not a stream's settings: %s", \
					table, what), \
			 errhint("felix writes this label itself (pg_dump carries it); leave it as felix wrote it.")))

	memset(s, 0, sizeof(*s));
	obj = felix_json_parse(label, strlen(label), err, sizeof(err));
	if (obj == NULL)
		BAD_LABEL(err);
	if (!felix_json_int64(obj, "shards", &v) || v <= 0 || v > PG_INT32_MAX)
		BAD_LABEL("\"shards\" must be a positive integer");
	s->shards = (int) v;
	if (!felix_json_int64(obj, "replication_factor", &v) || v <= 0 || v > PG_INT32_MAX)
		BAD_LABEL("\"replication_factor\" must be a positive integer");
	s->replication_factor = (int) v;
	if (!felix_json_string(obj, "consistency", &str))
		BAD_LABEL("\"consistency\" is missing");
	s->consistency = str;
	if (!felix_json_string(obj, "storage", &str))
		BAD_LABEL("\"storage\" is missing");
	s->storage = str;
	if (felix_json_int64(obj, "retention_bytes", &v))
		s->retention_bytes = v;
	if (felix_json_string(obj, "retention", &str))
	{
		Datum		d;

		d = DirectFunctionCall3(interval_in, CStringGetDatum(str),
								ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
		s->retention = DatumGetIntervalP(d);
	}
#undef BAD_LABEL
}

/*
 * The provider's check, run by SECURITY LABEL FOR felix after PostgreSQL
 * checked that the caller owns the object.
 */
static void
felix_check_label(const ObjectAddress *object, const char *label)
{
	char	   *table;
	const FelixStream *stream;
	FelixStreamSettings want;

	if (object->classId != RelationRelationId || object->objectSubId != 0 ||
		get_rel_relkind(object->objectId) != RELKIND_RELATION ||
		!felix_uses_felix_am_relid(object->objectId))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("felix labels only the tables of streams"),
				 errhint("The label FOR felix is how a stream's settings travel with its table through pg_dump.")));
	table = get_rel_name(object->objectId);
	stream = felix_stream_by_relid(object->objectId);
	if (label == NULL)
	{
		if (stream != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot remove the felix label of stream \"%s\"", stream->name),
					 errhint("The label carries the stream's settings through pg_dump; drop the stream with felix_drop_stream instead.")));
		return;
	}
	parse_label(table, label, &want);
	if (stream == NULL)
	{
		/* a restore: the table becomes the stream the label describes */
		felix_stream_adopt(object->objectId, &want);
		return;
	}
	if (!felix_stream_settings_match(stream, &want))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("stream \"%s\" has other settings than this label states", stream->name),
				 errdetail("It has %d shards, replication_factor %d, consistency %s.",
						   stream->shards, stream->replication_factor,
						   stream->consistency == FELIX_CONSISTENCY_QUORUM ? "quorum" : "leader"),
				 errhint("A stream's settings are fixed when it is created; a restore needs a database where the stream does not exist yet.")));
}

void
felix_seclabel_init(void)
{
	register_label_provider(FELIX_LABEL_PROVIDER, felix_check_label);
}
