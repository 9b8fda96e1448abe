/*-------------------------------------------------------------------------
 *
 * scan.c
 *	  FelixScan: the custom scan that seeks.  A query such as
 *
 *		SELECT seq, payload FROM orders WHERE shard = 2 AND seq >= 1000
 *		 ORDER BY seq LIMIT 100
 *
 *	  must read 100 records, not scan shard 2 from its start.  The planner
 *	  hook finds, among a stream's restriction clauses, comparisons of
 *	  `shard` or `seq` with an expression that has no Vars and no volatile
 *	  functions (a Const, or a Param so prepared statements and generic
 *	  plans seek too) and offers a CustomPath that reads only the shards
 *	  and the seq range those bounds allow, sorted by (shard, seq).  At run
 *	  time the bounds are evaluated on the first fetch (so Params from
 *	  initplans have their values), clamped to each shard's visible range,
 *	  and the storage reader seeks there through the sparse index.
 *
 *	  The same path, without bounds, is offered when its (shard, seq) order
 *	  saves a sort (ORDER BY shard, seq; a merge join).  Join clauses such
 *	  as `o.shard = t.s AND o.seq = t.q` give parameterized paths, so a
 *	  nested loop looks each record up by position.  Partial paths are
 *	  removed for streams: a stream is read by one process.
 *
 *	  Bounds applied by the range are removed from the node's qual (the
 *	  range enforces them exactly); every other clause stays in the qual and
 *	  is checked by ExecScan.
 *
 * Locking rule: no locks of its own; reading goes through FelixCursor
 * (tableam.c), which reads below snapshotted high-water marks.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/nbtree.h"
#include "access/stratnum.h"
#include "access/sysattr.h"
#include "am/am.h"
#include "core/catalog.h"
#include "catalog/pg_class.h"
#include "catalog/pg_operator.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "commands/explain.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/extensible.h"
#include "nodes/makefuncs.h"
#include "nodes/nodeFuncs.h"
#include "optimizer/clauses.h"
#include "optimizer/cost.h"
#include "optimizer/optimizer.h"
#include "optimizer/pathnode.h"
#include "optimizer/planner.h"
#include "optimizer/paths.h"
#include "optimizer/restrictinfo.h"
#include "utils/lsyscache.h"
#include "utils/ruleutils.h"
#include "utils/selfuncs.h"

#define FELIX_SCAN_NAME "FelixScan"

/* ---------------------------------------------------------------------
 * Bounds: `column op expr` for column shard or seq
 * ---------------------------------------------------------------------
 */
typedef struct FelixBound
{
	AttrNumber	attno;			/* FELIX_ATTNUM_SHARD or FELIX_ATTNUM_SEQ */
	int			strategy;		/* BT*StrategyNumber, read as `column op expr` */
	Expr	   *expr;			/* no Vars, not volatile; int2, int4 or int8 */
} FelixBound;

/* The range a set of bounds allows; hi ends exclusive. */
typedef struct FelixRange
{
	int64		shard_lo;
	int64		shard_hi;
	int64		seq_lo;
	int64		seq_hi;
	bool		empty;			/* a NULL bound: nothing matches */
} FelixRange;

static void
range_init(FelixRange *r)
{
	r->shard_lo = 0;
	r->shard_hi = PG_INT64_MAX;
	r->seq_lo = 0;
	r->seq_hi = PG_INT64_MAX;
	r->empty = false;
}

/* Narrow r by `column <strategy> v`; exact for every int64 v. */
static void
range_apply(FelixRange *r, AttrNumber attno, int strategy, int64 v)
{
	int64	   *lo = (attno == FELIX_ATTNUM_SHARD) ? &r->shard_lo : &r->seq_lo;
	int64	   *hi = (attno == FELIX_ATTNUM_SHARD) ? &r->shard_hi : &r->seq_hi;

	switch (strategy)
	{
		case BTLessStrategyNumber:
			*hi = Min(*hi, v);
			break;
		case BTLessEqualStrategyNumber:
			if (v < PG_INT64_MAX)
				*hi = Min(*hi, v + 1);
			break;
		case BTEqualStrategyNumber:
			*lo = Max(*lo, v);
			if (v < PG_INT64_MAX)
				*hi = Min(*hi, v + 1);
			else
				r->empty = true;	/* no shard or seq is INT64_MAX */
			break;
		case BTGreaterEqualStrategyNumber:
			*lo = Max(*lo, v);
			break;
		case BTGreaterStrategyNumber:
			if (v < PG_INT64_MAX)
				*lo = Max(*lo, v + 1);
			else
				r->empty = true;
			break;
	}
}

