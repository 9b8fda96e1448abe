/*-------------------------------------------------------------------------
 *
 * stream.c
 *	  Creating and dropping streams, and the operations on a whole stream
 *	  (retention now, truncation).  A stream is a table USING felix plus a
 *	  row in felix.streams; its shards' files appear on first use and are
 *	  removed when a drop of its table commits, whichever way the table was
 *	  dropped (felix_drop_stream, DROP TABLE, DROP SCHEMA ... CASCADE) by
 *	  its owner: an object-access hook checks the dropper owns the table
 *	  and notes the drop, the pre-commit callback tells the
 *	  control plane, the commit callback removes the files, an abort
 *	  forgets the note.  A creation registers the stream at the control
 *	  plane at once; an abort of its transaction (or subtransaction) undoes
 *	  that registration.
 *
 * Locking rule: backend-local bookkeeping; catalog changes run through
 * SPI in the caller's transaction; file removal happens after commit,
 * when no other backend can hold the dropped table.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/fd.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "api/agent.h"
#include "core/catalog.h"
#include "core/payload.h"
#include "api/publish.h"
#include "api/seclabel.h"
#include "api/stream.h"
#include "control/client.h"
#include "control/cp.h"
#include "control/cpcall.h"
#include "felix.h"
#include "base/privilege.h"
#include "storage/shard.h"

/* ---------------------------------------------------------------------
 * What this transaction did to streams, for its commit or abort
 * ---------------------------------------------------------------------
 */
typedef struct StreamNote
{
	Oid			relid;			/* dropped: its table */
	char		name[NAMEDATALEN];	/* the stream's name: its table's */
	char		creation_id[FELIX_CREATION_ID_LEN]; /* its control-plane identity */
	SubTransactionId subid;
	bool		superseded;		/* dropped: the control plane has a newer one */
} StreamNote;

/* StreamNote *, in TopTransactionContext */
static List *dropped = NIL;		/* tables of streams dropped */
static List *registered = NIL;	/* streams registered at the control plane */

static StreamNote *
note_stream(List **list, Oid relid, const char *name, const char *creation_id)
{
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
	StreamNote *n = palloc(sizeof(StreamNote));

	n->relid = relid;
	strlcpy(n->name, name, NAMEDATALEN);
	strlcpy(n->creation_id, creation_id, FELIX_CREATION_ID_LEN);
	n->subid = GetCurrentSubTransactionId();
	n->superseded = false;
	*list = lappend(*list, n);
	MemoryContextSwitchTo(old);
	return n;
}

/* ---------------------------------------------------------------------
 * Argument checks for felix_create_stream
 * ---------------------------------------------------------------------
 */
static void
required_arg(FunctionCallInfo fcinfo, int argno, const char *name, const char *option)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("stream \"%s\": %s must not be NULL", name, option),
				 errhint("Leave the argument out to use its default.")));
}

/* The type of a payload_type the control plane's checks accepted. */
static Oid
payload_type_oid(const char *value)
{
	if (strcmp(value, "text") == 0)
		return TEXTOID;
	if (strcmp(value, "bytea") == 0)
		return BYTEAOID;
	return JSONBOID;
}

/*
 * The schema a stream named `name` is created in: the caller's creation
 * namespace, which must not be a temporary one (a stream's name is
 * cluster-wide and outlives the session) and in which the caller needs
 * CREATE, checked before the control plane is asked anything.
 */
static char *
stream_creation_schema(const char *name)
{
	Oid			nsp = RangeVarGetCreationNamespace(makeRangeVar(NULL, pstrdup(name), -1));

	if (isAnyTempNamespace(nsp))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot create stream \"%s\" in a temporary schema", name),
				 errdetail("A stream is known to every node of the cluster by its name and outlives the session."),
				 errhint("Put a permanent schema first in search_path, or create the stream from a session whose search_path does not start with pg_temp.")));
	if (pg_namespace_aclcheck(nsp, GetUserId(), ACL_CREATE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to create stream \"%s\" in schema \"%s\"",
						name, get_namespace_name(nsp)),
				 errhint("Creating a stream needs CREATE privilege on the schema it is created in.")));
	return get_namespace_name(nsp);
}

/*
 * A role that is not a superuser may own at most felix.max_streams_per_role
 * streams holding at most felix.max_shards_per_role shards: every shard
 * takes one of the node's felix.max_shards slots for good.
 */
