/*-------------------------------------------------------------------------
 *
 * cp_report.c
 *	  A leader's reports on its followers (felix.cp_report), accepted only
 *	  while it leads the shard at the reported generation.
 *
 *	  Report before mark: a quorum leader releases an acknowledgement only
 *	  after a report naming who holds the record has landed here (the
 *	  leader's side is replication/report.c).  So a report lands only in a
 *	  transaction that compares the shard's assignment as read -- its
 *	  leader, incarnation and generation still the reporter's -- and the
 *	  reports key itself: a superseded leader's report never lands, and a
 *	  report racing a promotion either lands before the duty holder reads
 *	  the reports or is refused.
 *
 *	  token orders one leader's calls (its monotonic clock, strictly
 *	  increasing): a stored row from the same leader and generation with a
 *	  larger token is left alone and not counted, so a call held up past a
 *	  newer one cannot undo it.  A call's reports on a shard describe its
 *	  whole replica set: a follower left out is no longer caught up (unless
 *	  its stored row is newer).  A replica move completes when the joining
 *	  node is reported caught up: the leaving node leaves the set and its
 *	  row goes.
 *
 * Locking rule: none; compare-and-set in the store.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/cp.h"
#include "control/json.h"


static bool
halt_reason_ok(const char *h)
{
	return strcmp(h, "diverged") == 0 || strcmp(h, "needs_bootstrap") == 0 ||
		strcmp(h, "fenced") == 0 || strcmp(h, "protocol") == 0;
}

static void
refuse_malformed(const char *leader, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("node \"%s\": malformed replica report: %s", leader, what),
			 errdetail("A report is an object with string stream, follower and incarnation (a uuid), non-negative integer shard, generation and acked_end, boolean caught_up, and optionally halted (diverged, needs_bootstrap, fenced or protocol; never with caught_up) and an integer position."),
			 errhint("This is felix's internal protocol; leader and control plane may run different felix versions.")));
}

int
cp_report_parse(const char *leader, const char *json, CpReportRow **rows)
{
	char		err[256];
	JsonbContainer *arr;
	int			n;

	if (leader == NULL || leader[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a reporting node name must not be NULL or empty"),
				 errhint("Pass the name of the node that leads the reported shards.")));
	arr = json ? felix_json_parse(json, strlen(json), err, sizeof(err)) : NULL;
	if (arr == NULL || !JsonContainerIsArray(arr))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("node \"%s\": reports must be a JSON array", leader),
				 errhint("Pass [{\"stream\": ..., \"shard\": ..., \"generation\": ..., \"follower\": ..., \"incarnation\": ..., \"acked_end\": ..., \"caught_up\": ..., \"halted\": ..., \"position\": ...}, ...].")));
	n = felix_json_length(arr);
	*rows = palloc0(sizeof(CpReportRow) * (n + 1));
	for (int i = 0; i < n; i++)
	{
		JsonbContainer *e = felix_json_elem_object(arr, i);
		CpReportRow *r = &(*rows)[i];
		int64		shard;

		if (e == NULL)
			refuse_malformed(leader, "an element is not an object");
		if (!felix_json_string(e, "stream", &r->stream) ||
			!felix_json_string(e, "follower", &r->follower) ||
			!felix_json_string(e, "incarnation", &r->incarnation) ||
			!cp_is_uuid(r->incarnation) ||
			!felix_json_bool(e, "caught_up", &r->caught_up) ||
			!felix_json_int64(e, "shard", &shard) ||
			!felix_json_int64(e, "generation", &r->generation) ||
			!felix_json_int64(e, "acked_end", &r->acked_end) ||
			shard < 0 || shard > PG_INT32_MAX || r->generation < 0 || r->acked_end < 0)
			refuse_malformed(leader, JsonbToCString(NULL, e, 64));
		r->shard = (int) shard;
		r->position = -1;
		if (felix_json_string(e, "halted", &r->halted))
		{
			if (!halt_reason_ok(r->halted) || r->caught_up)
				refuse_malformed(leader, JsonbToCString(NULL, e, 64));
		}
		else
			r->halted = NULL;
		if (felix_json_int64(e, "position", &r->position) && r->position < 0)
			refuse_malformed(leader, JsonbToCString(NULL, e, 64));
	}
	return n;
}

static CpReport *
find_row(CpReports *r, const char *follower)
{
	for (int i = 0; i < r->n; i++)
		if (strcmp(r->rows[i].follower, follower) == 0)
			return &r->rows[i];
	return NULL;
}

/* A stored row loses to this call's unless it is newer (same leader and generation, larger token). */
static bool
newer_than_stored(const CpReport *stored, const char *leader, int64 generation, int64 token)
{
	return stored->generation != generation || strcmp(stored->leader, leader) != 0 ||
		stored->token == 0 || token == 0 || stored->token < token;
}

/*
 * Does row say what stored does, in all a decision reads?  Only when and
 * by which call it was made differ.
 */
