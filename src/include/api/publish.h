/*-------------------------------------------------------------------------
 *
 * publish.h
 *	  Turning SQL values into records and records into a shard's log:
 *	  routing (explicit shard, else key hash, else spread), payload
 *	  conversion and size checks.  Shared by felix_publish, the batch form
 *	  and the INSERT/COPY path.
 *
 * Locking rule: backend-local; appends go through shard_publish.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_PUBLISH_H
#define FELIX_API_PUBLISH_H

#include "postgres.h"
#include "api/catalog.h"

/* Which shard a record goes to (shard_arg < 0: not given). */
extern int	publish_route(const FelixStream *stream, int64 shard_arg,
						  const char *key, int key_len);

/*
 * Convert a payload datum of type `argtype` to the stream's payload type and
 * return a pointer to its bytes (varlena contents) and length; errors on
 * NULL, an impossible conversion, or a record over felix.max_record_bytes.
 */
extern void publish_payload_bytes(const FelixStream *stream, int shard,
								  Datum payload, bool isnull, Oid argtype,
								  const char **bytes, uint32 *len,
								  int key_len);

/* Take the lock and privilege a publish needs on the stream's table. */
extern void publish_check_access(const FelixStream *stream);

#endif							/* FELIX_API_PUBLISH_H */