static bool
range_is_empty(const FelixRange *r)
{
	return r->empty || r->shard_lo >= r->shard_hi || r->seq_lo >= r->seq_hi;
}

static int64
bound_value(Oid type, Datum d)
{
	switch (type)
	{
		case INT2OID:
			return DatumGetInt16(d);
		case INT4OID:
			return DatumGetInt32(d);
		default:
			return DatumGetInt64(d);
	}
}

static bool
is_position_var(Node *node, Index relid, AttrNumber *attno)
{
	Var		   *var;

	if (node == NULL || !IsA(node, Var))
		return false;
	var = (Var *) node;
	if (var->varno != relid || var->varlevelsup != 0)
		return false;
	if (var->varattno != FELIX_ATTNUM_SHARD && var->varattno != FELIX_ATTNUM_SEQ)
		return false;
	*attno = var->varattno;
	return true;
}

/*
 * Is clause `shard|seq op expr` (either side) with a usable expr?  The
 * expr must not depend on the stream's own row and must be stable while a
 * scan runs: no Var of this relation, no volatile function, no SubPlan.
 * Vars of other relations are allowed: they occur only in the join
 * clauses of a parameterized path, where they become nestloop Params.
 */
static bool
match_bound(PlannerInfo *root, Expr *clause, Index relid, FelixBound *out)
{
	OpExpr	   *op;
	Node	   *left;
	Node	   *right;
	Node	   *other;
	AttrNumber	attno;
	bool		commuted;
	int			strategy;
	Oid			type;

	if (!IsA(clause, OpExpr))
		return false;
	op = (OpExpr *) clause;
	if (list_length(op->args) != 2)
		return false;
	left = linitial(op->args);
	right = lsecond(op->args);

	if (is_position_var(left, relid, &attno))
	{
		other = right;
		commuted = false;
	}
	else if (is_position_var(right, relid, &attno))
	{
		other = left;
		commuted = true;
	}
	else
		return false;

	type = exprType(other);
	if (type != INT2OID && type != INT4OID && type != INT8OID)
		return false;
	if (bms_is_member(relid, pull_varnos(root, other)) ||
		contain_volatile_functions(other) || contain_subplans(other))
		return false;

	/* int2/int4/int8 comparisons, cross-type included, are one opfamily */
	strategy = get_op_opfamily_strategy(op->opno, INTEGER_BTREE_FAM_OID);
	if (strategy == 0)
		return false;
	if (commuted)
		strategy = BTCommuteStrategyNumber(strategy);

	out->attno = attno;
	out->strategy = strategy;
	out->expr = (Expr *) other;
	return true;
}

static bool
mentions_ctid(Node *clause, Index relid)
{
	Bitmapset  *attrs = NULL;

	pull_varattnos(clause, relid, &attrs);
	return bms_is_member(SelfItemPointerAttributeNumber - FirstLowInvalidHeapAttributeNumber,
						 attrs);
}

/* ---------------------------------------------------------------------
 * Planning
 * ---------------------------------------------------------------------
 */
static set_rel_pathlist_hook_type prev_set_rel_pathlist_hook = NULL;
static planner_hook_type prev_planner_hook = NULL;

/*
 * True while planning a SCROLL cursor.  The storage reader only reads
 * forward; FelixScan says so, and the planner then puts a Material node
 * on top that can go back.  A sequential scan cannot say so, so for a
 * SCROLL cursor a stream is always read through FelixScan.
 */
static bool planning_scroll = false;

static Plan *felix_plan_path(PlannerInfo *root, RelOptInfo *rel,
							 CustomPath *best_path, List *tlist,
							 List *clauses, List *custom_plans);
static Node *felix_create_state(CustomScan *cscan);

static const CustomPathMethods felix_path_methods = {
	.CustomName = FELIX_SCAN_NAME,
	.PlanCustomPath = felix_plan_path,
};

static const CustomScanMethods felix_scan_methods = {
	.CustomName = FELIX_SCAN_NAME,
	.CreateCustomScanState = felix_create_state,
};

/*
 * (shard, seq) ascending, dropping keys that are fixed: a shard pinned by
 * equality (an equivalence class with a constant), or a stream or range
 * with a single shard.  Then `WHERE shard = 2 ... ORDER BY seq` is sorted.
 *
 * Pathkeys are only built from equivalence classes the query already has
 * (create_it = false): an order no ORDER BY, GROUP BY or merge join asks
 * for is of no use.  Keys stop at the first one that cannot be built, so
 * the list never claims an order by seq alone across shards.
 */
