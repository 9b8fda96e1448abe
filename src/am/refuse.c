/*-------------------------------------------------------------------------
 *
 * refuse.c
 *	  Early, clear refusals of what a stream cannot do.  A stream is an
 *	  append-only log: its records are never changed, removed one by one,
 *	  locked, indexed or reshaped.  Statements that would try are stopped
 *	  here before they run — an executor hook for UPDATE, DELETE, MERGE,
 *	  INSERT ... ON CONFLICT and row locks, a utility hook for TRUNCATE,
 *	  CREATE INDEX, ALTER TABLE, RENAME, SET SCHEMA (of a stream, or a
 *	  rename of the schema holding one), VACUUM FULL, CLUSTER, rules,
 *	  row-level AFTER triggers, inheritance and partitions, publications
 *	  and extension membership — each with ERRCODE_FEATURE_NOT_SUPPORTED,
 *	  a message naming the stream and a hint.  The access method
 *	  (tableam.c) raises the same errors as a backstop for any path that
 *	  gets past these.
 *
 *	  A table created USING felix by hand becomes a stream when a restore
 *	  labels it (seclabel.c), so it must be created as plainly as
 *	  felix_create_stream and pg_dump create one: no parent, no type, no
 *	  constraints or defaults.
 *
 *	  Ownership decides the quotas (felix.max_streams_per_role and
 *	  felix.max_shards_per_role count the streams a role owns), so ALTER
 *	  TABLE ... OWNER TO and REASSIGN OWNED that give a role streams are
 *	  checked against the new owner's quota once PostgreSQL has made the
 *	  change (and checked the caller's right to make it); over quota, the
 *	  statement fails and its transaction rolls the change back.
 *
 *	  sql/utility_matrix.sql applies every statement that can name a
 *	  table to a stream, against test/matrix/statements.txt, which
 *	  classifies every command tag of PostgreSQL.
 *
 *	  EXPLAIN without ANALYZE is let through: it shows the plan and runs
 *	  nothing.
 *
 * Locking rule: no locks.  Relations named in utility statements are
 * looked up without a lock (RangeVarGetRelid with NoLock): the check only
 * decides whether to refuse; the command itself takes its own locks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/tableam.h"
#include "am/am.h"
#include "core/catalog.h"
#include "catalog/namespace.h"
#include "catalog/pg_trigger.h"
#include "commands/defrem.h"
#include "commands/extension.h"
#include "executor/executor.h"
#include "felix.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "parser/parsetree.h"
#include "base/privilege.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/lsyscache.h"

static ExecutorStart_hook_type prev_ExecutorStart = NULL;
static ProcessUtility_hook_type prev_ProcessUtility = NULL;

void
felix_refuse_change(const char *relname, const char *operation, const char *hint)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("stream \"%s\" is append-only: %s is not supported", relname, operation),
			 errhint("%s", hint)));
	pg_unreachable();
}

void
felix_refuse_feature(const char *relname, const char *feature, const char *hint)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("stream \"%s\" does not support %s", relname, feature),
			 errhint("%s", hint)));
	pg_unreachable();
}

/* The stream's name if relid is a table using the felix access method. */
static const char *
stream_name(Oid relid)
{
	if (!OidIsValid(relid) || !felix_uses_felix_am_relid(relid))
		return NULL;
	return get_rel_name(relid);
}

static const char *
stream_name_rv(RangeVar *rv)
{
	if (rv == NULL)
		return NULL;
	return stream_name(RangeVarGetRelid(rv, NoLock, true));
}

/*
 * The name of a stream whose table is in schema nsp, or NULL.  Reads
 * felix.streams, so only where the extension is installed.
 */
static const char *
stream_in_schema(Oid nsp)
{
	ListCell   *lc;

	if (!OidIsValid(nsp) || !OidIsValid(get_extension_oid("felix", true)))
		return NULL;
	foreach(lc, felix_stream_list())
	{
		FelixStream *stream = lfirst(lc);

		if (get_rel_namespace(stream->relid) == nsp)
			return stream->name;
	}
	return NULL;
}