static void
stream_check_quota(const char *name, int shards)
{
	int64		streams_owned;
	int64		shards_owned;

	if (superuser())
		return;
	felix_catalog_owned(GetUserId(), &streams_owned, &shards_owned);
	if (streams_owned + 1 > felix_max_streams_per_role)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("cannot create stream \"%s\": role \"%s\" already owns " INT64_FORMAT " streams",
						name, GetUserNameFromId(GetUserId(), false), streams_owned),
				 errdetail("felix.max_streams_per_role is %d.", felix_max_streams_per_role),
				 errhint("Drop streams you no longer need, or ask a superuser to raise felix.max_streams_per_role.")));
	if (shards_owned + shards > felix_max_shards_per_role)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("cannot create stream \"%s\" with %d shards: role \"%s\" already owns " INT64_FORMAT " shards",
						name, shards, GetUserNameFromId(GetUserId(), false), shards_owned),
				 errdetail("felix.max_shards_per_role is %d.", felix_max_shards_per_role),
				 errhint("Use fewer shards, drop streams you no longer need, or ask a superuser to raise felix.max_shards_per_role.")));
}

/*
 * Streams live in felix.database on every node: stream names are
 * cluster-wide and the node agent serves one database.
 */
static void
require_felix_database(const char *name)
{
	if (strcmp(get_database_name(MyDatabaseId), felix_database) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot create stream \"%s\" in database \"%s\"",
						name, get_database_name(MyDatabaseId)),
				 errdetail("felix streams live in the database named by felix.database, \"%s\".",
						   felix_database),
				 errhint("Connect to database \"%s\" to create the stream.", felix_database)));
}

/* The control plane's own checks, here before anything is asked of it. */
static void
validate_settings(const char *name, const char *payload_type, const FelixStreamSettings *st,
				  bool has_retention_bytes)
{
	CpCreateArgs a;

	memset(&a, 0, sizeof(a));
	a.name = name;
	a.schema = "-";
	a.shards = st->shards;
	a.replication_factor = st->replication_factor;
	a.consistency = st->consistency;
	a.payload_type = payload_type;
	a.storage = st->storage;
	a.has_retention_bytes = has_retention_bytes;
	a.retention_bytes = st->retention_bytes;
	a.has_retention = st->retention != NULL;
	if (a.has_retention)
	{
		a.retention_months = st->retention->month;
		a.retention_days = st->retention->day;
		a.retention_usec = st->retention->time;
	}
	cp_validate_create(&a);
}

/*
 * Register a stream at the control plane, which places it (and refuses it,
 * e.g. when fewer nodes are alive than replication_factor asks for),
 * before this node makes it a stream; the other nodes create theirs at
 * their next heartbeat.  The caller holds the name (felix_stream_lock_name)
 * and has checked it is free.  From here an abort undoes the registration
 * (unregister_streams).
 */
static char *
register_stream(FelixCpSession *s, const char *name, const char *schema,
				const char *payload_type, const FelixStreamSettings *st, bool lead_here)
{
	char	   *creation_id;

	creation_id = felix_cp_create_stream(s, name, schema, st->shards, st->replication_factor,
										 st->consistency, payload_type, st->storage,
										 st->retention_bytes > 0 ? st->retention_bytes : -1,
										 st->retention == NULL ? NULL :
										 DatumGetCString(DirectFunctionCall1(interval_out,
																			 PointerGetDatum(st->retention))),
										 lead_here);
	(void) note_stream(&registered, InvalidOid, name, creation_id);
	return creation_id;
}

static Oid	create_stream(const char *name, const char *schema, const char *payload_type,
						  const FelixStreamSettings *st, Oid relid);