static List *
felix_pathkeys(PlannerInfo *root, RelOptInfo *rel, bool single_shard)
{
	List	   *keys = NIL;
	List	   *pk;

	if (!single_shard)
	{
		pk = build_expression_pathkey(root,
									  (Expr *) makeVar(rel->relid, FELIX_ATTNUM_SHARD,
													   INT4OID, -1, InvalidOid, 0),
									  NULL, Int4LessOperator, rel->relids, false);
		if (pk == NIL)
			return NIL;
		if (!EC_MUST_BE_REDUNDANT(((PathKey *) linitial(pk))->pk_eclass))
			keys = lappend(keys, linitial(pk));
	}
	pk = build_expression_pathkey(root,
								  (Expr *) makeVar(rel->relid, FELIX_ATTNUM_SEQ,
												   INT8OID, -1, InvalidOid, 0),
								  NULL, Int8LessOperator, rel->relids, false);
	if (pk != NIL && !EC_MUST_BE_REDUNDANT(((PathKey *) linitial(pk))->pk_eclass))
		keys = lappend(keys, linitial(pk));
	return keys;
}

/*
 * Records the bounds let through, from the shards' shared state.  *exact
 * is set when every bound is a Const (then the count is what the scan
 * will read); Params get the planner's default selectivities.
 */
static double
estimate_range(const FelixStream *stream, RelOptInfo *rel, List *bounds,
			   bool *exact, double *shards_touched, bool *single_shard,
			   double *range_bytes)
{
	FelixRange r;
	ListCell   *lc;
	bool		shard_param_eq = false;
	bool		shard_param_other = false;
	bool		seq_param_eq = false;
	bool		seq_param_lo = false;
	bool		seq_param_hi = false;
	double		avg_records;
	double		avg_record_bytes;
	double		rows = 0;
	double		bytes = 0;
	double		touched = 0;
	int64		lo;
	int64		hi;

	range_init(&r);
	*exact = true;
	foreach(lc, bounds)
	{
		FelixBound *b = lfirst(lc);

		if (IsA(b->expr, Const))
		{
			Const	   *c = (Const *) b->expr;

			if (c->constisnull)
				r.empty = true;
			else
				range_apply(&r, b->attno, b->strategy,
							bound_value(c->consttype, c->constvalue));
			continue;
		}
		*exact = false;
		if (b->attno == FELIX_ATTNUM_SHARD)
		{
			if (b->strategy == BTEqualStrategyNumber)
				shard_param_eq = true;
			else
				shard_param_other = true;
		}
		else
		{
			if (b->strategy == BTEqualStrategyNumber)
				seq_param_eq = true;
			else if (b->strategy == BTGreaterStrategyNumber ||
					 b->strategy == BTGreaterEqualStrategyNumber)
				seq_param_lo = true;
			else
				seq_param_hi = true;
		}
	}

	lo = Max(r.shard_lo, 0);
	hi = Min(r.shard_hi, (int64) stream->shards);
	*single_shard = (stream->shards == 1) ||
		(!shard_param_eq && !shard_param_other && hi - lo <= 1);
	*range_bytes = 0;
	if (range_is_empty(&r) || lo >= hi)
	{
		*shards_touched = 0;
		return 0;
	}

	avg_records = rel->tuples / Max(stream->shards, 1);
	avg_record_bytes = 128;
	for (int64 i = lo; i < hi; i++)
	{
		uint64		start;
		uint64		end;
		uint64		shard_bytes;
		double		per_record;
		double		s_lo;
		double		s_hi;

		if (!felix_am_shard_stats(stream, (int) i, &start, &end, &shard_bytes) ||
			end <= start)
		{
			start = 0;
			end = (uint64) avg_records;
			per_record = avg_record_bytes;
		}
		else
			per_record = (double) shard_bytes / (end - start);
		s_lo = Max((double) start, (double) r.seq_lo);
		s_hi = Min((double) end, (double) r.seq_hi);
		if (s_hi > s_lo)
		{
			rows += s_hi - s_lo;
			bytes += (s_hi - s_lo) * per_record;
		}
		touched += 1;
	}

	avg_record_bytes = (rows > 0) ? bytes / rows : avg_record_bytes;
	if (shard_param_eq)
	{
		rows /= touched;
		touched = 1;
	}
	else if (shard_param_other)
	{
		rows *= DEFAULT_INEQ_SEL;
		touched = Max(1, touched * DEFAULT_INEQ_SEL);
	}
	if (seq_param_eq)
		rows = Min(rows, touched);
	else if (seq_param_lo && seq_param_hi)
		rows *= DEFAULT_RANGE_INEQ_SEL;
	else if (seq_param_lo || seq_param_hi)
		rows *= DEFAULT_INEQ_SEL;

	*shards_touched = touched;
	*range_bytes = rows * avg_record_bytes;
	return rows;
}