static bool
same_report(const CpReport *stored, const CpReport *row)
{
	return strcmp(stored->follower, row->follower) == 0 &&
		strcmp(stored->incarnation, row->incarnation) == 0 &&
		stored->generation == row->generation &&
		strcmp(stored->leader, row->leader) == 0 &&
		stored->acked_end == row->acked_end &&
		stored->caught_up == row->caught_up &&
		(stored->halted == NULL) == (row->halted == NULL) &&
		(stored->halted == NULL || strcmp(stored->halted, row->halted) == 0) &&
		stored->halted_since_ms == row->halted_since_ms &&
		stored->position == row->position;
}

static int
row_order(const void *a, const void *b, void *arg)
{
	const CpReportRow *rows = arg;
	const CpReportRow *x = &rows[*(const int *) a];
	const CpReportRow *y = &rows[*(const int *) b];
	int			c = strcmp(x->stream, y->stream);

	if (c != 0)
		return c;
	if (x->shard != y->shard)
		return x->shard < y->shard ? -1 : 1;
	return *(const int *) a - *(const int *) b;
}

/*
 * Chain the rows shard by shard: next[i] is the next row after i (in the
 * call's order) on the same shard, -1 after the last.  Returns the most
 * rows one shard has.  A leader's call names thousands of rows: looking
 * for each one's companions in all of them was quadratic.
 */
static int
chain_rows(const CpReportRow *rows, int nrows, int *next)
{
	int		   *order = palloc(sizeof(int) * (nrows + 1));
	int			most = 0;
	int			run = 0;

	for (int i = 0; i < nrows; i++)
		order[i] = i;
	qsort_arg(order, nrows, sizeof(int), row_order, (void *) rows);
	for (int k = 0; k < nrows; k++)
	{
		bool		same = k + 1 < nrows &&
			rows[order[k + 1]].shard == rows[order[k]].shard &&
			strcmp(rows[order[k + 1]].stream, rows[order[k]].stream) == 0;

		next[order[k]] = same ? order[k + 1] : -1;
		run++;
		most = Max(most, run);
		if (!same)
			run = 0;
	}
	pfree(order);
	return most;
}