PG_FUNCTION_INFO_V1(felix_create_stream);
Datum
felix_create_stream(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *payload_type;
	char	   *schema;
	FelixStreamSettings st;

	felix_require_preload();
	if (PG_ARGISNULL(0) || VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(0)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL or empty"),
				 errhint("Pass the stream's name as the first argument.")));
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	require_felix_database(name);
	if (strlen(name) >= NAMEDATALEN)
		ereport(ERROR,
				(errcode(ERRCODE_NAME_TOO_LONG),
				 errmsg("stream name \"%s\" is too long", name),
				 errhint("A stream name has at most %d bytes.", NAMEDATALEN - 1)));

	for (int i = 1; i <= 5; i++)
		required_arg(fcinfo, i, name,
					 (const char *[]) {"", "shards", "replication_factor",
					  "consistency", "payload_type", "storage"}[i]);
	memset(&st, 0, sizeof(st));
	st.shards = PG_GETARG_INT32(1);
	st.replication_factor = PG_GETARG_INT32(2);
	st.consistency = text_to_cstring(PG_GETARG_TEXT_PP(3));
	payload_type = text_to_cstring(PG_GETARG_TEXT_PP(4));
	st.storage = text_to_cstring(PG_GETARG_TEXT_PP(5));
	st.retention_bytes = PG_ARGISNULL(6) ? 0 : PG_GETARG_INT64(6);
	st.retention = PG_ARGISNULL(7) ? NULL : PG_GETARG_INTERVAL_P(7);
	validate_settings(name, payload_type, &st, !PG_ARGISNULL(6));

	/* Privileges and quota, before anything is asked of the control plane. */
	schema = stream_creation_schema(name);
	stream_check_quota(name, st.shards);

	/* A name taken here locally is refused before asking. */
	felix_stream_lock_name(name, true);
	felix_stream_check_name_free(name, schema);
	PG_RETURN_OID(create_stream(name, schema, payload_type, &st, InvalidOid));
}

/*
 * A transaction-level lock on a stream name in this database: held by
 * felix_create_stream from before it registers the stream at the control
 * plane until it commits its table, and tried by the node agent before it
 * creates a table for a stream it learned of, so the two never race to
 * create the same table.
 */
bool
felix_stream_lock_name(const char *name, bool wait)
{
	LOCKTAG		tag;
	uint32		hash = hash_bytes((const unsigned char *) name, strlen(name));

	/* An advisory tag in a field-4 space of felix's own ('FX'). */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, hash, 0, 0x4658);
	return LockAcquire(&tag, ExclusiveLock, false, !wait) != LOCKACQUIRE_NOT_AVAIL;
}

/* Refuse a name already taken by a stream, or by a relation in `schema`. */
void
felix_stream_check_name_free(const char *name, const char *schema)
{
	Oid			nsp = get_namespace_oid(schema, false);

	if (felix_stream_name_taken(name))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" already exists", name),
				 errhint("Choose another name, or drop the stream with felix_drop_stream('%s').", name)));
	if (OidIsValid(get_relname_relid(name, nsp)))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_TABLE),
				 errmsg("cannot create stream \"%s\": relation \"%s\" already exists in schema \"%s\"",
						name, name, schema),
				 errhint("Choose another name for the stream, or drop or rename the existing relation.")));
}

/*
 * Make table relid stream `name` on this node: its catalog row, and no
 * files but the ones it will write (a fresh OID owns none; anything there
 * is a crash's leftover).
 */
static void
make_stream_local(Oid relid, const char *name, const char *creation_id,
				  Oid payload_type, const FelixStreamSettings *st)
{
	FelixStream def;
	char		dir[MAXPGPATH];

	memset(&def, 0, sizeof(def));
	def.relid = relid;
	def.payload_type = payload_type;
	strlcpy(def.name, name, NAMEDATALEN);
	strlcpy(def.creation_id, creation_id, FELIX_CREATION_ID_LEN);
	def.shards = st->shards;
	def.replication_factor = st->replication_factor;
	def.consistency = strcmp(st->consistency, "quorum") == 0 ?
		FELIX_CONSISTENCY_QUORUM : FELIX_CONSISTENCY_LEADER;
	def.retention_bytes = Max(st->retention_bytes, 0);
	felix_catalog_register(&def, st->retention);
	felix_stream_dir(MyDatabaseId, relid, dir);
	log_remove_all(dir);
}

/*
 * Create the stream's table in `schema` and its catalog row on this node,
 * in the caller's transaction, owned by the current user.  Refuses a name
 * taken by another stream or relation, and a temporary schema.  The
 * table's DDL names every type schema-qualified and runs with the
 * search_path pinned: a type of the caller's must never stand in for a
 * payload type (reading records into it could crash the server).
 */