/* ---------------------------------------------------------------------
 * Executor: UPDATE, DELETE, MERGE, ON CONFLICT, row locks
 * ---------------------------------------------------------------------
 */
static void
refuse_modify_table(PlannedStmt *stmt, ModifyTable *mt)
{
	ListCell   *lc;

	foreach(lc, mt->resultRelations)
	{
		RangeTblEntry *rte = rt_fetch(lfirst_int(lc), stmt->rtable);
		const char *name;

		if (rte->rtekind != RTE_RELATION)
			continue;
		name = stream_name(rte->relid);
		if (name == NULL)
			continue;

		switch (mt->operation)
		{
			case CMD_UPDATE:
				felix_refuse_change(name, "UPDATE", FELIX_HINT_APPEND_ONLY);
				break;
			case CMD_DELETE:
				felix_refuse_change(name, "DELETE",
									"Records in a stream are never removed one by one. "
									FELIX_HINT_RETENTION);
				break;
			case CMD_MERGE:
				felix_refuse_change(name, "MERGE",
									"Publish records with INSERT ... SELECT instead; "
									"records in a stream are never changed or removed one by one.");
				break;
			case CMD_INSERT:
				if (mt->onConflictAction != ONCONFLICT_NONE)
					felix_refuse_feature(name, "INSERT ... ON CONFLICT",
										 "Streams have no unique keys to conflict on; use a plain INSERT.");
				break;
			default:
				break;
		}
	}
}

/*
 * ModifyTable sits at the top of the statement's plan or of a
 * data-modifying CTE's subplan; walk the common container nodes anyway so
 * that a differently shaped plan is still checked.
 */
static void
refuse_plan_tree(PlannedStmt *stmt, Plan *plan)
{
	ListCell   *lc;

	if (plan == NULL)
		return;
	check_stack_depth();

	switch (nodeTag(plan))
	{
		case T_ModifyTable:
			refuse_modify_table(stmt, (ModifyTable *) plan);
			break;
		case T_Append:
			foreach(lc, ((Append *) plan)->appendplans)
				refuse_plan_tree(stmt, lfirst(lc));
			break;
		case T_MergeAppend:
			foreach(lc, ((MergeAppend *) plan)->mergeplans)
				refuse_plan_tree(stmt, lfirst(lc));
			break;
		case T_SubqueryScan:
			refuse_plan_tree(stmt, ((SubqueryScan *) plan)->subplan);
			break;
		case T_CustomScan:
			foreach(lc, ((CustomScan *) plan)->custom_plans)
				refuse_plan_tree(stmt, lfirst(lc));
			break;
		default:
			break;
	}
	refuse_plan_tree(stmt, plan->lefttree);
	refuse_plan_tree(stmt, plan->righttree);
}

static const char *
row_mark_name(RowMarkType type)
{
	switch (type)
	{
		case ROW_MARK_EXCLUSIVE:
			return "SELECT ... FOR UPDATE";
		case ROW_MARK_NOKEYEXCLUSIVE:
			return "SELECT ... FOR NO KEY UPDATE";
		case ROW_MARK_SHARE:
			return "SELECT ... FOR SHARE";
		case ROW_MARK_KEYSHARE:
			return "SELECT ... FOR KEY SHARE";
		default:
			return "row locking";
	}
}

static void
refuse_statement(PlannedStmt *stmt)
{
	ListCell   *lc;

	/* A plain SELECT has neither; skip the catalog lookups. */
	if (stmt->resultRelations == NIL && stmt->rowMarks == NIL)
		return;

	refuse_plan_tree(stmt, stmt->planTree);
	foreach(lc, stmt->subplans)
		refuse_plan_tree(stmt, lfirst(lc));

	foreach(lc, stmt->rowMarks)
	{
		PlanRowMark *rc = lfirst_node(PlanRowMark, lc);
		RangeTblEntry *rte;
		const char *name;

		/* ROW_MARK_REFERENCE/COPY only remember rows; they lock nothing. */
		if (!RowMarkRequiresRowShareLock(rc->markType))
			continue;
		rte = rt_fetch(rc->rti, stmt->rtable);
		if (rte->rtekind != RTE_RELATION)
			continue;
		name = stream_name(rte->relid);
		if (name != NULL)
			felix_refuse_change(name, row_mark_name(rc->markType),
								"Records in a stream never change, so they need no row locks; "
								"read them without FOR UPDATE or FOR SHARE.");
	}
}

