/*-------------------------------------------------------------------------
 *
 * am.h
 *	  The felix table access method and what is built on it: reading a
 *	  stream's shards in (shard, seq) order through the segment log, the
 *	  FelixScan custom scan that seeks by shard and seq, and the hooks that
 *	  refuse operations an append-only log cannot honour.
 *
 *	  tableam.c owns the TableAmRoutine and the FelixCursor below (shared
 *	  by the sequential scan, ANALYZE and FelixScan); scan.c owns the
 *	  planner hook and the custom scan; refuse.c owns the executor and
 *	  utility hooks.
 *
 * Locking rule: backend-local.  A cursor reads below each shard's
 * visibility bound taken once from shared state (shard_visible) and holds
 * no lock while reading; the caller holds at least AccessShareLock on the
 * stream's table, so the stream cannot be dropped underneath it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_AM_AM_H
#define FELIX_AM_AM_H

#include "postgres.h"

#include "core/catalog.h"
#include "executor/tuptable.h"
#include "utils/rel.h"

/* Register FelixScan and install the hooks (set_rel_pathlist and planner
 * in scan.c, ExecutorStart and ProcessUtility in refuse.c), each chaining
 * the previous one.  Called once from _PG_init when felix is preloaded. */
extern void felix_am_init(void);

/* ---- reading a stream (tableam.c) ---- */

/*
 * A forward reader over shards [shard_lo, shard_hi) and seqs
 * [seq_lo, seq_hi) of a stream, producing rows in (shard, seq) order into
 * a virtual slot of the stream's row type.  Each shard's visible range is
 * snapshotted the first time the cursor reaches it and kept for the
 * cursor's life, so a rescan (nested loop, ReScan) sees the same records.
 * Datums stored in the slot stay valid until the next felix_cursor_next
 * or felix_cursor_end.
 */
typedef struct FelixCursor FelixCursor;

/* A cursor over the whole stream; memory lives in a child of CurrentMemoryContext. */
extern FelixCursor *felix_cursor_begin(const FelixStream *stream);
/* Restart at a new range (hi bounds exclusive); an empty range reads nothing. */
extern void felix_cursor_set_range(FelixCursor *c, int32 shard_lo, int32 shard_hi,
								   uint64 seq_lo, uint64 seq_hi);
/* Read only this node's own copies, never a replica's (answering a peer). */
extern void felix_cursor_set_local(FelixCursor *c);
/* Only fill the columns marked true (FELIX_NATTS entries); others read as NULL. */
extern void felix_cursor_set_columns(FelixCursor *c, const bool *needed);
extern bool felix_cursor_next(FelixCursor *c, TupleTableSlot *slot);
extern void felix_cursor_end(FelixCursor *c);
/* Records returned since the cursor began (EXPLAIN ANALYZE). */
extern uint64 felix_cursor_records(FelixCursor *c);

/*
 * A stream's definition copied out of the catalog cache (which may be
 * reset by any invalidation), for a relation using the felix access
 * method.  Errors naming the table when it is not a registered stream.
 */
extern void felix_am_stream(Relation rel, FelixStream *out);

/*
 * Planner statistics for one shard from shared state, without opening the
 * shard: visible record count and bytes.  Returns false if the shard has
 * not been opened since the server started (nothing known).
 */
extern bool felix_am_shard_stats(const FelixStream *stream, int shard,
								 uint64 *start_seq, uint64 *hwm_end,
								 uint64 *bytes);

/* ---- refusals (refuse.c), shared with the access method's backstops ---- */

/* "stream "x" is append-only: <operation> is not supported" + hint. */
extern void felix_refuse_change(const char *relname, const char *operation,
								const char *hint) pg_attribute_noreturn();
/* "stream "x" does not support <feature>" + hint. */
extern void felix_refuse_feature(const char *relname, const char *feature,
								 const char *hint) pg_attribute_noreturn();

/* Hints used by several refusals. */
#define FELIX_HINT_APPEND_ONLY \
	"Publish a new record instead; records in a stream are never changed or removed one by one."
#define FELIX_HINT_RETENTION \
	"Use retention (felix_create_stream's retention_bytes/retention) or felix_drop_stream."
#define FELIX_HINT_READ_BY_POSITION \
	"Address records by position instead, with WHERE shard = ... AND seq >= ..."

/* Hook installers, called by felix_am_init. */
extern void felix_scan_init(void);
extern void felix_refuse_init(void);

#endif							/* FELIX_AM_AM_H */