int
cp_report(const char *leader, const CpReportRow *rows, int nrows, int64 token,
		  const char *incarnation)
{
	int		   *next = palloc(sizeof(int) * (nrows + 1));
	int			most = chain_rows(rows, nrows, next);
	const char **named = palloc0(sizeof(char *) * (most + 1));

	for (int attempt = 0; attempt < CP_MAX_ATTEMPTS; attempt++)
	{
		CpSnapshot	snap;
		FelixStoreCmp *cmps;
		FelixStoreOp *ops;
		int			ncmps = 0;
		int			nops = 0;
		int			accepted = 0;
		int			skipped = 0;
		bool	   *done = palloc0(sizeof(bool) * (nrows + 1));
		int64		rev;
		FelixStoreStatus st;

		CpNode	   *me;
		int64		leader_beat;

		cp_serialize();
		/*
		 * The first read may be a moment stale: the transaction compares the
		 * shard's assignment and the reports key as read, so a stale read
		 * only fails it, and the retry reads the latest.
		 */
		(void) cp_snapshot_read(&snap, attempt == 0, ERROR);
		/* the reporter's heartbeat count: how recent the report is, for promotion */
		me = cp_snapshot_node(&snap, leader);
		leader_beat = me ? me->beat : 0;
		cmps = palloc0(sizeof(FelixStoreCmp) * (2 * nrows + 2));
		ops = palloc0(sizeof(FelixStoreOp) * (2 * nrows + 2));

		/* shard by shard, in the order the call names them */
		for (int i = 0; i < nrows; i++)
		{
			const char *stream = rows[i].stream;
			int			shard = rows[i].shard;
			CpShard    *s;
			const CpReports *stored;
			CpReports	out;
			int			nnamed = 0;
			bool		changed = false;
			int64		now = cp_now_ms();
			CpStream   *def;
			bool		quorum;

			if (done[i])
				continue;
			s = cp_snapshot_shard(&snap, stream, shard);
			stored = cp_snapshot_reports(&snap, stream, shard);
			def = cp_snapshot_stream(&snap, stream);
			quorum = def != NULL && strcmp(def->consistency, "quorum") == 0;
			if (stored)
				out = *stored;
			else
				memset(&out, 0, sizeof(out));

			for (int j = i; j >= 0; j = next[j])
			{
				const CpReportRow *r = &rows[j];
				CpReport   *have;
				CpReport	row;

				done[j] = true;
				/*
				 * Compare-and-set: the reporter leads this shard at exactly the
				 * reported generation, as the incarnation it was granted to; a
				 * follower outside the replica set is not recorded.
				 */
				if (s == NULL || s->leader == NULL || strcmp(s->leader, leader) != 0 ||
					(incarnation && (s->leader_incarnation == NULL ||
									 strcmp(s->leader_incarnation, incarnation) != 0)) ||
					s->generation != r->generation ||
					!cp_shard_has_replica(s, r->follower) || strcmp(r->follower, leader) == 0)
					continue;
				named[nnamed++] = r->follower;
				have = find_row(&out, r->follower);
				if (have && !newer_than_stored(have, leader, r->generation, token))
					continue;
				memset(&row, 0, sizeof(row));
				row.follower = r->follower;
				row.incarnation = r->incarnation;
				row.generation = r->generation;
				row.leader = (char *) leader;
				row.acked_end = r->acked_end;

				/*
				 * Within one generation a follower's copy (the same
				 * incarnation) only grows; a lower acknowledged end means the
				 * reporter has not heard from it yet -- a leader restarted at
				 * its generation reports its followers before they answer.
				 * Keeping the higher end keeps the evidence the duty holder
				 * checks a returning leader's log against (leader_holds_reported
				 * in cp_duty.c; the fault harness found a leader put back from
				 * an older copy re-promoted after such reports).  Whether the
				 * follower is caught up is the new report's word.
				 */
				if (have && have->generation == r->generation &&
					strcmp(have->incarnation, r->incarnation) == 0)
					row.acked_end = Max(row.acked_end, have->acked_end);
				row.caught_up = r->caught_up;
				row.halted = r->halted;
				/* a halt is as old as the first report of it */
				row.halted_since_ms = r->halted == NULL ? 0 :
					(have && have->halted && strcmp(have->halted, r->halted) == 0 &&
					 have->generation == r->generation) ? have->halted_since_ms : now;
				row.position = r->position;
				row.token = token;
				row.leader_beat = leader_beat;
				row.reported_ms = now;

				/*
				 * A quorum shard's leader refreshes reports that did not
				 * change (report.c, QUORUM_REFRESH_INTERVALS): what the
				 * store holds already says it, and rewriting thousands of
				 * them would cost every reader of the state.  (A
				 * leader-consistency shard's report counts only when
				 * recent: leader_beat, in cp_duty.c.)
				 */
				if (have && quorum && same_report(have, &row))
				{
					accepted++;
					skipped++;
					continue;
				}
				if (have)
					*have = row;
				else if (out.n < CP_MAX_REPLICAS + 1)
					out.rows[out.n++] = row;
				accepted++;
				changed = true;
			}
			if (nnamed == 0)
				continue;

			/* the followers left out are no longer caught up */
			for (int k = 0; k < out.n; k++)
			{
				CpReport   *x = &out.rows[k];
				bool		was_named = false;

				for (int m = 0; m < nnamed; m++)
					if (strcmp(named[m], x->follower) == 0)
						was_named = true;
				if (!was_named && x->caught_up &&
					newer_than_stored(x, leader, s->generation, token))
				{
					x->caught_up = false;
					changed = true;
				}
			}

			/*
			 * A replica move completes once the joining node is reported
			 * caught up at this generation: the leaving node goes, and what
			 * was said of it.
			 */
			if (s->joining)
			{
				CpReport   *j = find_row(&out, s->joining);

				if (j && j->caught_up && j->halted == NULL && j->generation == s->generation &&
					strcmp(j->leader, leader) == 0)
				{
					CpShard		moved = *s;
					CpReports	kept = out;

					moved.nreplicas = 0;
					for (int k = 0; k < s->nreplicas; k++)
						if (strcmp(s->replicas[k], s->leaving) != 0)
							moved.replicas[moved.nreplicas++] = s->replicas[k];
					moved.joining = moved.leaving = NULL;
					kept.n = 0;
					for (int k = 0; k < out.n; k++)
						if (strcmp(out.rows[k].follower, s->leaving) != 0)
							kept.rows[kept.n++] = out.rows[k];
					out = kept;
					changed = true;
					ops[nops].key = cp_key_shard(stream, shard);
					ops[nops++].value = cp_shard_write(&moved);
					ereport(LOG,
							(errmsg("felix: stream \"%s\" shard %d: node \"%s\" replaced node \"%s\" in the replica set",
									stream, shard, s->joining, s->leaving)));
				}
			}
			if (!changed)
				continue;
			cmps[ncmps].key = cp_key_shard(stream, shard);
			cmps[ncmps++].mod_revision = s->rev;
			cmps[ncmps].key = cp_key_reports(stream, shard);
			cmps[ncmps++].mod_revision = stored ? stored->rev : 0;
			ops[nops].key = cmps[ncmps - 1].key;
			ops[nops++].value = cp_reports_write(&out);
		}
		if (nops == 0)
		{
			/*
			 * Reports taken as already there were compared with a read
			 * that may be a moment stale (the first, with etcd), and no
			 * transaction compares them: believe them only from a
			 * linearizable read.
			 */
			if (attempt == 0 && skipped > 0 && felix_store_is_etcd())
				continue;
			return accepted;
		}
		st = felix_store_txn(cmps, ncmps, ops, nops, &rev, ERROR);
		if (st == FELIX_STORE_OK)
			return accepted;
		if (st == FELIX_STORE_CONFLICT)
		{
			cp_backoff(attempt);
			continue;
		}
		ereport(ERROR,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("node \"%s\": the control-plane store did not confirm the replica reports", leader),
				 errhint("They count as not landed; the leader reports again.")));
	}
	/* counted as not landed: the leader's marks stay where they were */
	return 0;
}