static void
felix_ExecutorStart(QueryDesc *queryDesc, int eflags)
{
	if (!(eflags & EXEC_FLAG_EXPLAIN_ONLY))
		refuse_statement(queryDesc->plannedstmt);

	if (prev_ExecutorStart)
		prev_ExecutorStart(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/* ---------------------------------------------------------------------
 * Utility statements
 * ---------------------------------------------------------------------
 */
#define FELIX_HINT_FIXED_SHAPE \
	"A stream's table keeps the shape felix_create_stream gave it; create a new stream instead."
#define FELIX_HINT_SCHEMA_RECORDED \
	"The control plane records the schema of every stream, and every node keeps the stream's table there."

/* ALTER TABLE subcommands that leave a stream's columns and storage alone. */
static bool
alter_is_harmless(AlterTableType subtype)
{
	switch (subtype)
	{
		case AT_ChangeOwner:
		case AT_SetStatistics:
		case AT_SetOptions:
		case AT_ResetOptions:
		case AT_EnableTrig:
		case AT_EnableAlwaysTrig:
		case AT_EnableReplicaTrig:
		case AT_DisableTrig:
		case AT_EnableTrigAll:
		case AT_DisableTrigAll:
		case AT_EnableTrigUser:
		case AT_DisableTrigUser:
		case AT_EnableRule:
		case AT_EnableAlwaysRule:
		case AT_EnableReplicaRule:
		case AT_DisableRule:
		case AT_EnableRowSecurity:
		case AT_DisableRowSecurity:
		case AT_ForceRowSecurity:
		case AT_NoForceRowSecurity:
			return true;
		default:
			return false;
	}
}

static void
refuse_alter_table(AlterTableStmt *stmt)
{
	const char *name = stream_name_rv(stmt->relation);
	ListCell   *lc;

	foreach(lc, stmt->cmds)
	{
		AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);

		if (name == NULL)
		{
			/* Commands on other tables that would pull a stream in. */
			if (cmd->subtype == AT_SetAccessMethod && cmd->name != NULL &&
				strcmp(cmd->name, "felix") == 0)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot convert table \"%s\" into a felix stream",
								stmt->relation->relname),
						 errhint("Create a stream with felix_create_stream() and copy the rows with INSERT ... SELECT.")));
			if (cmd->subtype == AT_AttachPartition && cmd->def != NULL &&
				IsA(cmd->def, PartitionCmd))
			{
				const char *part = stream_name_rv(((PartitionCmd *) cmd->def)->name);

				if (part != NULL)
					felix_refuse_feature(part, "being a partition", FELIX_HINT_FIXED_SHAPE);
			}
			if (cmd->subtype == AT_AddInherit && cmd->def != NULL && IsA(cmd->def, RangeVar))
			{
				const char *parent = stream_name_rv((RangeVar *) cmd->def);

				if (parent != NULL)
					felix_refuse_feature(parent, "inheritance", FELIX_HINT_FIXED_SHAPE);
			}
			continue;
		}

		if (alter_is_harmless(cmd->subtype))
			continue;
		switch (cmd->subtype)
		{
			case AT_SetAccessMethod:
				felix_refuse_feature(name, "ALTER TABLE ... SET ACCESS METHOD",
									 "Copy the records into another table with INSERT ... SELECT instead.");
				break;
			case AT_SetTableSpace:
				felix_refuse_feature(name, "ALTER TABLE ... SET TABLESPACE",
									 "A stream's records live under felix.data_directory, not in a tablespace.");
				break;
			case AT_SetRelOptions:
			case AT_ResetRelOptions:
			case AT_ReplaceRelOptions:
				felix_refuse_feature(name, "storage parameters",
									 "A stream's storage is set by felix_create_stream and the felix.* settings.");
				break;
			case AT_SetLogged:
			case AT_SetUnLogged:
				felix_refuse_feature(name, "ALTER TABLE ... SET LOGGED/UNLOGGED",
									 "A stream's durability comes from its own segment log, not from WAL.");
				break;
			default:
				felix_refuse_feature(name, "ALTER TABLE that changes its columns, constraints or storage",
									 FELIX_HINT_FIXED_SHAPE);
				break;
		}
	}
}