/*
 * Build one FelixScan path: unparameterized (ppi NULL) from the
 * restriction clauses, or parameterized by the outer relations of ppi,
 * whose join clauses then bound the range once per outer row.  Returns
 * NULL when the path would be pointless: no bound and no useful order
 * (unless `always`).
 */
static CustomPath *
felix_make_path(PlannerInfo *root, RelOptInfo *rel, const FelixStream *stream,
				ParamPathInfo *ppi, bool always)
{
	List	   *bounds = NIL;
	List	   *others = NIL;
	bool		join_bound = false;
	ListCell   *lc;
	List	   *clauses;
	List	   *pathkeys;
	bool		exact;
	bool		single_shard;
	double		range_rows;
	double		touched;
	double		range_bytes;
	QualCost	qcost;
	CustomPath *cpath;
	Cost		startup;
	Cost		run;

	clauses = rel->baserestrictinfo;
	if (ppi != NULL)
		clauses = list_concat_copy(clauses, ppi->ppi_clauses);

	foreach(lc, clauses)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);
		FelixBound	b;

		if (rinfo->pseudoconstant)
			continue;
		if (match_bound(root, rinfo->clause, rel->relid, &b))
		{
			bounds = lappend(bounds, memcpy(palloc(sizeof(FelixBound)), &b, sizeof(b)));
			if (foreach_current_index(lc) >= list_length(rel->baserestrictinfo))
				join_bound = true;
		}
		else
		{
			/*
			 * Records have no ctid; a filter on it would silently match
			 * nothing (or everything), so refuse it.
			 */
			if (mentions_ctid((Node *) rinfo->clause, rel->relid))
				felix_refuse_feature(stream->name, "ctid lookups",
									 FELIX_HINT_READ_BY_POSITION);
			others = lappend(others, rinfo);
		}
	}

	range_rows = estimate_range(stream, rel, bounds, &exact, &touched, &single_shard,
								&range_bytes);
	pathkeys = (rel->reloptkind == RELOPT_BASEREL) ?
		felix_pathkeys(root, rel, single_shard) : NIL;

	if (ppi != NULL)
	{
		/* only worth it when a join clause bounds the range */
		if (!join_bound)
			return NULL;
	}
	else if (bounds == NIL && !always &&
			 (pathkeys == NIL || truncate_useless_pathkeys(root, rel, pathkeys) == NIL))
		return NULL;

	/*
	 * With only Const bounds the range's size is known exactly; use it for
	 * the relation's row estimate (every unparameterized path of a relation
	 * shares it) instead of the default selectivities of `seq >= c`.
	 */
	if (ppi == NULL && exact && bounds != NIL && rel->reloptkind == RELOPT_BASEREL)
	{
		double		rows;

		rows = clamp_row_est(range_rows *
							 clauselist_selectivity(root, others, rel->relid,
													JOIN_INNER, NULL));
		rel->rows = rows;
		foreach(lc, rel->pathlist)
		{
			Path	   *path = lfirst(lc);

			if (path->param_info == NULL)
				path->rows = rows;
		}
	}

	/*
	 * Cost: the range's bytes read in order and per-record CPU for the row
	 * and the remaining quals, plus one seek per shard touched (a sparse
	 * index lookup and a first read, priced as one page: the sequential
	 * scan is charged at least a page per shard too, see
	 * relation_estimate_size).  A parameterized path is costed per outer
	 * row, as index scans are.
	 *
	 * The seek is charged to the run cost, not the startup cost, so that
	 * under a LIMIT the planner compares like with like: a sequential scan
	 * looks cheap to start because the planner assumes matching rows are
	 * spread evenly, whereas in a stream every row before the range would
	 * have to be read first.  With the seek in the run cost, this path's
	 * startup and total are both below the sequential scan's whenever the
	 * range is a part of the stream, so `... seq >= c LIMIT n` seeks.
	 */
	cost_qual_eval(&qcost, extract_actual_clauses(others, false), root);
	startup = qcost.startup + rel->reltarget->cost.startup;
	run = touched * seq_page_cost +
		seq_page_cost * range_bytes / BLCKSZ +
		(cpu_tuple_cost + qcost.per_tuple + rel->reltarget->cost.per_tuple) * range_rows;

	cpath = makeNode(CustomPath);
	cpath->path.pathtype = T_CustomScan;
	cpath->path.parent = rel;
	cpath->path.pathtarget = rel->reltarget;
	cpath->path.param_info = ppi;
	cpath->path.parallel_aware = false;
	cpath->path.parallel_safe = false;
	cpath->path.parallel_workers = 0;
	cpath->path.rows = ppi ? ppi->ppi_rows : rel->rows;
	cpath->path.startup_cost = startup;
	cpath->path.total_cost = startup + run;
	cpath->path.pathkeys = pathkeys;
	cpath->flags = 0;
	cpath->custom_paths = NIL;
	cpath->custom_private = NIL;
	cpath->methods = &felix_path_methods;
	return cpath;
}