Oid
felix_stream_create_local(const char *name, const char *schema, const char *creation_id,
						  const char *payload_type, const FelixStreamSettings *st)
{
	Oid			nsp;
	Oid			relid;
	StringInfoData sql;
	FelixContext cxt;

	/* one of jsonb, text, bytea, or an error: safe to name in the DDL */
	(void) payload_type_oid(payload_type);
	nsp = get_namespace_oid(schema, true);
	if (!OidIsValid(nsp))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_SCHEMA),
				 errmsg("cannot create stream \"%s\": schema \"%s\" does not exist on this node",
						name, schema),
				 errhint("Create schema \"%s\" in database \"%s\" on every node.",
						 schema, felix_database)));
	if (isAnyTempNamespace(nsp))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot create stream \"%s\" in a temporary schema", name),
				 errhint("Create streams in a permanent schema.")));
	felix_stream_check_name_free(name, schema);

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "CREATE TABLE %s.%s (shard pg_catalog.int4, seq pg_catalog.int8, "
					 "key pg_catalog.text, payload pg_catalog.%s, "
					 "published_at pg_catalog.timestamptz) USING felix",
					 quote_identifier(schema), quote_identifier(name),
					 payload_type);
	SPI_connect();
	felix_context_begin(&cxt, InvalidOid);
	if (SPI_execute(sql.data, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "felix: creating the table of stream \"%s\" failed", name);
	felix_context_end(&cxt);
	SPI_finish();
	CommandCounterIncrement();
	relid = get_relname_relid(name, nsp);
	make_stream_local(relid, name, creation_id, payload_type_oid(payload_type), st);
	/* what pg_dump carries to a restore (seclabel.c) */
	felix_stream_set_label(relid, st);
	return relid;
}

/*
 * Register stream `name` at the control plane, make it here -- table
 * relid, adopted for a restore (which then leads every shard), or a new
 * table -- and take its leases here, all on one control-plane session:
 * the host reads its state once for the creation and the heartbeat.
 */
static Oid
create_stream(const char *name, const char *schema, const char *payload_type,
			  const FelixStreamSettings *st, Oid relid)
{
	FelixCpSession s;
	volatile Oid made = relid;

	(void) felix_cp_open(&s, "felix", FELIX_CP_CALL_TIMEOUT_MS, ERROR);
	PG_TRY();
	{
		char	   *creation_id = register_stream(&s, name, schema, payload_type, st,
												  OidIsValid(relid));

		if (OidIsValid(relid))
			make_stream_local(relid, name, creation_id, payload_type_oid(payload_type), st);
		else
			made = felix_stream_create_local(name, schema, creation_id, payload_type, st);
		agent_apply_stream(&s, name);
	}
	PG_FINALLY();
	{
		felix_cp_close(&s);
	}
	PG_END_TRY();
	return made;
}

/*
 * Adopt a restored table: the label a restore set on it (after the table,
 * before its records) names the settings; the table's own columns name
 * the payload type.  The checks are felix_create_stream's, with the table
 * standing in for the name: PostgreSQL has checked the caller owns it.
 */
void
felix_stream_adopt(Oid relid, const FelixStreamSettings *st)
{
	Relation	rel = table_open(relid, AccessExclusiveLock);
	char	   *name = pstrdup(RelationGetRelationName(rel));
	char	   *schema = get_namespace_name(RelationGetNamespace(rel));
	TupleDesc	desc = RelationGetDescr(rel);
	FelixStream shape;
	const char *payload_type;

	felix_require_preload();
	require_felix_database(name);
	if (isAnyTempNamespace(RelationGetNamespace(rel)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot create stream \"%s\" in a temporary schema", name),
				 errhint("Restore streams into a permanent schema.")));
	memset(&shape, 0, sizeof(shape));
	strlcpy(shape.name, name, NAMEDATALEN);
	shape.payload_type = desc->natts >= FELIX_ATTNUM_PAYLOAD ?
		TupleDescAttr(desc, FELIX_ATTNUM_PAYLOAD - 1)->atttypid : InvalidOid;

	/*
	 * The payload column's type is the stream's payload type, so it must be
	 * one felix stores and validates: exactly jsonb, text or bytea, never a
	 * domain over one (its checks would not run) nor any other type (whose
	 * values felix's bytes would then be read as).
	 */
	payload_type = felix_payload_type_name(shape.payload_type);
	if (payload_type == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("cannot make table \"%s.%s\" stream \"%s\": its payload column is of type %s",
						schema, name, name,
						OidIsValid(shape.payload_type) ? format_type_be(shape.payload_type) : "(none)"),
				 errhint("A stream's payload column is of type jsonb, text or bytea, as felix_create_stream makes it.")));
	felix_stream_check_shape(&shape, desc);
	validate_settings(name, payload_type, st, st->retention_bytes != 0);
	stream_check_quota(name, st->shards);

	felix_stream_lock_name(name, true);
	if (felix_stream_name_taken(name))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("stream \"%s\" already exists", name),
				 errhint("Restore into a database where the stream does not exist, or drop it with felix_drop_stream('%s') first.", name)));
	/* the restore writes every shard's records from here: lead them all */
	(void) create_stream(name, schema, payload_type, st, relid);
	table_close(rel, NoLock);
	ereport(NOTICE,
			(errmsg("table \"%s.%s\" is now stream \"%s\" (%d shards, replication_factor %d, %s)",
					schema, name, name, st->shards, st->replication_factor, st->consistency)));
}

