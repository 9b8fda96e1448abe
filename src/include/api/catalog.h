/*-------------------------------------------------------------------------
 *
 * catalog.h
 *	  What felix knows about a stream: its definition from felix.streams,
 *	  cached per backend.  The cache is dropped whenever a relcache
 *	  invalidation touches felix.streams or a stream's table, so a
 *	  definition is never used after its stream was dropped or recreated.
 *
 * Locking rule: backend-local; no shared state.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_CATALOG_H
#define FELIX_API_CATALOG_H

#include "postgres.h"
#include "storage/shard.h"
#include "utils/rel.h"

typedef enum FelixStorage
{
	FELIX_STORAGE_LOCAL,
	FELIX_STORAGE_OBJECT
} FelixStorage;

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
/* Lookup by the stream table's OID; NULL if it is not a stream. */
extern const FelixStream *felix_stream_by_relid(Oid relid);

/* True if the relation uses the felix table access method. */
extern bool felix_is_stream_rel(Relation rel);
extern bool felix_is_stream_relid(Oid relid);

/* The slot of a stream's shard, opened (recovered) if needed. */
extern FelixShard *felix_stream_shard(const FelixStream *stream, int shard);

/* Error unless 0 <= shard < stream->shards (names stream and shard). */
extern void felix_check_shard(const FelixStream *stream, int64 shard);

extern void felix_catalog_init(void);

#endif							/* FELIX_API_CATALOG_H */