/* generate_implied_equalities_for_column callback: is em our column? */
static bool
ec_member_is_column(PlannerInfo *root, RelOptInfo *rel, EquivalenceClass *ec,
					EquivalenceMember *em, void *arg)
{
	AttrNumber	want = *(AttrNumber *) arg;
	AttrNumber	attno;

	return is_position_var((Node *) em->em_expr, rel->relid, &attno) && attno == want;
}

/*
 * The sets of outer relations whose join clauses could bound shard or seq:
 * `o.seq = t.seq` (an equivalence class), `o.seq >= t.x` (a plain join
 * clause).  Each set gets one parameterized path, for nested loops that
 * look records up by position.
 */
static List *
felix_outer_candidates(PlannerInfo *root, RelOptInfo *rel)
{
	List	   *result = NIL;
	List	   *clauses = NIL;
	ListCell   *lc;
	static const AttrNumber columns[] = {FELIX_ATTNUM_SHARD, FELIX_ATTNUM_SEQ};

	foreach(lc, rel->joininfo)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);
		FelixBound	b;

		if (!rinfo->pseudoconstant && join_clause_is_movable_to(rinfo, rel) &&
			match_bound(root, rinfo->clause, rel->relid, &b))
			clauses = lappend(clauses, rinfo);
	}
	for (int i = 0; i < lengthof(columns); i++)
	{
		AttrNumber	attno = columns[i];

		clauses = list_concat(clauses,
							  generate_implied_equalities_for_column(root, rel,
																	 ec_member_is_column,
																	 &attno,
																	 rel->lateral_referencers));
	}

	foreach(lc, clauses)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);
		Relids		outer = bms_difference(rinfo->clause_relids, rel->relids);
		ListCell   *lc2;
		bool		seen = false;

		if (bms_is_empty(outer) || bms_overlap(outer, rel->lateral_referencers))
			continue;
		foreach(lc2, result)
		{
			if (bms_equal(lfirst(lc2), outer))
				seen = true;
		}
		if (!seen)
			result = lappend(result, outer);
	}
	return result;
}

static void
felix_set_rel_pathlist(PlannerInfo *root, RelOptInfo *rel, Index rti,
					   RangeTblEntry *rte)
{
	const FelixStream *found;
	FelixStream stream;
	CustomPath *cpath;
	ListCell   *lc;

	if (prev_set_rel_pathlist_hook)
		prev_set_rel_pathlist_hook(root, rel, rti, rte);

	if (rte->rtekind != RTE_RELATION || rte->relkind != RELKIND_RELATION || rte->inh)
		return;
	if (rel->reloptkind != RELOPT_BASEREL && rel->reloptkind != RELOPT_OTHER_MEMBER_REL)
		return;
	if (!felix_uses_felix_am_relid(rte->relid))
		return;

	/* A stream is read by one process: no partial paths, nothing parallel. */
	rel->partial_pathlist = NIL;
	rel->consider_parallel = false;
	foreach(lc, rel->pathlist)
		((Path *) lfirst(lc))->parallel_safe = false;

	found = felix_stream_by_relid(rte->relid);
	if (found == NULL)
		return;
	stream = *found;

	/*
	 * A relation that must be parameterized by lateral references gets
	 * only the core's paths, which know how to carry them.
	 */
	if (!bms_is_empty(rel->lateral_relids))
		return;

	cpath = felix_make_path(root, rel, &stream, NULL, planning_scroll);
	if (cpath != NULL)
	{
		/* a SCROLL cursor reads streams only through FelixScan (see above) */
		if (planning_scroll)
			rel->pathlist = NIL;
		add_path(rel, &cpath->path);
	}

	if (rel->reloptkind == RELOPT_BASEREL)
	{
		foreach(lc, felix_outer_candidates(root, rel))
		{
			ParamPathInfo *ppi = get_baserel_parampathinfo(root, rel, lfirst(lc));

			cpath = felix_make_path(root, rel, &stream, ppi, false);
			if (cpath != NULL)
				add_path(rel, &cpath->path);
		}
	}
}

/*
 * The plan keeps the bound expressions in custom_exprs (so setrefs and
 * parameter bookkeeping see them) and, in custom_private, one pair of
 * Integer nodes (attno, strategy) per bound, in the same order.
 */
