/*-------------------------------------------------------------------------
 *
 * forward.h
 *	  Publishing on a node that does not lead the shard: the publish goes
 *	  to the shard's leader (forward.c).
 *
 * Locking rule: backend-local; see forward.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_FORWARD_H
#define FELIX_API_FORWARD_H

#include "postgres.h"

#include "core/catalog.h"
#include "api/publish.h"
#include "libpq-fe.h"
#include "lib/stringinfo.h"
#include "replication/leader.h"
#include "storage/shard.h"

/*
 * Should a publish of shard s go to its leader?  When felix.forward_publishes
 * is on and the control plane names another node as its leader.
 */
extern bool forward_wanted(FelixShard *s);
/* ... and if so, which node (leader, NAMEDATALEN), from one look at s. */
extern bool forward_leader(FelixShard *s, char *leader);

/*
 * Publish the sealed batch of `count` records on shard `shard` through its
 * leader, as the current user; returns the first record's seq once it is
 * acknowledged there.  Follows a change of leader until felix.quorum_timeout;
 * raises the leader's error, or 55F01 when the answer never came.
 */
extern uint64 forward_publish(const FelixStream *stream, int shard,
							  StringInfo batch, uint32 count);

/*
 * Publish a commit whose parts are led by several nodes (pending.c, at
 * pre-commit): staged at every leader, then published everywhere; see
 * forward_commit.c.  `parts`, `charges` and `roles` (the OIDs of the roles
 * that inserted each part's rows) match index for index.
 */
extern bool forward_commit_wanted(const FelixCommitPart *parts, int nparts);
extern void forward_commit(FelixCommitPart *parts, const PublishCharge *charges,
						   List *const *roles, int nparts);
extern void forward_commit_init(void);

/* ---- shared by the two files of forwarding (forward.c, forward_commit.c) ---- */

/* How long forwarding naps between two attempts, in ms. */
#define FORWARD_RETRY_MS	20

/* A usable connection to node `name`, kept for the life of the backend, or
 * NULL (why in felix_conn_last_error). */
extern PGconn *forward_conn(const char *name);
/* Close the kept connection to node `name`: a call on it may be mid-way. */
extern void forward_drop_conn(const char *name);
/*
 * Is a kept connection still one a call can go on?  libpq's own state
 * says nothing of a server that has gone since (a restart, a terminated
 * or timed-out session): read what the server sent meanwhile, without
 * waiting, and give up on the connection if it closed or said anything.
 */
extern bool forward_conn_alive(PGconn *conn);
/*
 * An error of a forwarded call that leaves its outcome unknown: the
 * connection broke or timed out, the leader's session was cancelled or
 * ended, or the leader itself could not tell (55F01).  Its records may
 * have been appended there, so it is never sent again.
 */
extern bool forward_outcome_unknown(int sqlerrcode);
/* Admission of a write a peer asks for (lease_admit): its generation, or
 * 0 when this node refuses at admission (it does not lead the shard, or
 * its lease ran out), with nothing done. */
extern uint64 forward_admit(FelixShard *s);
/* The stream a peer names, by name and creation id; 42P01 when this node
 * has no such stream, or another creation of it (not learned of yet). */
extern const FelixStream *forward_stream(const char *name, const char *creation_id);
/*
 * A batch a peer sent (data, len): its checksum and shape first, then
 * every record as a value of the stream's types; rebuilt into `rebuilt`
 * (sealed), with its record count.  Raises naming stream and shard.
 */
extern void forward_check_batch(const FelixStream *stream, int shard, const char *data,
								Size len, StringInfo rebuilt, uint32 *count);

#endif							/* FELIX_API_FORWARD_H */