static void
refuse_rename(RenameStmt *stmt)
{
	const char *name;

	switch (stmt->renameType)
	{
		case OBJECT_TABLE:
		case OBJECT_VIEW:
		case OBJECT_MATVIEW:
		case OBJECT_FOREIGN_TABLE:
		case OBJECT_SEQUENCE:
		case OBJECT_INDEX:
			name = stream_name_rv(stmt->relation);
			if (name != NULL)
				felix_refuse_feature(name, "RENAME",
									 "felix.streams knows the stream by its table's name; "
									 "create a stream with the new name and copy the records with INSERT ... SELECT.");
			break;
		case OBJECT_COLUMN:
		case OBJECT_ATTRIBUTE:
			name = stream_name_rv(stmt->relation);
			if (name != NULL)
				felix_refuse_feature(name, "renaming its columns", FELIX_HINT_FIXED_SHAPE);
			break;
		case OBJECT_SCHEMA:
			name = stream_in_schema(get_namespace_oid(stmt->subname, true));
			if (name != NULL)
				felix_refuse_feature(name, "renaming its schema",
									 FELIX_HINT_SCHEMA_RECORDED
									 " Move the schema's other objects to a new schema instead.");
			break;
		default:
			break;
	}
}

/*
 * Object types whose statements name a table (PostgreSQL then checks the
 * relation's kind): ALTER VIEW ... SET SCHEMA may name a stream's table too.
 */
static bool
names_table(ObjectType type)
{
	switch (type)
	{
		case OBJECT_TABLE:
		case OBJECT_VIEW:
		case OBJECT_MATVIEW:
		case OBJECT_FOREIGN_TABLE:
		case OBJECT_SEQUENCE:
			return true;
		default:
			return false;
	}
}

/* ALTER TABLE (VIEW, SEQUENCE, ...) ... SET SCHEMA naming a stream. */
static void
refuse_set_schema(AlterObjectSchemaStmt *stmt)
{
	const char *name;

	if (!names_table(stmt->objectType))
		return;
	name = stream_name_rv(stmt->relation);
	if (name != NULL)
		felix_refuse_feature(name, "ALTER TABLE ... SET SCHEMA",
							 FELIX_HINT_SCHEMA_RECORDED
							 " Create a stream in the other schema and copy the records with INSERT ... SELECT.");
}

/* ALTER EXTENSION ... ADD TABLE (VIEW, SEQUENCE, ...) naming a stream. */
static void
refuse_extension_member(AlterExtensionContentsStmt *stmt)
{
	const char *name;

	if (stmt->action <= 0 || !names_table(stmt->objtype))
		return;
	name = stream_name_rv(makeRangeVarFromNameList(castNode(List, stmt->object)));
	if (name != NULL)
		felix_refuse_feature(name, "being a member of an extension",
							 "pg_dump leaves an extension's members out and DROP TABLE will not drop one alone; "
							 "a stream travels through pg_dump with its felix label and is dropped with felix_drop_stream.");
}

/* CREATE PUBLICATION ... FOR TABLE, ALTER PUBLICATION ... ADD/SET TABLE. */
static void
refuse_publication(List *pubobjects)
{
	ListCell   *lc;

	foreach(lc, pubobjects)
	{
		PublicationObjSpec *obj = lfirst_node(PublicationObjSpec, lc);
		const char *name;

		if (obj->pubobjtype != PUBLICATIONOBJ_TABLE || obj->pubtable == NULL)
			continue;
		name = stream_name_rv(obj->pubtable->relation);
		if (name != NULL)
			felix_refuse_feature(name, "logical replication publications",
								 "A stream's records are not written to the WAL, so a publication would carry none of them; "
								 "felix replicates a stream itself (replication_factor), and a reader follows it by (shard, seq).");
	}
}

