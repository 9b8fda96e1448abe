/*-------------------------------------------------------------------------
 *
 * remote.h
 *	  Reading a shard this node holds no copy of, from a node that does.
 *	  See remote.c.
 *
 * Locking rule: backend-local; a reader's connection belongs to the
 * backend that opened it and is closed at the end of its transaction at
 * the latest.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_AM_REMOTE_H
#define FELIX_AM_REMOTE_H

#include "postgres.h"

#include "core/catalog.h"
#include "storage/format.h"
#include "storage/shard.h"

typedef struct FelixRemoteReader FelixRemoteReader;

/*
 * True when the control plane has placed shard `s` and this node is
 * neither one of its replicas nor joining it: its local files (if any)
 * are not the shard's records.
 */
extern bool remote_shard_elsewhere(FelixShard *s);

/*
 * Read seqs [lo, hi) of shard `shard` from one of its replicas, leader
 * first.  The first chunk is fetched here; *visible_end is set to the end
 * of what that replica serves (its high-water mark), and the reader never
 * returns records at or past it.  Raises an error naming the stream and
 * shard when no replica answers.
 */
extern FelixRemoteReader *remote_reader_open(const FelixStream *stream, int shard,
											 uint64 lo, uint64 hi,
											 uint64 *visible_end);
/* The next record; its pointers stay valid until the next call. */
extern bool remote_reader_next(FelixRemoteReader *r, FelixRecord *rec);
extern void remote_reader_close(FelixRemoteReader *r);
/* The node the reader's records come from. */
extern const char *remote_reader_node(const FelixRemoteReader *r);

/* Close what an error left open (transaction end). */
extern void remote_init(void);

#endif							/* FELIX_AM_REMOTE_H */
