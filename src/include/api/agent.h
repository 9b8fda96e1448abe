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
	int			slot;			/* its local shard's slot (-1: not reached) */
	FelixShardKey key;			/* ... and that shard */
	bool		holds;			/* it names this node a replica */
	bool		defer_costly;	/* past the budget: leave costly work */
	bool		deferred;		/* ... and this row was left for later */
} AgentRow;


/* The worker, before its first heartbeat: the agent's own tables. */
extern void agent_init(void);

/* Just before a heartbeat asks for the rows (see agent.c). */
extern void agent_rows_asked(void);

/* A heartbeat's shards as rows to apply. */
extern AgentRow *agent_rows(FelixCpShard *shards, int n);

/*
 * The worker's heartbeats: what the assignments this node holds are as of
 * (NULL: none; the next answer is then every assignment), and the next
 * answer taken in (its rows merged into those held).  The rows to apply
 * are returned: those the answer brought, and those held whose local
 * shard is no longer as they left it or that never reached it; the
 * leases of the others are renewed here and now (lease_reassert), as of
 * t_send.  agent_forget forgets them all (a new incarnation).
 */
extern const FelixCpAnswer *agent_known(void);
extern AgentRow *agent_take_answer(FelixCpShard *shards, int n, const FelixCpAnswer *answer,
								   int64 t_send, int *nrows);
extern void agent_forget(void);

/*
 * Log ends the worker need not give again: those it gave at the
 * heartbeat of agent_known() (the control plane checks that it still
 * holds them, and answers in full otherwise).  agent_ends_sent, after
 * each heartbeat that succeeded, says what it gave.
 */
extern bool agent_ends_unchanged(char **ends, int n);
extern void agent_ends_sent(char **ends, int n, bool unchanged, const FelixCpAnswer *answer);
/* Note each shard's leader and its address in the node directory. */
extern void agent_note_leaders(AgentRow *rows, int nrows);
/*
 * Apply every row: first the shards of streams that exist here (lease
 * renewals must not wait behind a table creation), then create the
 * missing streams (and replace older creations), then apply their rows,
 * each step in its own transaction.  Past deadline_ns (0: none) only
 * what is cheap is done -- renewals, a word on the replicas -- and the
 * rest (opening a shard, taking the lead, creating a stream) is left
 * for the next heartbeat, so that heartbeat is not late.
 */
extern void agent_apply(AgentRow *rows, int nrows, int64 deadline_ns);
/* Remember which rows reached their local shard (and, of the rows held,
 * which shards this node was named a replica of). */
extern void agent_note_served(AgentRow *rows, int nrows);
extern void agent_note_held(AgentRow *rows, int nrows);

/* For the next heartbeat: the shards held ("stream/shard=end"; the
 * strings are the agent's, valid until its next call here or to
 * agent_note_held; *moved: any differs from the last call's) and the
 * shards this node cannot serve ("stream/shard"); see agent.c. */
extern char **agent_held_ends(int *n, bool *moved);
extern char **agent_unable_list(int *n);

/* In a backend that just created `stream`, on the session it created it
 * on: heartbeat once and apply the control plane's assignments of that
 * stream to this node's shards. */
extern void agent_apply_stream(FelixCpSession *s, const char *stream);

#endif							/* FELIX_API_AGENT_H */