/*
 * DROP TABLE checks ownership too; the drop hook and the event trigger
 * take care of the catalog row and, at commit, the files.
 */
static void
drop_table(const FelixStream *stream)
{
	char	   *sql = psprintf("DROP TABLE %s.%s",
							   quote_identifier(get_namespace_name(get_rel_namespace(stream->relid))),
							   quote_identifier(get_rel_name(stream->relid)));

	SPI_connect();
	if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "felix: dropping stream \"%s\" failed", stream->name);
	SPI_finish();
}

PG_FUNCTION_INFO_V1(felix_drop_stream);
Datum
felix_drop_stream(PG_FUNCTION_ARGS)
{
	const FelixStream *stream;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a stream name must not be NULL"),
				 errhint("Pass the name of the stream to drop; felix_streams lists them.")));
	stream = felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	felix_check_stream_owner(stream->relid, stream->name, "drop");
	drop_table(stream);
	PG_RETURN_VOID();
}

/* The drop under way is felix_stream_drop_superseded's. */
static bool dropping_superseded = false;

void
felix_stream_drop_superseded(const FelixStream *stream)
{
	dropping_superseded = true;
	PG_TRY();
	{
		drop_table(stream);
	}
	PG_FINALLY();
	{
		dropping_superseded = false;
	}
	PG_END_TRY();
}

/* ---------------------------------------------------------------------
 * Removing a dropped stream's files at commit
 * ---------------------------------------------------------------------
 */
/*
 * A transaction that registered a stream at the control plane is aborting
 * (or the subtransaction that did): undo the registration, so that the
 * stream does not come into being anyway -- the node agents would create
 * its table from the control plane's rows.  This runs inside the abort,
 * so it never raises: a control plane that cannot be told leaves the
 * stream registered, and says so.  The name is still locked here, and the
 * agents learn that their rows may list a stream gone.
 */
static void
unregister_streams(SubTransactionId from_subid)
{
	ListCell   *lc;

	foreach(lc, registered)
	{
		StreamNote *n = lfirst(lc);

		if (n->subid < from_subid)
			continue;
		if (!felix_cp_unregister_stream(n->name, n->creation_id))
			ereport(WARNING,
					(errmsg("stream \"%s\": its creation was rolled back, but the control plane still lists it",
							n->name),
					 errdetail("The nodes will create the stream's table from the control plane's definition."),
					 errhint("Drop it with felix_drop_stream('%s') once the control plane is reachable.",
							 n->name)));
		shard_note_streams_changed();
		registered = foreach_delete_current(registered, lc);
	}
}
static object_access_hook_type prev_object_access_hook = NULL;

static void
stream_object_access(ObjectAccessType access, Oid classId, Oid objectId,
					 int subId, void *arg)
{
	const FelixStream *stream;

	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);

	/*
	 * Only a registered stream's drop is told to the control plane, and
	 * with the identity the control plane gave it: dropping a table
	 * someone made USING felix by hand (temporary, or in another schema,
	 * with a stream's name) must not make that stream disappear.
	 */
	if (access == OAT_DROP && classId == RelationRelationId && subId == 0 &&
		felix_uses_felix_am_relid(objectId) &&
		(stream = felix_stream_by_relid(objectId)) != NULL)
	{
		StreamNote *d;

		/*
		 * PostgreSQL lets a schema's owner drop whatever the schema holds;
		 * a stream's drop is not a local matter, though: it removes the
		 * stream and its records from every node.  On a node where the
		 * worker made the table, the schema of that name may belong to
		 * anyone.  So a stream is dropped only by its owner (a superuser,
		 * or a member of the owning role), however the drop is reached:
		 * DROP TABLE, DROP SCHEMA ... CASCADE, DROP OWNED BY.
		 */
		if (!pg_class_ownercheck(objectId, GetUserId()))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("must be owner of stream \"%s\" to drop it", stream->name),
					 errdetail("Dropping a stream's table drops the stream on every node of the cluster, with its records; only the owner of the table may, not the owner of its schema."),
					 errhint("Ask the owner of table \"%s\", or a superuser, to drop the stream with felix_drop_stream('%s').",
							 get_rel_name(objectId), stream->name)));
		d = note_stream(&dropped, objectId, stream->name, stream->creation_id);
		d->superseded = dropping_superseded;

		/*
		 * Hold the name until commit, as a creation does: the node agent
		 * then cannot bring the stream back from control-plane rows read
		 * before this drop reached the control plane.
		 */
		(void) felix_stream_lock_name(d->name, true);
	}
}