static Plan *
felix_plan_path(PlannerInfo *root, RelOptInfo *rel, CustomPath *best_path,
				List *tlist, List *clauses, List *custom_plans)
{
	CustomScan *cscan = makeNode(CustomScan);
	List	   *quals = NIL;
	List	   *exprs = NIL;
	List	   *kinds = NIL;
	ListCell   *lc;

	foreach(lc, clauses)
	{
		RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc);
		FelixBound	b;

		/* pseudoconstant clauses become a gating Result above us */
		if (rinfo->pseudoconstant)
			continue;
		if (match_bound(root, rinfo->clause, rel->relid, &b))
		{
			exprs = lappend(exprs, copyObject(b.expr));
			kinds = lappend(kinds, makeInteger(b.attno));
			kinds = lappend(kinds, makeInteger(b.strategy));
		}
		else
			quals = lappend(quals, rinfo->clause);
	}

	cscan->scan.plan.targetlist = tlist;
	cscan->scan.plan.qual = quals;
	cscan->scan.scanrelid = rel->relid;
	cscan->flags = best_path->flags;
	cscan->custom_plans = NIL;
	cscan->custom_exprs = exprs;
	cscan->custom_private = kinds;
	cscan->custom_scan_tlist = NIL;
	cscan->methods = &felix_scan_methods;
	return &cscan->scan.plan;
}

/* ---------------------------------------------------------------------
 * Execution
 * ---------------------------------------------------------------------
 */
typedef struct FelixScanState
{
	CustomScanState css;
	FelixStream stream;
	int			nbounds;
	AttrNumber *attnos;
	int		   *strategies;
	Oid		   *types;
	ExprState **states;
	bool		needed[FELIX_NATTS];
	bool		evaluated;		/* range holds this (re)scan's bounds */
	FelixRange	range;
	FelixCursor *cursor;
} FelixScanState;

static void felix_begin(CustomScanState *node, EState *estate, int eflags);
static TupleTableSlot *felix_exec(CustomScanState *node);
static void felix_end(CustomScanState *node);
static void felix_rescan(CustomScanState *node);
static void felix_explain(CustomScanState *node, List *ancestors, ExplainState *es);

static const CustomExecMethods felix_exec_methods = {
	.CustomName = FELIX_SCAN_NAME,
	.BeginCustomScan = felix_begin,
	.ExecCustomScan = felix_exec,
	.EndCustomScan = felix_end,
	.ReScanCustomScan = felix_rescan,
	.ExplainCustomScan = felix_explain,
};

static Node *
felix_create_state(CustomScan *cscan)
{
	FelixScanState *fss = palloc0(sizeof(FelixScanState));

	NodeSetTag(fss, T_CustomScanState);
	fss->css.flags = cscan->flags;
	fss->css.methods = &felix_exec_methods;
	return (Node *) fss;
}

static void
felix_begin(CustomScanState *node, EState *estate, int eflags)
{
	FelixScanState *fss = (FelixScanState *) node;
	CustomScan *cscan = (CustomScan *) node->ss.ps.plan;
	Index		scanrelid = cscan->scan.scanrelid;
	Bitmapset  *attrs = NULL;
	bool		whole_row;
	ListCell   *lc;
	int			i;

	felix_am_stream(node->ss.ss_currentRelation, &fss->stream);

	fss->nbounds = list_length(cscan->custom_exprs);
	if (list_length(cscan->custom_private) != 2 * fss->nbounds)
		elog(ERROR, "FelixScan plan has %d bound kinds for %d bounds",
			 list_length(cscan->custom_private) / 2, fss->nbounds);
	fss->attnos = palloc0(sizeof(AttrNumber) * Max(fss->nbounds, 1));
	fss->strategies = palloc0(sizeof(int) * Max(fss->nbounds, 1));
	fss->types = palloc0(sizeof(Oid) * Max(fss->nbounds, 1));
	fss->states = palloc0(sizeof(ExprState *) * Max(fss->nbounds, 1));
	i = 0;
	foreach(lc, cscan->custom_exprs)
	{
		Expr	   *expr = lfirst(lc);

		fss->attnos[i] = intVal(list_nth(cscan->custom_private, 2 * i));
		fss->strategies[i] = intVal(list_nth(cscan->custom_private, 2 * i + 1));
		fss->types[i] = exprType((Node *) expr);
		fss->states[i] = ExecInitExpr(expr, &node->ss.ps);
		i++;
	}

	/* Fill only the columns the plan reads: the targetlist and the qual. */
	pull_varattnos((Node *) cscan->scan.plan.targetlist, scanrelid, &attrs);
	pull_varattnos((Node *) cscan->scan.plan.qual, scanrelid, &attrs);
	whole_row = bms_is_member(InvalidAttrNumber - FirstLowInvalidHeapAttributeNumber, attrs);
	for (i = 0; i < FELIX_NATTS; i++)
		fss->needed[i] = whole_row ||
			bms_is_member(i + 1 - FirstLowInvalidHeapAttributeNumber, attrs);

	fss->evaluated = false;
	fss->cursor = NULL;
}