/*
 * A table created USING felix (by name, or through
 * default_table_access_method) becomes a stream when a restore labels it
 * (seclabel.c).  A stream's table has exactly the columns
 * felix_create_stream gives it, and nothing else: no parent, no type, no
 * constraint or default -- felix_publish, which writes past the executor,
 * would never check them, and a stream that is a partition or an
 * inheritance child is refused everywhere else.  felix_create_stream and
 * pg_dump create it with plain columns only.
 */
static void
refuse_felix_table(CreateStmt *stmt)
{
	const char *am = stmt->accessMethod != NULL ? stmt->accessMethod : default_table_access_method;
	const char *what = NULL;
	ListCell   *lc;

	/* a partitioned table has no access method */
	if (stmt->partspec != NULL || am == NULL || strcmp(am, "felix") != 0)
		return;
	if (stmt->inhRelations != NIL)
		what = stmt->partbound != NULL ? "as a partition" : "with a parent table (INHERITS)";
	else if (stmt->ofTypename != NULL)
		what = "as a typed table (OF)";
	else if (stmt->constraints != NIL)
		what = "with constraints";
	foreach(lc, stmt->tableElts)
	{
		Node	   *elt = lfirst(lc);

		if (what != NULL)
			break;
		if (IsA(elt, TableLikeClause))
			what = "with LIKE";
		else if (!IsA(elt, ColumnDef))
			what = "with constraints";
		else if (((ColumnDef *) elt)->constraints != NIL ||
				 ((ColumnDef *) elt)->raw_default != NULL ||
				 ((ColumnDef *) elt)->cooked_default != NULL ||
				 ((ColumnDef *) elt)->identity != '\0' ||
				 ((ColumnDef *) elt)->generated != '\0')
			what = "with column constraints, defaults or generated columns";
	}
	if (what != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot create table \"%s\" USING felix %s", stmt->relation->relname, what),
				 errdetail("A table USING felix becomes a stream when a restore labels it, and a stream's table has "
						   "just the columns felix_create_stream gives it."),
				 errhint("Create streams with felix_create_stream(); to restore one, list its columns "
						 "(shard, seq, key, payload, published_at) and nothing else.")));
}

/* ---------------------------------------------------------------------
 * Quotas follow ownership
 * ---------------------------------------------------------------------
 */
/*
 * A statement that gives a role streams: ALTER TABLE ... OWNER TO on a
 * stream, or REASSIGN OWNED from roles that own streams.  Found before the
 * statement runs (to name a stream, and to know whether there is anything
 * to check), checked after it ran.
 */
typedef struct QuotaCheck
{
	Oid			role;			/* the new owner; InvalidOid: nothing to check */
	const char *stream;			/* a stream the statement gives it */
	int			streams;		/* how many streams it gives it */
} QuotaCheck;