static void
stream_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;

	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:

			/*
			 * The control plane forgets the dropped streams before this
			 * transaction commits: if it cannot be told, the drop fails and
			 * nothing is lost; a rolled-back drop never reached it.  When
			 * the extension itself is being dropped there is no cluster
			 * catalog left to tell (and an embedded one is ours to drop).
			 */
			if (dropped != NIL && OidIsValid(get_extension_oid("felix", true)))
			{
				foreach(lc, dropped)
				{
					StreamNote *n = lfirst(lc);

					/* a superseded creation is gone there already */
					if (!n->superseded)
						felix_cp_drop_stream(n->name, n->creation_id);
				}
			}
			break;
		case XACT_EVENT_COMMIT:
			foreach(lc, dropped)
				shard_forget_stream(MyDatabaseId, ((StreamNote *) lfirst(lc))->relid);
			/* the node agent's rows may predate a stream made here */
			if (registered != NIL)
				shard_note_streams_changed();
			dropped = registered = NIL;
			break;
		case XACT_EVENT_ABORT:
			unregister_streams(InvalidSubTransactionId);
			dropped = registered = NIL;
			break;
		case XACT_EVENT_PREPARE:
			dropped = registered = NIL;
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (dropped != NIL || registered != NIL)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that created or dropped stream \"%s\"",
								((StreamNote *) linitial(registered != NIL ? registered : dropped))->name),
						 errdetail("A prepared transaction may be finished by another session, which could not tell the control plane."),
						 errhint("Create and drop streams in an ordinary transaction.")));
			break;
		default:
			break;
	}
}

static void
stream_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	/* Every subtransaction begun after mySubid descends from it. */
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	foreach(lc, dropped)
	{
		if (((StreamNote *) lfirst(lc))->subid >= mySubid)
			dropped = foreach_delete_current(dropped, lc);
	}
	unregister_streams(mySubid);
}

void
felix_stream_init(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = stream_object_access;
	RegisterXactCallback(stream_xact_callback, NULL);
	RegisterSubXactCallback(stream_subxact_callback, NULL);
}

/* ---------------------------------------------------------------------
 * Whole-stream operations
 * ---------------------------------------------------------------------
 */
PG_FUNCTION_INFO_V1(felix_enforce_retention);
Datum
felix_enforce_retention(PG_FUNCTION_ARGS)
{
	FelixStream copy = *felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));

	FelixContext cxt;
	int			removed = 0;

	felix_check_stream_owner(copy.relid, copy.name, "apply the retention of");
	LockRelationOid(copy.relid, AccessShareLock);
	/* Maintenance of a table: as its owner, restricted (privilege.c). */
	felix_context_begin(&cxt, felix_relation_owner(copy.relid));
	for (int i = 0; i < copy.shards; i++)
		removed += shard_trim(felix_stream_shard(&copy, i));
	felix_context_end(&cxt);
	PG_RETURN_INT32(removed);
}

PG_FUNCTION_INFO_V1(felix_truncate_after);
Datum
felix_truncate_after(PG_FUNCTION_ARGS)
{
	const FelixStream *stream;
	int32		shard = PG_GETARG_INT32(1);
	int64		seq = PG_GETARG_INT64(2);

	felix_require_superuser("felix.truncate_after");
	stream = felix_stream_by_name(text_to_cstring(PG_GETARG_TEXT_PP(0)));
	felix_check_shard(stream, shard);
	if (seq < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("stream \"%s\" shard %d: cannot truncate after seq " INT64_FORMAT,
						stream->name, shard, seq),
				 errhint("Pass the last seq to keep.")));
	LockRelationOid(stream->relid, ShareUpdateExclusiveLock);
	shard_truncate_after(felix_stream_shard(stream, shard), (uint64) seq);
	PG_RETURN_VOID();
}
