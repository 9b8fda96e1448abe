/*-------------------------------------------------------------------------
 *
 * privilege.c
 *	  Who felix's code runs as, and what it trusts.  felix runs SQL on
 *	  other people's behalf: its workers are superusers, a backend reads
 *	  and writes felix's catalog as the extension's owner, and a stream
 *	  owner's maintenance (retention) runs wherever it is asked for.  None
 *	  of that may resolve a name through a search_path the caller chose --
 *	  an operator or type of theirs would run, or be believed, with felix's
 *	  privileges -- so every such query runs inside felix_context_begin:
 *	  search_path pinned to pg_catalog, pg_temp (objects in pg_temp are
 *	  never searched for functions and operators), and, when it runs as
 *	  another role, inside a security-restricted operation, exactly as
 *	  VACUUM and ANALYZE run as a table's owner.  The SQL itself still names
 *	  every object, type and operator schema-qualified; the pinned path is
 *	  the second line of defence.
 *
 *	  The checks every C entry point makes of its caller live here too, so
 *	  that each privilege is worded and checked the same way everywhere.
 *
 * Locking rule: none; backend-local state only (GUC nesting, the current
 * user id), both restored by a transaction or subtransaction abort.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_class.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "base/privilege.h"

void
felix_context_begin(FelixContext *cxt, Oid as_user)
{
	cxt->guc_nest = NewGUCNestLevel();
	(void) set_config_option("search_path", FELIX_SAFE_SEARCH_PATH,
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	GetUserIdAndSecContext(&cxt->saved_user, &cxt->saved_sec_context);
	cxt->switched_user = OidIsValid(as_user);
	if (cxt->switched_user)
		SetUserIdAndSecContext(as_user,
							   cxt->saved_sec_context |
							   SECURITY_LOCAL_USERID_CHANGE |
							   SECURITY_RESTRICTED_OPERATION);
}

void
felix_context_end(FelixContext *cxt)
{
	if (cxt->switched_user)
		SetUserIdAndSecContext(cxt->saved_user, cxt->saved_sec_context);
	AtEOXact_GUC(true, cxt->guc_nest);
}

void
felix_worker_pin_search_path(void)
{
	/*
	 * PGC_S_OVERRIDE wins over any ALTER DATABASE/ROLE ... SET search_path
	 * that the database's owner may have left for the worker to pick up.
	 */
	SetConfigOption("search_path", FELIX_SAFE_SEARCH_PATH, PGC_SUSET, PGC_S_OVERRIDE);
}

Oid
felix_catalog_owner(void)
{
	Oid			nsp = get_namespace_oid("felix", false);
	Oid			streams = get_relname_relid("streams", nsp);

	if (!OidIsValid(streams))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the felix catalog table felix.streams is missing"),
				 errhint("Recreate the extension: DROP EXTENSION felix; CREATE EXTENSION felix.")));
	return felix_relation_owner(streams);
}

Oid
felix_relation_owner(Oid relid)
{
	Oid			owner = felix_relation_owner_if_any(relid);

	if (!OidIsValid(owner))
		elog(ERROR, "felix: cache lookup failed for relation %u", relid);
	return owner;
}

Oid
felix_relation_owner_if_any(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		return InvalidOid;
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

void
felix_check_stream_acl(Oid relid, const char *stream, AclMode mode, const char *action)
{
	const char *priv = mode == ACL_INSERT ? "INSERT" : mode == ACL_SELECT ? "SELECT" : "the needed";

	if (pg_class_aclcheck(relid, GetUserId(), mode) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to %s stream \"%s\"", action, stream),
				 errhint("It needs %s privilege on the stream's table: GRANT %s ON %s TO ...",
						 priv, priv, quote_identifier(stream))));
}

void
felix_check_stream_owner(Oid relid, const char *stream, const char *action)
{
	if (!pg_class_ownercheck(relid, GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("must be owner of stream \"%s\" to %s it", stream, action),
				 errhint("Ask the owner of the stream's table, or a superuser.")));
}

void
felix_require_superuser(const char *function)
{
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for function %s", function),
				 errhint("Only a superuser may call %s.", function)));
}

void
felix_require_replication_role(const char *function)
{
	Oid			repl = get_role_oid("felix_replication", true);

	if (superuser() ||
		(OidIsValid(repl) && has_privs_of_role(GetUserId(), repl)))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for function %s", function),
			 errhint("%s is called by felix nodes, as their felix_node_<name> roles; users do not call it.",
					 function)));
}

bool
felix_sees_all_streams(void)
{
	return has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS);
}

bool
felix_sees_stream(Oid relid)
{
	bool		missing = false;

	/* a stream dropped meanwhile is seen by nobody */
	return (felix_sees_all_streams() ||
			pg_class_aclcheck_ext(relid, GetUserId(), ACL_SELECT, &missing) == ACLCHECK_OK) &&
		!missing;
}