static void
quota_check_before(Node *parsetree, QuotaCheck *qc)
{
	ListCell   *lc;

	memset(qc, 0, sizeof(*qc));

	/*
	 * As at felix_create_stream, a superuser is not bounded: it may give a
	 * role streams past the role's quota.  A superuser that receives
	 * streams has no quota either.
	 */
	if ((!IsA(parsetree, AlterTableStmt) && !IsA(parsetree, ReassignOwnedStmt)) ||
		superuser())
		return;
	if (IsA(parsetree, AlterTableStmt))
	{
		AlterTableStmt *stmt = (AlterTableStmt *) parsetree;

		foreach(lc, stmt->cmds)
		{
			AlterTableCmd *cmd = lfirst_node(AlterTableCmd, lc);
			Oid			relid;
			Oid			role;
			const FelixStream *stream;

			if (cmd->subtype != AT_ChangeOwner)
				continue;
			relid = RangeVarGetRelid(stmt->relation, NoLock, true);
			role = get_rolespec_oid(cmd->newowner, true);
			if (stream_name(relid) == NULL || !OidIsValid(role) || superuser_arg(role) ||
				felix_relation_owner_if_any(relid) == role ||
				(stream = felix_stream_by_relid(relid)) == NULL)
				return;
			qc->role = role;
			qc->stream = pstrdup(stream->name);
			qc->streams = 1;
			return;
		}
	}
	else if (IsA(parsetree, ReassignOwnedStmt))
	{
		ReassignOwnedStmt *stmt = (ReassignOwnedStmt *) parsetree;
		Oid			role = get_rolespec_oid(stmt->newrole, true);
		List	   *from = NIL;

		if (!OidIsValid(role) || superuser_arg(role) ||
			!OidIsValid(get_extension_oid("felix", true)))
			return;
		foreach(lc, stmt->roles)
			from = lappend_oid(from, get_rolespec_oid(lfirst_node(RoleSpec, lc), true));
		foreach(lc, felix_stream_list())
		{
			FelixStream *stream = lfirst(lc);
			Oid			owner = felix_relation_owner_if_any(stream->relid);

			if (owner == role || !list_member_oid(from, owner))
				continue;
			if (qc->streams++ == 0)
				qc->stream = pstrdup(stream->name);
		}
		if (qc->streams > 0)
			qc->role = role;
	}
}

static void
quota_check_after(const QuotaCheck *qc)
{
	int64		streams_owned;
	int64		shards_owned;

	if (!OidIsValid(qc->role))
		return;
	felix_catalog_owned(qc->role, &streams_owned, &shards_owned);
	if (streams_owned > felix_max_streams_per_role)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("cannot give stream \"%s\" to role \"%s\": the role would own " INT64_FORMAT " streams",
						qc->stream, GetUserNameFromId(qc->role, false), streams_owned),
				 qc->streams > 1 ?
				 errdetail("felix.max_streams_per_role is %d; the statement gives the role %d streams.",
						   felix_max_streams_per_role, qc->streams) :
				 errdetail("felix.max_streams_per_role is %d.", felix_max_streams_per_role),
				 errhint("Drop streams the role no longer needs, or ask a superuser to raise felix.max_streams_per_role.")));
	if (shards_owned > felix_max_shards_per_role)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("cannot give stream \"%s\" to role \"%s\": the role would own " INT64_FORMAT " shards",
						qc->stream, GetUserNameFromId(qc->role, false), shards_owned),
				 errdetail("felix.max_shards_per_role is %d.", felix_max_shards_per_role),
				 errhint("Drop streams the role no longer needs, or ask a superuser to raise felix.max_shards_per_role.")));
}

static void
refuse_vacuum(VacuumStmt *stmt)
{
	bool		full = false;
	ListCell   *lc;

	if (!stmt->is_vacuumcmd)
		return;
	foreach(lc, stmt->options)
	{
		DefElem    *opt = lfirst_node(DefElem, lc);

		if (strcmp(opt->defname, "full") == 0)
			full = defGetBoolean(opt);
	}
	if (!full)
		return;

	/*
	 * Only a VACUUM FULL that names a stream is refused: a database-wide one
	 * passes over streams harmlessly (see relation_copy_for_cluster).
	 */
	foreach(lc, stmt->rels)
	{
		VacuumRelation *vrel = lfirst_node(VacuumRelation, lc);
		const char *name = stream_name_rv(vrel->relation);

		if (name != NULL)
			felix_refuse_feature(name, "VACUUM FULL",
								 "A stream has no dead rows to reclaim; its space is reclaimed by retention "
								 "(felix_create_stream's retention_bytes/retention).");
	}
}

