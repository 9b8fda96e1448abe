/*-------------------------------------------------------------------------
 *
 * catalog.h
 *	  What felix knows about a stream: its definition from felix.streams,
 *	  cached per backend.  Only a relation registered there is a stream; a
 *	  table someone created USING felix by hand is inert.  The cache is
 *	  dropped whenever a relcache invalidation touches felix.streams or a
 *	  stream's table, so a definition is never used after its stream was
 *	  dropped or recreated.
 *
 * Locking rule: backend-local; no shared state.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CORE_CATALOG_H
#define FELIX_CORE_CATALOG_H

#include "postgres.h"

#include "access/tupdesc.h"
#include "datatype/timestamp.h"
#include "utils/rel.h"

#include "storage/shard.h"

typedef enum FelixStorage
{
	FELIX_STORAGE_LOCAL,
	FELIX_STORAGE_OBJECT
} FelixStorage;

/* A creation id is a uuid in its text form (36 characters). */
#define FELIX_CREATION_ID_LEN	37

typedef struct FelixStream
{
	int64		id;				/* felix.streams.id */
	Oid			relid;			/* the stream's table */
	char		name[NAMEDATALEN];
	int32		shards;
	int32		replication_factor;
	FelixConsistency consistency;
	Oid			payload_type;	/* JSONBOID, TEXTOID or BYTEAOID */
	FelixStorage storage;
	int64		retention_bytes;	/* 0: unlimited */
	int64		retention_ms;	/* 0: unlimited */
	char		creation_id[FELIX_CREATION_ID_LEN];	/* the control plane's
													 * identity of the stream */
} FelixStream;

/* Column numbers of every stream table. */
#define FELIX_ATTNUM_SHARD			1
#define FELIX_ATTNUM_SEQ			2
#define FELIX_ATTNUM_KEY			3
#define FELIX_ATTNUM_PAYLOAD		4
#define FELIX_ATTNUM_PUBLISHED_AT	5
#define FELIX_NATTS					5

/* Lookup by name (exact, case-sensitive); errors naming the stream with a
 * hint when unknown or when the name is a table that is not a stream. */
extern const FelixStream *felix_stream_by_name(const char *name);
/* Lookup by name; NULL if no stream has it (never raises for that). */
extern const FelixStream *felix_stream_lookup_name(const char *name);
/* Lookup by the stream table's OID; NULL if it is not a registered stream. */
extern const FelixStream *felix_stream_by_relid(Oid relid);
/* Every stream of this database, ordered by name: a List of palloc'd
 * FelixStream copies. */
extern List *felix_stream_list(void);
/* True if felix.streams has a stream of that name. */
extern bool felix_stream_name_taken(const char *name);
/* How many streams, and shards in them, the role owns (its tables). */
extern void felix_catalog_owned(Oid role, int64 *streams, int64 *shards);
/* Add a stream's row (its table exists); the caller checked the name. */
extern void felix_catalog_register(const FelixStream *def, Interval *retention);

/* Does the stream have exactly these settings (a restore's label)? */
struct FelixStreamSettings;
extern bool felix_stream_settings_match(const FelixStream *stream,
										const struct FelixStreamSettings *st);

/*
 * True if the relation uses the felix table access method.  Such a table
 * is refused every change of shape; it is a stream only when registered.
 */
extern bool felix_uses_felix_am(Relation rel);
extern bool felix_uses_felix_am_relid(Oid relid);

/*
 * Error (ERRCODE_DATA_CORRUPTED) unless the relation's columns are exactly
 * what felix_create_stream gives a stream of this definition: names,
 * types, no dropped columns.
 */
extern void felix_stream_check_shape(const FelixStream *stream, TupleDesc desc);

/* The slot of a stream's shard, opened (recovered) if needed. */
extern FelixShard *felix_stream_shard(const FelixStream *stream, int shard);

/* Error unless 0 <= shard < stream->shards (names stream and shard). */
extern void felix_check_shard(const FelixStream *stream, int64 shard);

extern void felix_catalog_init(void);

/*
 * What a stream is created with, besides its name, schema and payload
 * type.  retention_bytes <= 0 and retention NULL mean no limit.
 */
typedef struct FelixStreamSettings
{
	int			shards;
	int			replication_factor;
	const char *consistency;	/* "leader" or "quorum" */
	const char *storage;		/* "local" or "object" */
	int64		retention_bytes;
	Interval   *retention;
} FelixStreamSettings;

#endif							/* FELIX_CORE_CATALOG_H */
