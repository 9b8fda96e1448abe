/*-------------------------------------------------------------------------
 *
 * pending.h
 *	  Records INSERTed or COPied into a stream inside a transaction.  They
 *	  are buffered in backend memory, dropped on abort (and on rollback to a
 *	  savepoint), and appended at pre-commit as one batch per shard.
 *
 * Locking rule: backend-local; the append itself goes through shard.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_PENDING_H
#define FELIX_API_PENDING_H

#include "postgres.h"
#include "core/catalog.h"
#include "executor/tuptable.h"

/* Buffer the slot's row for the stream (validates it first). */
extern int	pending_add(const FelixStream *stream, TupleTableSlot *slot);

extern void pending_init(void);

#endif							/* FELIX_API_PENDING_H */
