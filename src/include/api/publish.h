/*-------------------------------------------------------------------------
 *
 * publish.h
 *	  Turning SQL values into records and records into a shard's log:
 *	  routing (explicit shard, else key hash, else spread), payload
 *	  conversion, size checks and the owner's byte cap.  Shared by
 *	  felix_publish, the batch form and the INSERT/COPY path.
 *
 * Locking rule: backend-local; appends go through shard_publish.  The byte
 * cap reads shard slots one at a time under each one's spinlock
 * (shard_read_positions) and holds nothing else.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_PUBLISH_H
#define FELIX_API_PUBLISH_H

#include "postgres.h"
#include "core/catalog.h"

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
/* ... for `role` rather than the current user (a publish forwarded here). */
extern void publish_check_access_as(const FelixStream *stream, Oid role);
/* ... INSERT privilege and the lock only: for rows an INSERT or COPY on
 * another node buffered, where its row security and triggers applied. */
extern void publish_check_insert_as(const FelixStream *stream, Oid role);

/* What a publish is about to append to one stream (publish_check_bytes). */
typedef struct PublishCharge
{
	const FelixStream *stream;
	uint64		bytes;			/* the batches' bytes */
} PublishCharge;

/*
 * felix.max_bytes_per_role, at admission: refuse (53400) a publish that
 * would take the bytes held on this node by the streams of a charged
 * stream's owner past the cap.  The owner pays, whoever publishes; a
 * superuser caller and a superuser's streams are exempt.  Nothing is
 * reserved: publishes admitted at the same time may together pass the cap
 * by what they add.  Free while the cap is 0; else one pass over the shard
 * registry per call, however many records and streams it charges.
 */
extern void publish_check_bytes(const PublishCharge *charges, int n);

#endif							/* FELIX_API_PUBLISH_H */
