/*-------------------------------------------------------------------------
 *
 * agent.h
 *	  The node agent's work on the control plane's word: the rows of a
 *	  heartbeat applied to this node's shards and streams.  See agent.c.
 *
 * Locking rule: see agent.c; its state is process-local.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_AGENT_H
#define FELIX_API_AGENT_H

#include "postgres.h"

#include "control/cpcall.h"

/* One assignment as the control plane returned it, and what became of it here. */
typedef struct AgentRow
{
	FelixCpShard c;
	bool		missing;		/* the stream has no table here yet, or only
								 * one of an older creation (superseded) */
	bool		superseded;
	bool		created;		/* ... and this cycle created it */
	bool		applied;		/* the assignment reached the local shard */
	int			slot;			/* its local shard's slot if it names this
								 * node a replica, else -1 */
	FelixShardKey key;			/* ... and that shard */
} AgentRow;


/* The worker, before its first heartbeat: the agent's own tables. */
extern void agent_init(void);

/* Just before a heartbeat asks for the rows (see agent.c). */
extern void agent_rows_asked(void);

/* A heartbeat's shards as rows to apply. */
extern AgentRow *agent_rows(FelixCpShard *shards, int n);
/* Note each shard's leader and its address in the node directory. */
extern void agent_note_leaders(AgentRow *rows, int nrows);
/*
 * Apply every row: first the shards of streams that exist here (lease
 * renewals must not wait behind a table creation), then create the
 * missing streams (and replace older creations), then apply their rows,
 * each step in its own transaction.
 */
extern void agent_apply(AgentRow *rows, int nrows);
/* Remember which rows reached their local shard, and which shards this
 * node was named a replica of. */
extern void agent_note_served(AgentRow *rows, int nrows);
extern void agent_note_held(AgentRow *rows, int nrows);

/* For the next heartbeat: the shards held ("stream/shard=end") and the
 * shards this node cannot serve ("stream/shard"); see agent.c. */
extern char **agent_held_ends(int *n);
extern char **agent_unable_list(int *n);

/* In a backend that just created `stream`: heartbeat once and apply the
 * control plane's assignments of that stream to this node's shards. */
extern void agent_apply_stream(const char *stream);

#endif							/* FELIX_API_AGENT_H */