/* Evaluate the bounds for this (re)scan and point the cursor at the range. */
static void
felix_evaluate(FelixScanState *fss)
{
	ExprContext *econtext = fss->css.ss.ps.ps_ExprContext;
	FelixRange	r;

	range_init(&r);
	for (int i = 0; i < fss->nbounds; i++)
	{
		bool		isnull;
		Datum		d;

		d = ExecEvalExprSwitchContext(fss->states[i], econtext, &isnull);
		/* comparisons with NULL are never true */
		if (isnull)
			r.empty = true;
		else
			range_apply(&r, fss->attnos[i], fss->strategies[i],
						bound_value(fss->types[i], d));
	}
	fss->range = r;
	fss->evaluated = true;

	if (fss->cursor == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fss->css.ss.ps.state->es_query_cxt);

		fss->cursor = felix_cursor_begin(&fss->stream);
		felix_cursor_set_columns(fss->cursor, fss->needed);
		MemoryContextSwitchTo(old);
	}

	if (range_is_empty(&r) || r.shard_lo >= fss->stream.shards)
		felix_cursor_set_range(fss->cursor, 0, 0, 0, 0);
	else
		felix_cursor_set_range(fss->cursor,
							   (int32) r.shard_lo,
							   (int32) Min(r.shard_hi, (int64) fss->stream.shards),
							   (uint64) r.seq_lo, (uint64) r.seq_hi);
}

static TupleTableSlot *
felix_next(ScanState *ss)
{
	FelixScanState *fss = (FelixScanState *) ss;

	if (!fss->evaluated)
		felix_evaluate(fss);
	felix_cursor_next(fss->cursor, ss->ss_ScanTupleSlot);
	return ss->ss_ScanTupleSlot;
}

/* Every row comes straight from the log: nothing to recheck. */
static bool
felix_recheck(ScanState *ss, TupleTableSlot *slot)
{
	return true;
}

static TupleTableSlot *
felix_exec(CustomScanState *node)
{
	return ExecScan(&node->ss, (ExecScanAccessMtd) felix_next,
					(ExecScanRecheckMtd) felix_recheck);
}

static void
felix_rescan(CustomScanState *node)
{
	FelixScanState *fss = (FelixScanState *) node;

	/* Params may have changed: evaluate again on the next fetch. */
	fss->evaluated = false;
	ExecScanReScan(&node->ss);
}

static void
felix_end(CustomScanState *node)
{
	FelixScanState *fss = (FelixScanState *) node;

	if (fss->cursor != NULL)
	{
		felix_cursor_end(fss->cursor);
		fss->cursor = NULL;
	}
}

/* ---------------------------------------------------------------------
 * EXPLAIN: "Shard: 2", "Seq Range: [1000, 1100)"
 *
 * Ranges are shown as [lo, hi) with hi exclusive; "start" and "hwm" stand
 * for the shard's first visible seq and its high-water mark.  Before the
 * bounds are evaluated (plain EXPLAIN of a generic plan), non-constant
 * bounds are shown as expressions.
 * ---------------------------------------------------------------------
 */
static char *
combine_side(List *items, const char *func, const char *none)
{
	StringInfoData buf;
	ListCell   *lc;

	if (items == NIL)
		return pstrdup(none);
	if (list_length(items) == 1)
		return linitial(items);
	initStringInfo(&buf);
	appendStringInfo(&buf, "%s(", func);
	foreach(lc, items)
	{
		if (foreach_current_index(lc) > 0)
			appendStringInfoString(&buf, ", ");
		appendStringInfoString(&buf, (char *) lfirst(lc));
	}
	appendStringInfoChar(&buf, ')');
	return buf.data;
}

