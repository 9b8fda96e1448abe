/*-------------------------------------------------------------------------
 *
 * privilege.h
 *	  Who felix's code runs as, what it resolves names through, and what a
 *	  caller must hold before a C entry point acts.  See privilege.c.
 *
 * Locking rule: none; everything here is backend-local.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_BASE_PRIVILEGE_H
#define FELIX_BASE_PRIVILEGE_H

#include "postgres.h"

#include "nodes/parsenodes.h"

/* The search_path of every query felix issues (workers, SPI, libpq). */
#define FELIX_SAFE_SEARCH_PATH	"pg_catalog, pg_temp"

/* What felix_context_begin changed, for felix_context_end. */
typedef struct FelixContext
{
	int			guc_nest;
	Oid			saved_user;
	int			saved_sec_context;
	bool		switched_user;
} FelixContext;

/*
 * Run what follows (until felix_context_end) with search_path pinned to
 * FELIX_SAFE_SEARCH_PATH and, when `as_user` is valid, as that role inside
 * a security-restricted operation, as PostgreSQL's maintenance commands run
 * as a table's owner.  An error in between is undone by the transaction's
 * (or subtransaction's) abort, which restores both.
 */
extern void felix_context_begin(FelixContext *cxt, Oid as_user);
extern void felix_context_end(FelixContext *cxt);

/* Pin a worker's search_path for its whole life (call once at start). */
extern void felix_worker_pin_search_path(void);

/* The owner of the felix extension's catalog (felix.streams). */
extern Oid	felix_catalog_owner(void);
/* The owner of a relation; _if_any: InvalidOid when it is gone. */
extern Oid	felix_relation_owner(Oid relid);
extern Oid	felix_relation_owner_if_any(Oid relid);

/*
 * Privilege checks of C entry points; each raises 42501 naming what was
 * asked for and how to get it.
 */
extern void felix_check_stream_acl(Oid relid, const char *stream, AclMode mode,
								   const char *action);
extern void felix_check_stream_owner(Oid relid, const char *stream,
									 const char *action);
extern void felix_require_superuser(const char *function);
/* The caller acts for the cluster: superuser or a member of felix_replication. */
extern void felix_require_replication_role(const char *function);

/* May the current user see every stream in the views (pg_read_all_stats)? */
extern bool felix_sees_all_streams(void);
/* May it see this stream in the views (SELECT on it, or all)? */
extern bool felix_sees_stream(Oid relid);

#endif							/* FELIX_BASE_PRIVILEGE_H */