static void
refuse_utility(Node *parsetree)
{
	const char *name;
	ListCell   *lc;

	switch (nodeTag(parsetree))
	{
		case T_TruncateStmt:
			foreach(lc, ((TruncateStmt *) parsetree)->relations)
			{
				name = stream_name_rv(lfirst_node(RangeVar, lc));
				if (name != NULL)
					felix_refuse_change(name, "TRUNCATE", FELIX_HINT_RETENTION);
			}
			break;

		case T_IndexStmt:
			name = stream_name_rv(((IndexStmt *) parsetree)->relation);
			if (name != NULL)
				felix_refuse_feature(name, "indexes",
									 "Streams are read in (shard, seq) order and seek with "
									 "WHERE shard = ... AND seq >= ...; they need no index.");
			break;

		case T_AlterTableStmt:
			refuse_alter_table((AlterTableStmt *) parsetree);
			break;

		case T_RenameStmt:
			refuse_rename((RenameStmt *) parsetree);
			break;

		case T_VacuumStmt:
			refuse_vacuum((VacuumStmt *) parsetree);
			break;

		case T_ClusterStmt:
			name = stream_name_rv(((ClusterStmt *) parsetree)->relation);
			if (name != NULL)
				felix_refuse_feature(name, "CLUSTER",
									 "A stream is always stored in (shard, seq) order.");
			break;

		case T_CreateTrigStmt:
			{
				CreateTrigStmt *stmt = (CreateTrigStmt *) parsetree;

				if (stmt->row && TRIGGER_FOR_AFTER(stmt->timing))
				{
					name = stream_name_rv(stmt->relation);
					if (name != NULL)
						felix_refuse_feature(name, "row-level AFTER triggers",
											 "Records are appended at commit and cannot be fetched back by row; "
											 "use a BEFORE ROW trigger or a statement-level trigger.");
				}
			}
			break;

		case T_RuleStmt:
			/*
			 * A rule would rewrite what reaches the stream (INSTEAD
			 * NOTHING), or, as "_RETURN" on an empty stream, turn its table
			 * into a view that no drop of felix's would ever see again.
			 */
			name = stream_name_rv(((RuleStmt *) parsetree)->relation);
			if (name != NULL)
				felix_refuse_feature(name, "rules",
									 "A stream's table is the stream itself; publish and read it directly, "
									 "or define a view over it.");
			break;

		case T_CreateStmt:
		case T_CreateForeignTableStmt:
			/* a CreateForeignTableStmt begins with its CreateStmt */
			foreach(lc, ((CreateStmt *) parsetree)->inhRelations)
			{
				name = stream_name_rv(lfirst_node(RangeVar, lc));
				if (name != NULL)
					felix_refuse_feature(name, "inheritance", FELIX_HINT_FIXED_SHAPE);
			}
			if (IsA(parsetree, CreateStmt))
				refuse_felix_table((CreateStmt *) parsetree);
			break;

		case T_AlterObjectSchemaStmt:
			refuse_set_schema((AlterObjectSchemaStmt *) parsetree);
			break;

		case T_CreatePublicationStmt:
			refuse_publication(((CreatePublicationStmt *) parsetree)->pubobjects);
			break;

		case T_AlterPublicationStmt:
			if (((AlterPublicationStmt *) parsetree)->action != AP_DropObjects)
				refuse_publication(((AlterPublicationStmt *) parsetree)->pubobjects);
			break;

		case T_AlterExtensionContentsStmt:
			refuse_extension_member((AlterExtensionContentsStmt *) parsetree);
			break;

		default:
			break;
	}
}

static void
felix_ProcessUtility(PlannedStmt *pstmt, const char *queryString,
					 bool readOnlyTree, ProcessUtilityContext context,
					 ParamListInfo params, QueryEnvironment *queryEnv,
					 DestReceiver *dest, QueryCompletion *qc)
{
	QuotaCheck	quota;

	refuse_utility(pstmt->utilityStmt);
	quota_check_before(pstmt->utilityStmt, &quota);

	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context,
							params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);

	quota_check_after(&quota);
}

void
felix_refuse_init(void)
{
	prev_ExecutorStart = ExecutorStart_hook;
	ExecutorStart_hook = felix_ExecutorStart;
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = felix_ProcessUtility;
}