static void
explain_column(FelixScanState *fss, AttrNumber attno, List *dpcontext, ExplainState *es)
{
	CustomScan *cscan = (CustomScan *) fss->css.ss.ps.plan;
	FelixRange	r;
	bool		any = false;
	bool		all_const = true;
	bool		has_lo = false;
	bool		has_hi = false;
	bool		const_lo = false;
	bool		const_hi = false;
	int			neq = 0;
	int			n = 0;
	List	   *lo_txt = NIL;
	List	   *hi_txt = NIL;
	int64		lo;
	int64		hi;
	bool		is_shard = (attno == FELIX_ATTNUM_SHARD);
	char	   *lo_s;
	char	   *hi_s;

	range_init(&r);
	for (int i = 0; i < fss->nbounds; i++)
	{
		Expr	   *expr = list_nth(cscan->custom_exprs, i);
		int			s = fss->strategies[i];
		bool		lower = (s == BTGreaterStrategyNumber || s == BTGreaterEqualStrategyNumber ||
							 s == BTEqualStrategyNumber);
		bool		upper = (s == BTLessStrategyNumber || s == BTLessEqualStrategyNumber ||
							 s == BTEqualStrategyNumber);

		if (fss->attnos[i] != attno)
			continue;
		any = true;
		n++;
		if (s == BTEqualStrategyNumber)
			neq++;
		has_lo |= lower;
		has_hi |= upper;
		if (IsA(expr, Const))
		{
			Const	   *c = (Const *) expr;

			if (c->constisnull)
				r.empty = true;
			else
				range_apply(&r, attno, s, bound_value(c->consttype, c->constvalue));
			const_lo |= lower;
			const_hi |= upper;
		}
		else
		{
			char	   *txt = deparse_expression((Node *) expr, dpcontext, false, false);

			all_const = false;
			if (lower)
				lo_txt = lappend(lo_txt, s == BTGreaterStrategyNumber ?
								 psprintf("%s + 1", txt) : txt);
			if (upper)
				hi_txt = lappend(hi_txt, s == BTLessStrategyNumber ?
								 txt : psprintf("%s + 1", txt));
		}
	}
	if (!any)
		return;

	if (fss->evaluated)
	{
		/* the values this scan actually used */
		r = fss->range;
		all_const = true;
	}

	lo = is_shard ? r.shard_lo : r.seq_lo;
	hi = is_shard ? r.shard_hi : r.seq_hi;

	if (all_const)
	{
		if (r.empty || lo >= hi)
		{
			ExplainPropertyText(is_shard ? "Shards" : "Seq Range", "empty", es);
			return;
		}
		if (is_shard && hi == lo + 1)
		{
			ExplainPropertyText("Shard", psprintf(INT64_FORMAT, lo), es);
			return;
		}
		lo_s = has_lo ? psprintf(INT64_FORMAT, lo) : pstrdup(is_shard ? "0" : "start");
		if (!has_hi || hi == PG_INT64_MAX)
			hi_s = is_shard ? psprintf("%d", fss->stream.shards) : pstrdup("hwm");
		else
			hi_s = psprintf(INT64_FORMAT, hi);
	}
	else
	{
		if (is_shard && n == 1 && neq == 1)
		{
			ExplainPropertyText("Shard", (char *) linitial(lo_txt), es);
			return;
		}
		if (const_lo)
			lo_txt = lcons(psprintf(INT64_FORMAT, lo), lo_txt);
		if (const_hi && hi != PG_INT64_MAX)
			hi_txt = lcons(psprintf(INT64_FORMAT, hi), hi_txt);
		lo_s = combine_side(lo_txt, "greatest", is_shard ? "0" : "start");
		hi_s = combine_side(hi_txt, "least",
							is_shard ? psprintf("%d", fss->stream.shards) : "hwm");
	}
	ExplainPropertyText(is_shard ? "Shards" : "Seq Range",
						psprintf("[%s, %s)", lo_s, hi_s), es);
}

static void
felix_explain(CustomScanState *node, List *ancestors, ExplainState *es)
{
	FelixScanState *fss = (FelixScanState *) node;
	List	   *dpcontext;

	dpcontext = set_deparse_context_plan(es->deparse_cxt, node->ss.ps.plan, ancestors);
	explain_column(fss, FELIX_ATTNUM_SHARD, dpcontext, es);
	explain_column(fss, FELIX_ATTNUM_SEQ, dpcontext, es);
	if (es->analyze && fss->cursor != NULL)
		ExplainPropertyUInteger("Records Read", NULL, felix_cursor_records(fss->cursor), es);
}

static PlannedStmt *
felix_planner(Query *parse, const char *query_string, int cursorOptions,
			  ParamListInfo boundParams)
{
	bool		saved = planning_scroll;
	PlannedStmt *result;

	planning_scroll = (cursorOptions & CURSOR_OPT_SCROLL) != 0;
	PG_TRY();
	{
		if (prev_planner_hook)
			result = prev_planner_hook(parse, query_string, cursorOptions, boundParams);
		else
			result = standard_planner(parse, query_string, cursorOptions, boundParams);
	}
	PG_FINALLY();
	{
		planning_scroll = saved;
	}
	PG_END_TRY();
	return result;
}

void
felix_scan_init(void)
{
	RegisterCustomScanMethods(&felix_scan_methods);
	prev_set_rel_pathlist_hook = set_rel_pathlist_hook;
	set_rel_pathlist_hook = felix_set_rel_pathlist;
	prev_planner_hook = planner_hook;
	planner_hook = felix_planner;
}
