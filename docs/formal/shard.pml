/*
 * shard.pml -- a Promela model of ONE replicated felix shard.
 *
 * Three nodes, each with a copy of the shard's log; a lease per
 * generation; the leader's write path; shipping to the two followers and
 * their answers; replica reports to the control plane and the quorum mark
 * they gate; the publishers waiting on that mark; lease expiry; promotion
 * at the next generation by the control plane; truncation of an unadopted
 * tail on a follower; deposition of an old leader; crashes.  Every
 * proctype and inline is named after the C function that carries out the
 * step, with the file it lives in.  docs/formal/README.md explains what is
 * abstracted and why.
 *
 * Properties (assertions; the tag after each assert names it):
 *   P1 "acknowledged survives": a record a publisher was told is
 *      acknowledged is held, at the same seq with the same content
 *      (generation, id), by every node that leads, with a live lease, the
 *      record's generation or a later one -- in every state -- and,
 *      durably, by the node the control plane promotes, at the moment it
 *      promotes it.
 *   P2 "no acknowledgement without a live lease at the writer's
 *      generation": the acknowledged word (acked_generation, acked_end)
 *      passes a record only while the node moving it holds a live lease at
 *      the record's generation and no later generation has been granted;
 *      and a publisher returns success only for a record so passed.
 *   P3 "writes are fenced": no record is appended at generation G once
 *      the control plane has granted G+1.
 *   T  no truncation cuts at or below the truncating node's mark.
 *   S  "a mark shows one history" (with -DSERVED): below any node's mark,
 *      leader or follower, its log holds what the marks of the leaders
 *      passed at each seq -- one record per seq, whoever moved the mark --
 *      in every state.  A follower that shows its readers a record of its
 *      own that no leader adopted breaks it (docs/reliability.md, bugs 4
 *      and 12).  Not with the restore fault: a copy put back may lose a
 *      record no publisher was told of, which P1 allows.
 *
 * Bounds (-D): NREC publishes (record ids 1..NREC, so logs of NREC seqs),
 * generations up to MAXGEN, at most MAXCRASH node crashes per run.
 * REPORT_WINDOW keeps a report, and then its answer, in flight across
 * other steps (see README).  SEVERAL_SHARDS: the node leads other shards
 * too and reports them in the same request, so a request goes out even
 * when this shard's part names no follower; consider_slot leaves such a
 * part out of the request (no rows, not queued), so its landing changes
 * nothing for this shard -- as with one shard per node, where no request
 * without rows is sent.  README "Findings" 5.
 *
 * Variants (-D), each expected to FAIL:
 *   BROKEN_REPORT_ORDER       the mark moves, and releases publishers, as
 *                             soon as a majority holds the records, before
 *                             any report naming who holds them has landed.
 *   BROKEN_WAITER_GENERATION  a waiting publisher trusts the high-water
 *                             mark alone, without checking that this node,
 *                             at its generation, moved it.
 *                             (ONLY_P1 silences P2 at the publisher, to let
 *                             the search reach the record actually lost.)
 *   OLD_TAIL_TRUSTED          (with SERVED) the code before bugs 4 and 12
 *                             were fixed: a follower whose log ends at or
 *                             before where the shipment begins appends it
 *                             at its tail without the record before being
 *                             compared.
 * Guard deletions (mutation tests, also expected to FAIL):
 *   NO_LEASE_AT_MARK          may_release ignores the lease.
 *   NO_RECHECK                leader_publish skips lease_recheck.
 *   PROMOTE_ANY               the control plane promotes any follower of
 *                             the newest reporting generation, caught up
 *                             or not, in no particular order.
 * Expected to PASS (shows a rule P1 does not rest on):
 *   ANY_CAUGHT_UP             any follower reported caught up, not the
 *                             furthest ahead first.
 * The restore fault (README "Findings" 1 and 6):
 *   RESTORE_FAULT             the node the assignment names may come back
 *                             from an older copy of its data directory
 *                             (same identity, a shorter durable prefix).
 *   RESTORE_TAKEN_ONLY        (with RESTORE_FAULT) only once the
 *                             generation's lease was claimed;
 *   RESTORE_UNTAKEN_ONLY      ... only between a grant and its first claim.
 * The code before the changes that closed findings 2 and 5 (each fails):
 *   OLD_NO_REPAIR_AT_ZERO     divergence_droppable never drops from seq 0:
 *                             the follower halts (with PROBE_REPAIR_AT_ZERO).
 *   OLD_CONFIRM_WITHOUT_ROWS  (with SEVERAL_SHARDS) a shard's part naming no
 *                             follower is queued, and its landing confirms
 *                             the shard with nobody caught up.
 * The code before the changes that closed finding 1 (each fails with
 * RESTORE_FAULT):
 *   OLD_REPORT_WITHOUT_LEASE  consider_slot reports for a leader without a
 *                             live lease.
 *   OLD_CLAIM_WITHOUT_CHECK   the first claim of a generation compares
 *                             nothing (neither acked_floor nor grant_end).
 *   OLD_LEADER_CHECK_REPORTS_ONLY  leader_holds_reported compares the
 *                             leader's log end with acked_floor and the
 *                             reports only, not with caught-up followers'.
 * The code before the changes that closed finding 6 (each fails with
 * RESTORE_FAULT):
 *   OLD_CLAIM_FLOOR_ONLY      (C8 undone) the first claim compares the
 *                             claimer's log end with acked_floor only, not
 *                             with grant_end, its log end at the grant.
 *   OLD_RESTARTED_LEADER_UNCHECKED  (C9 undone) no restarted_leader_check:
 *                             a lapsed leader started again since it took
 *                             its generation is judged like any other.
 * What-if, not the C code (README "Findings" 6; expected to PASS):
 *   GRANT_BOOT                every grant records grant_boot, the
 *                             grantee's boot; while the generation is
 *                             untaken, restarted_leader_check exempts a
 *                             grantee still in that boot (the code counts
 *                             every grantee that has not claimed as
 *                             started again).
 * Promotion by log (cp_duty.c, copies_candidate; README "Promotion by
 * log"), part of the implemented design:
 *   OLD_NO_BY_LOG             the code before it: a shard with no caught-up
 *                             row and no qualifying leader stays unplaced.
 *   RESTORE_ANY_NODE          (with RESTORE_FAULT) any node, not only the
 *                             one the assignment names, may come back from
 *                             an older copy, once in a run (two copies put
 *                             back can take a record from both holders of
 *                             it: no rule recovers that); its rows are no
 *                             longer believed caught up (void_reports in
 *                             cp_heartbeat.c).
 * Guard deletions of promotion by log (each expected to FAIL):
 *   BY_LOG_ANY_COPY           copies count whatever their token: a copy
 *                             restarted (or put back) since the generation
 *                             was taken counts as having kept its log;
 *   BY_LOG_NEED_ONE           one counted copy is enough, not n - n/2;
 *   BY_LOG_NOT_PAST_TAKEN     the newest counted log need not reach the
 *                             leader's log when it took the generation;
 *   BY_LOG_TOKENS_AT_GRANT    a grant records the copies' tokens anew, so
 *                             a generation granted and never taken counts
 *                             the copies kept since its grant, not since
 *                             the last generation taken.
 * Restrictions, not felix, that leave out some paths, so the runs can
 * show what each change closes on the paths it is meant for (README
 * "Findings" 1 and 6):
 *   MARKS_REPORTED            the mark moves without a report only up to
 *                             the largest acknowledged end the control
 *                             plane's rows of its generation hold;
 *   MARKS_WITNESSED           ... only while the control plane holds a
 *                             caught-up row of its generation for a
 *                             follower that holds the mark;
 *   CAUGHT_UP_ALIVE           every follower the newest reports call caught
 *                             up is alive when the shard is considered (by
 *                             default any may be not alive, and is skipped);
 *   CAUGHT_UP_HEARD           ... and gave its log end in a heartbeat since
 *                             the lapse (by default: in its last one).
 * Probe (README "Findings" 2):
 *   PROBE_REPAIR_AT_ZERO      asserts that no divergence the design's
 *                             repair rule allows is answered 'conflict'
 *                             (tag R); the implemented rule is the design's,
 *                             so it can fail only with OLD_NO_REPAIR_AT_ZERO.
 */

#ifndef NREC
#define NREC     2      /* publishes, record ids 1..NREC */
#endif
#ifndef MAXGEN
#define MAXGEN   2      /* generations 1..MAXGEN */
#endif
#ifndef MAXCRASH
#define MAXCRASH 0      /* node crashes (restarts) in one run */
#endif

#define NN       3
#define MAXLOG   NREC   /* a log never holds more seqs than records exist */
#define NONE     255

#define FOLLOWER 0
#define LEADER   1

/* a record's content: the generation it was written at and its id */
#define ENC(g,id)  ((g)*4+(id))
#define GEN_OF(c)  ((c)/4)

/* answers of felix.replicate, as the leader's ship worker sees them */
#define A_NONE     0
#define A_STORED   1
#define A_GAP      2
#define A_CONFLICT 3
#define A_FENCED   4
#define A_REFUSED  5    /* an error: 55F02, 55F04, 42501, genmap refusal */

/* a replica report request, as report.c / cp_report.c see it */
#define M_NONE     0
#define M_INNET    1    /* sent, fate unknown */
#define M_LANDED   2    /* committed, its answer on its way back (REPORT_WINDOW) */

/* publishers */
#define W_IDLE     0
#define W_WAITING  1
#define W_ACKED    2
#define W_FAILED   3

#define LOG(n,s)   logc[(n)*MAXLOG+(s)]
#define GM(n,g)    gm[(n)*(MAXGEN+1)+(g)]
#define IX(n,f)    ((n)*NN+(f))

/* ---------------- per node: the shard's storage and lease ---------------- */
byte logc[NN*MAXLOG];       /* content per seq, 0 = none */
byte wend[NN];              /* written end (next_seq) */
byte flushed[NN];           /* durable end */
byte hwm[NN];               /* high-water mark this node knows */
byte gm[NN*(MAXGEN+1)];     /* generation map: first seq of each generation, NONE if absent */
byte role[NN];
byte gen[NN];               /* generation the node knows */
byte lknown[NN];            /* the leader it knows for gen, NONE if none */
bit  live[NN];              /* lease live by this node's own clock (lease_live_locked) */
bit  took[NN];              /* this boot claimed the current generation */
byte ackg[NN];              /* acked_generation (quorum.c) */
byte acke[NN];              /* acked_end */
byte boot[NN];

/* ---------------- per leader n, per follower f: ship.c / state.c ---------------- */
byte fack[NN*NN];           /* follower's acknowledged end */
bit  answered[NN*NN];
bit  halted[NN*NN];
byte ans[NN*NN];            /* answer on its way back, A_* */
byte anseq[NN*NN];

/* ---------------- per leader: report.c ---------------- */
bit  conf[NN];              /* a report of this leadership has landed */
bit  infl[NN];              /* in_flight */
bit  lastc[NN*NN];          /* last landed row says caught up */
bit  doubt[NN*NN];          /* a row saying caught up was sent, not seen to land */
byte mst[NN];               /* the request's fate, M_* */
byte mgen[NN];
byte mmark[NN];             /* the mark riding on it, 0 if none */
bit  mpres[NN*NN];
bit  mcaught[NN*NN];
byte macked[NN*NN];

/* ---------------- control plane: assignment and stored reports ---------------- */
byte cp_gen = 1;
byte cp_leader = 0;
bit  cp_taken = 1;          /* the generation's lease was claimed by some boot */
byte cp_floor = 0;          /* acked_floor: what every later leader must hold */
bit  rpres[NN];             /* a row for follower f exists */
byte rgen[NN];
byte racked[NN];
bit  rcaught[NN];
byte ncrash = 0;
#ifdef RESTORE_ANY_NODE
bit  restored = 0;          /* a copy was put back in this run */
#endif
#if defined(CAUGHT_UP_ALIVE) && !defined(CAUGHT_UP_HEARD)
byte hbend[NN];             /* the log end node n's last heartbeat of this boot gave (0: none) */
#endif
#if !defined(OLD_CLAIM_WITHOUT_CHECK) && !defined(OLD_CLAIM_FLOOR_ONLY)
#define C8_GRANT_END
byte cp_gend = 0;           /* grant_end: the grantee's log end at the grant, until the first claim */
#endif
#if defined(GRANT_BOOT) && !defined(OLD_RESTARTED_LEADER_UNCHECKED)
#define C9_GRANT_BOOT
bit  cp_gboot = 0;          /* what-if: grant_boot is the grantee's current boot (set at the
                             * grant, cleared when the grantee restarts, until the first claim) */
#endif

#ifndef OLD_NO_BY_LOG
#define BY_LOG
/* what the claim that took the generation recorded (note_taken_copies in
 * cp_heartbeat.c): the leader's log then (end, last generation) and each
 * replica's copy token -- here its boot: the model's copies are begun anew
 * only by a restart (shard_open_locked) */
byte cp_tend = 0;
byte cp_tlg = 0;
byte cp_tok[NN];
bit  cp_tokset[NN];
byte cp_glg = 0;            /* grant_last_generation: the grantee's at the grant */
#endif

/* ---------------- ghosts for the properties ---------------- */
byte wst[NREC+1];
byte w_node[NREC+1];
byte w_gen[NREC+1];
byte w_seq[NREC+1];
bit  released[NREC+1];      /* the acknowledged word passed it under a live lease */
#ifdef SERVED
byte cmt[MAXLOG];           /* per seq, the record a leader's mark passed (0: none yet) */
#endif

/* scratch, not part of the state */
hidden byte t_i, t_j, t_s, t_g, t_lg, t_mg, t_mm, t_stop, t_from, t_se, t_hp, t_a, t_b, t_c, t_mark, t_best, t_newest, t_rep;
hidden byte t_ok;
hidden byte t_bylog;           /* consider chose by log */

/* ===================================================================== */

/* the generation of the last durable record, 0 if none: what a heartbeat
 * gives with the log end (agent_held_ends) */
#define LASTGEN(n)  (flushed[n] > 0 -> GEN_OF(LOG(n, flushed[n]-1)) : 0)

/* log.last_generation: the generation of the last record, 0 if none */
inline log_last_generation(n, res) {
	if
	:: wend[n] > 0 -> res = GEN_OF(LOG(n, wend[n]-1))
	:: else -> res = 0
	fi
}

/* the newest generation the map holds, 0 if none (genmap.c) */
inline genmap_last(n, res) {
	res = 0;
	t_j = 1;
	do
	:: t_j <= MAXGEN -> if :: GM(n, t_j) != NONE -> res = t_j :: else -> skip fi; t_j++
	:: else -> break
	od
}

/* genmap_note (genmap.c): append (g, s) unless it is there; refuse going back */
inline genmap_note(n, g, s, ok) {
	genmap_last(n, t_mg);
	ok = 1;
	if
	:: t_mg == g -> skip
	:: t_mg != g && (t_mg > g || (t_mg > 0 && s < GM(n, t_mg))) -> ok = 0
	:: else -> GM(n, g) = s
	fi
}

/* shard_advance_hwm (shard.c) without a condition */
inline shard_advance_hwm(n, v) {
	if
	:: v > hwm[n] && v <= flushed[n] -> hwm[n] = v
	:: else -> skip
	fi
}

/* shard_truncate_to_locked (shard.c), log_truncate_to (truncate.c) and
 * genmap_truncate: keep [0, cut); cut 0 empties the log */
inline shard_truncate_to_locked(n, cut) {
	assert(cut >= hwm[n]);    /* T: no cut at or below the mark (log_truncate_to refuses) */
	t_j = cut;
	do
	:: t_j < wend[n] -> LOG(n, t_j) = 0; t_j++
	:: else -> break
	od;
	wend[n] = cut;
	if :: flushed[n] > cut -> flushed[n] = cut :: else -> skip fi;
	t_j = 1;
	do
	:: t_j <= MAXGEN -> if :: GM(n, t_j) != NONE && GM(n, t_j) >= cut -> GM(n, t_j) = NONE :: else -> skip fi; t_j++
	:: else -> break
	od
}

/* a node that no longer leads keeps no follower state: ship_scan (ship.c)
 * clears the slot at its next pass, and answers to it are dropped */
inline repl_state_clear(n) {
	t_j = 0;
	do
	:: t_j < NN ->
		fack[IX(n,t_j)] = 0; answered[IX(n,t_j)] = 0; halted[IX(n,t_j)] = 0;
		ans[IX(n,t_j)] = A_NONE; anseq[IX(n,t_j)] = 0;
		lastc[IX(n,t_j)] = 0; doubt[IX(n,t_j)] = 0;
		t_j++
	:: else -> break
	od;
	conf[n] = 0
}

/* repl_state_reset (state.c; ship.c at a new generation) and
 * consider_slot's reset (report.c): a new leadership starts with no
 * follower state and no report confirmed; the fresh cursor
 * (fresh_cursor_fn) is computed where it is used, in felix_replicate */
inline repl_state_reset(n) {
	repl_state_clear(n)
}

/* a report request that is over leaves nothing behind */
inline report_forget(n) {
	mst[n] = M_NONE; mgen[n] = 0; mmark[n] = 0;
	t_j = 0;
	do
	:: t_j < NN -> mpres[IX(n,t_j)] = 0; mcaught[IX(n,t_j)] = 0; macked[IX(n,t_j)] = 0; t_j++
	:: else -> break
	od
}

#define WAITS1(x) (wst[1] == W_WAITING && w_node[1] == (x))
#if NREC == 1
#define WAITS_ON(x) (WAITS1(x))
#elif NREC == 2
#define WAITS_ON(x) (WAITS1(x) || (wst[2] == W_WAITING && w_node[2] == (x)))
#else
#define WAITS_ON(x) (WAITS1(x) || (wst[2] == W_WAITING && w_node[2] == (x)) || (wst[3] == W_WAITING && w_node[3] == (x)))
#endif

/* Model reduction: the acknowledged word of a node that does not lead is
 * read only by publishers still waiting there; with none, forget it */
inline ack_word_gc(n) {
	if
	:: role[n] != LEADER && !WAITS_ON(n) -> ackg[n] = 0; acke[n] = 0
	:: else -> skip
	fi
}

/* ----------------------------- properties ----------------------------- */

/* node x leads, with a live lease, generation g or a later one */
#define LEADS_SINCE(x, g)   (role[x] == LEADER && live[x] && gen[x] >= (g))
/* node x holds record id at its seq, below end[x] (wend or flushed) */
#define HOLDS(x, id, end)   (w_seq[id] < end[x] && LOG(x, w_seq[id]) == ENC(w_gen[id], id))

/* P1, in every state: every node leading, with a live lease, a
 * generation at or after an acknowledged record's holds it at its seq */
inline acked_survive() {
	t_i = 1;
	do
	:: t_i <= NREC ->
		if
		:: wst[t_i] == W_ACKED ->
			t_j = 0;
			do
			:: t_j < NN ->
				assert(!LEADS_SINCE(t_j, w_gen[t_i]) || HOLDS(t_j, t_i, wend));   /* P1: every state */
				t_j++
			:: else -> break
			od
		:: else -> skip
		fi;
		t_i++
	:: else -> break
	od
}

#ifdef SERVED
/* S, in every state: below each node's mark, the records the marks passed */
inline marks_show_one_history() {
	t_i = 0;
	do
	:: t_i < NN ->
		t_j = 0;
		do
		:: t_j < hwm[t_i] -> assert(LOG(t_i, t_j) == cmt[t_j]); t_j++   /* S: every state */
		:: else -> break
		od;
		t_i++
	:: else -> break
	od
}
#endif

/* P1 at a promotion: the chosen node holds, durably, every acknowledged record */
inline holds_every_acked(b) {
	t_i = 1;
	do
	:: t_i <= NREC ->
		assert(wst[t_i] != W_ACKED || HOLDS(b, t_i, flushed));   /* P1: at promotion */
		t_i++
	:: else -> break
	od
}

/* ======================= lease.c ======================= */

/* lease_step_down_locked (lease.c): a newer generation exists; stop leading,
 * forget the lease and the leader; every waiter wakes (and fails) */
inline lease_step_down(n) {
	role[n] = FOLLOWER;
	live[n] = 0;
	lknown[n] = NONE;
	repl_state_clear(n);
	ack_word_gc(n)
}

/* ======================= quorum.c ======================= */

#ifdef SERVED
/* S's ghost: the records a leader's mark passes, one per seq */
inline note_marked(n, mark) {
	t_i = 0;
	do
	:: t_i < mark ->
		assert(cmt[t_i] == 0 || cmt[t_i] == LOG(n, t_i));   /* S: at the mark */
		cmt[t_i] = LOG(n, t_i);
		t_i++
	:: else -> break
	od
}
#else
#define note_marked(n, mark)  skip
#endif

/* quorum_release with may_release (quorum.c) and shard_advance_hwm
 * (shard.c): this leadership, under its live lease, moves the mark and
 * its acknowledged word together */
inline quorum_release(n, g, mark) {
	if
	:: mark > hwm[n] && mark <= flushed[n] &&
#ifdef NO_LEASE_AT_MARK
	   role[n] == LEADER && gen[n] == g ->
#else
	   live[n] && role[n] == LEADER && gen[n] == g ->
#endif
		hwm[n] = mark;
		ackg[n] = g;
		acke[n] = mark;
		printf("MSC: node %d moves its quorum mark to %d at generation %d\n", n, mark, g);
		note_marked(n, mark);
		/* P2: the lease is live, at the records' generation, and no
		 * successor generation exists */
		assert(cp_gen == g);    /* P2: at the mark */
		t_i = 1;
		do
		:: t_i <= NREC ->
			if
			:: wst[t_i] == W_WAITING && w_node[t_i] == n && w_gen[t_i] == g && w_seq[t_i] < mark ->
				released[t_i] = 1
			:: else -> skip
			fi;
			t_i++
		:: else -> break
		od
	:: else -> skip
	fi
}

/* ======================= leader.c: the write path ======================= */

/* leader_publish (leader.c): lease_admit, then under the tail lease_recheck
 * and shard_append_locked, then (the group flush is the node's) the wait
 * in quorum_acknowledge */
proctype leader_publish(byte id) {
	byte n, g, b, s;

	/* lease_admit (lease.c): a node holding a live lease; remember G */
end_admit:
	atomic {
		/* Model reduction: publishers are admitted in id order (the ids
		 * are symmetric; README explains why this loses nothing) */
		(id == 1 || wst[id-1] != W_IDLE) ->
		if
		:: role[0] == LEADER && live[0] -> n = 0
		:: role[1] == LEADER && live[1] -> n = 1
		:: role[2] == LEADER && live[2] -> n = 2
		fi;
		g = gen[n];
		b = boot[n]
	}

	/* shard_lock_tail; lease_recheck (lease.c); shard_append_locked (storage).
	 * One step: the time between the re-check and the bytes is what
	 * felix.lease_epsilon covers (README). */
	atomic {
		if
#ifdef NO_RECHECK
		:: boot[n] == b && wend[n] < MAXLOG ->
#else
		:: boot[n] == b && role[n] == LEADER && live[n] && gen[n] == g && wend[n] < MAXLOG ->
#endif
			s = wend[n];
			LOG(n, s) = ENC(g, id);
			wend[n]++;
#if MAXCRASH == 0
			flushed[n] = wend[n];   /* no crash: the flush's timing is invisible */
#endif
			printf("MSC: node %d appends record %d at seq %d, generation %d\n", n, id, s, g);
			/* P3: nothing is written at G once G+1 exists */
			assert(cp_gen == g);    /* P3: write fenced */
			w_node[id] = n; w_gen[id] = g; w_seq[id] = s;
			wst[id] = W_WAITING
		:: else ->
			wst[id] = W_FAILED      /* 55F02 / 55F03 (or a full model log) */
		fi
	}

	/* quorum_acknowledge (quorum.c): released only on this leadership's own
	 * word; a leadership that moved first is 55F02 */
end_wait:
	atomic {
#ifdef BROKEN_WAITER_GENERATION
		(wst[id] == W_FAILED || boot[n] != b || hwm[n] > s || role[n] != LEADER || gen[n] != g) ->
		if
		:: wst[id] == W_FAILED -> skip      /* refused at the append */
		:: wst[id] != W_FAILED && boot[n] == b && hwm[n] > s ->
#else
		(wst[id] == W_FAILED || boot[n] != b || (ackg[n] == g && acke[n] > s) || role[n] != LEADER || gen[n] != g) ->
		if
		:: wst[id] == W_FAILED -> skip      /* refused at the append */
		:: wst[id] != W_FAILED && boot[n] == b && ackg[n] == g && acke[n] > s ->
#endif
			/* P2: only a record its node passed under a live lease at G */
#ifndef ONLY_P1
			assert(released[id]);    /* P2: at the publisher */
#endif
			printf("MSC: publisher of record %d (node %d, seq %d, generation %d) is told: acknowledged\n", id, n, s, g);
			wst[id] = W_ACKED
		:: else ->
			printf("MSC: publisher of record %d fails (55F02 or crash)\n", id);
			wst[id] = W_FAILED      /* 55F02, or the node crashed */
		fi;
		/* Model reduction: what nothing reads any more is forgotten */
		if
		:: wst[id] == W_FAILED -> w_node[id] = 0; w_gen[id] = 0; w_seq[id] = 0; released[id] = 0
		:: else -> skip
		fi;
		ack_word_gc(n);
		n = 0; g = 0; b = 0; s = 0
	}
}

/* ============ append.c / rules.c: the follower's side of a shipment ============ */

/* The cursor, folded in: a follower whose log ends before the shipment
 * answers 'gap', and the leader ships again from the record before its
 * tail (gap_resume, rules.c); one whose log ends where the shipment
 * begins appends it only after a last record of the shipment's first
 * record's generation, and otherwise answers 'gap' at its tail, with the
 * same result (replicate_decide, step 8).  Either way the record before
 * the tail is compared.  OLD_TAIL_TRUSTED: from the tail, unchecked. */
#ifdef OLD_TAIL_TRUSTED
#define TAIL_UNCHECKED(n, f)  (t_from > wend[f])
#define TAIL_RESUME(f)        (wend[f])
#else
#define TAIL_UNCHECKED(n, f)  (t_from > wend[f] || \
	(t_from == wend[f] && t_from < wend[n] && t_lg != GEN_OF(LOG(n, t_from))))
#define TAIL_RESUME(f)        (wend[f] > 0 -> wend[f] - 1 : 0)
#endif
/* felix_replicate (append.c) with replicate_decide (rules.c),
 * gather_facts, divergence_droppable and append_shipped, called by
 * leader n for follower f with the batches [cursor, written end) */
inline felix_replicate(n, f) {
	t_g = gen[n];
	/* the cursor: where this generation began, one record below
	 * (fresh_cursor_fn), or before the follower's tail (above) */
	t_from = (GM(n, gen[n]) != NONE && GM(n, gen[n]) > 0 -> GM(n, gen[n]) - 1 : 0);
	log_last_generation(f, t_lg);
	if :: TAIL_UNCHECKED(n, f) -> t_from = TAIL_RESUME(f) :: else -> skip fi;
	t_se = wend[n];
	t_hp = (hwm[n] < t_se -> hwm[n] : t_se);     /* Min(hwm_end, sent_end) */
	if
	:: t_g < gen[f] ->
		/* 2. a superseded leader stores or discards nothing */
		ans[IX(n,f)] = A_FENCED; anseq[IX(n,f)] = wend[f]
	:: else ->
		if
		:: role[f] == LEADER ->
			/* 3. we lead: a newer generation deposes us (55F04); ours is refused */
			if
			:: t_g > gen[f] -> lease_step_down(f);
				printf("MSC: node %d learns of generation %d from a shipment and steps down\n", f, t_g)
			:: else -> skip
			fi;
			ans[IX(n,f)] = A_REFUSED
		:: else ->
			if
			:: t_g > gen[f] || lknown[f] != n ->
				/* 4. only the leader we know for this generation ships */
				ans[IX(n,f)] = A_REFUSED
			:: else ->
				if
				:: t_from > wend[f] ->
					/* 6. we lack what comes before */
					ans[IX(n,f)] = A_GAP; anseq[IX(n,f)] = wend[f]
				:: else ->
					/* compare the overlap */
					t_mm = NONE;
					t_s = t_from;
					do
					:: t_s < wend[f] && t_s < t_se ->
						if
						:: LOG(f, t_s) != LOG(n, t_s) -> t_mm = t_s; break
						:: else -> t_s++
						fi
					:: else -> break
					od;
					if
					:: t_mm != NONE ->
						/* 7. divergence_droppable: a newer generation's batch,
						 * at or after where our last generation began, above
						 * our mark (replicate_decide); from seq 0 too, which
						 * empties the log (shard_truncate_to_locked) */
						log_last_generation(f, t_lg);
						if
#ifdef OLD_NO_REPAIR_AT_ZERO
						/* the code before 6fe9809: never from seq 0 (cut == 0) */
						:: t_mm > 0 && GEN_OF(LOG(n, t_mm)) > t_lg && t_lg > 0 &&
#else
						:: GEN_OF(LOG(n, t_mm)) > t_lg && t_lg > 0 &&
#endif
						   GM(f, t_lg) != NONE && t_mm >= GM(f, t_lg) && t_mm >= hwm[f] ->
							printf("MSC: node %d drops its records from seq %d (unadopted)\n", f, t_mm);
							shard_truncate_to_locked(f, t_mm);
							ans[IX(n,f)] = A_GAP; anseq[IX(n,f)] = t_mm
						:: else ->
#ifdef PROBE_REPAIR_AT_ZERO
							/* probe, not felix: would replication.md's rule -- newer
							 * generation, at or after where ours began, above the
							 * mark -- have dropped what the code halts on? */
							assert(!(t_mm == 0 && GEN_OF(LOG(n, t_mm)) > t_lg && t_lg > 0 && GM(f, t_lg) != NONE && t_mm >= GM(f, t_lg) && t_mm >= hwm[f]));    /* R: design would repair */
#endif
							ans[IX(n,f)] = A_CONFLICT; anseq[IX(n,f)] = t_mm
						fi
					:: else ->
						/* 8. append_shipped: what we lack, noting new generations */
						t_stop = NONE;
						t_ok = 1;
						t_s = wend[f];
						do
						:: t_s < t_se ->
							log_last_generation(f, t_lg);
							if
							:: GEN_OF(LOG(n, t_s)) > t_lg ->
								genmap_last(f, t_mg);
								if
								:: GEN_OF(LOG(n, t_s)) < t_mg -> t_stop = t_s; break
								:: GEN_OF(LOG(n, t_s)) > t_mg ->
									genmap_note(f, GEN_OF(LOG(n, t_s)), t_s, t_ok);
									if :: !t_ok -> break :: else -> skip fi
								:: else -> skip
								fi
							:: else -> skip
							fi;
							LOG(f, t_s) = LOG(n, t_s);
							wend[f]++;
							t_s++
						:: else -> break
						od;
						if
						:: !t_ok ->
							/* an error: the whole call is cut back (shard_cut_back) */
							do
							:: wend[f] > flushed[f] -> wend[f]--; LOG(f, wend[f]) = 0
							:: else -> break
							od;
							ans[IX(n,f)] = A_REFUSED
						:: else ->
							/* durable before the answer */
							flushed[f] = wend[f];
							if
							:: t_stop != NONE ->
								t_a = (t_hp < t_stop -> t_hp : t_stop);
								shard_advance_hwm(f, t_a);
								ans[IX(n,f)] = A_CONFLICT; anseq[IX(n,f)] = t_stop
							:: else ->
								shard_advance_hwm(f, t_hp);
								printf("MSC: node %d stores up to %d from node %d (generation %d); its mark is %d\n", f, t_se, n, t_g, hwm[f]);
								ans[IX(n,f)] = A_STORED; anseq[IX(n,f)] = t_se
							fi
						fi
					fi
				fi
			fi
		fi
	fi
}

/* ============ report.c: the quorum mark and the rows of a report ============ */

/* quorum_mark_joint / quorum_mark (rules.c) and the rows consider_slot
 * (report.c) builds: majority-th largest of {leader's durable end, each
 * answering, non-halted follower's acknowledged end}, never past the
 * leader's durable end; caught up = acked_end >= Max(hwm_end, mark) */
inline quorum_mark(n) {
	t_a = flushed[n];
	t_b = ((answered[IX(n,(n+1)%NN)] && !halted[IX(n,(n+1)%NN)]) -> fack[IX(n,(n+1)%NN)] : NONE);
	t_c = ((answered[IX(n,(n+2)%NN)] && !halted[IX(n,(n+2)%NN)]) -> fack[IX(n,(n+2)%NN)] : NONE);
	if
	:: t_b == NONE && t_c == NONE -> t_mark = 0
	:: t_b != NONE && t_c == NONE -> t_mark = (t_a < t_b -> t_a : t_b)
	:: t_b == NONE && t_c != NONE -> t_mark = (t_a < t_c -> t_a : t_c)
	:: t_b != NONE && t_c != NONE ->
		/* the median of three */
		if
		:: (t_a >= t_b && t_a <= t_c) || (t_a <= t_b && t_a >= t_c) -> t_mark = t_a
		:: (t_b >= t_a && t_b <= t_c) || (t_b <= t_a && t_b >= t_c) -> t_mark = t_b
		:: else -> t_mark = t_c
		fi
	fi;
	if :: t_mark > flushed[n] -> t_mark = flushed[n] :: else -> skip fi
}

/* report_still_true (report.c), with may_believe_caught_up: every follower
 * the control plane may take for caught up holds everything below mark */
inline report_still_true(n, mark, res) {
	res = conf[n];
	t_j = 0;
	do
	:: t_j < NN ->
		if
		:: t_j != n && (doubt[IX(n,t_j)] || lastc[IX(n,t_j)]) &&
		   !(answered[IX(n,t_j)] && fack[IX(n,t_j)] >= mark) -> res = 0
		:: else -> skip
		fi;
		t_j++
	:: else -> break
	od
}

/* apply_answer (ship.c): the follower's answer moves its cursor and
 * acknowledged end, halts it, or deposes this node */
inline apply_answer(n, f) {
	if
	:: role[n] == LEADER ->
		if
		:: ans[IX(n,f)] == A_STORED ->
			fack[IX(n,f)] = anseq[IX(n,f)];
			answered[IX(n,f)] = 1
		:: ans[IX(n,f)] == A_GAP ->
			if :: fack[IX(n,f)] > anseq[IX(n,f)] -> fack[IX(n,f)] = anseq[IX(n,f)] :: else -> skip fi
		:: ans[IX(n,f)] == A_CONFLICT ->
			halted[IX(n,f)] = 1
		:: ans[IX(n,f)] == A_FENCED ->
			/* the follower is at a newer generation: deposed, at once */
			halted[IX(n,f)] = 1;
			printf("MSC: node %d hears 'fenced' from node %d and steps down\n", n, f);
			lease_step_down(n)
		:: ans[IX(n,f)] == A_REFUSED -> skip
		fi
	:: else -> skip     /* the shard moved on since it was sent */
	fi;
	ans[IX(n,f)] = A_NONE; anseq[IX(n,f)] = 0
}

/* finish_request (report.c): the request is over.  Landed and seen to
 * land: only now may the publishers waiting on the mark be released, and
 * the rows become what the control plane believes.  Otherwise (refused,
 * lost, or landed after the connection failed) the doubts stay. */
inline finish_request(n, landed) {
	if
	:: landed ->
		if :: mmark[n] > 0 -> quorum_release(n, mgen[n], mmark[n]) :: else -> skip fi;
		if
		:: role[n] == LEADER && gen[n] == mgen[n] ->
			conf[n] = 1;
			t_j = 0;
			do
			:: t_j < NN -> lastc[IX(n,t_j)] = mcaught[IX(n,t_j)]; doubt[IX(n,t_j)] = 0; t_j++
			:: else -> break
			od
		:: else -> skip
		fi
	:: else ->
		printf("MSC: node %d does not see its report land (refused, lost or unconfirmed)\n", n)
	fi;
	infl[n] = 0;
	report_forget(n)
}

/* consider_slot (report.c), first half: the mark moves at once when the
 * standing report is still true of it */
inline consider_slot(n) {
	quorum_mark(n);
#ifdef BROKEN_REPORT_ORDER
	/* the acknowledgement does not wait for the control plane */
	t_ok = 1;
#else
	report_still_true(n, t_mark, t_ok);
#endif
#ifdef MARKS_REPORTED
	/* assumption, not felix: only up to what the control plane's rows of
	 * this generation say a follower acknowledged */
	t_a = 0;
	t_j = 0;
	do
	:: t_j < NN -> if :: rpres[t_j] && rgen[t_j] == gen[n] && racked[t_j] > t_a -> t_a = racked[t_j] :: else -> skip fi; t_j++
	:: else -> break
	od;
	t_ok = (t_ok && t_mark <= t_a);
#endif
#ifdef MARKS_WITNESSED
	/* assumption, not felix: only while the control plane holds a
	 * caught-up row of this generation for a follower that holds it */
	t_a = 0;
	t_j = 0;
	do
	:: t_j < NN ->
		if
		:: t_j != n && rpres[t_j] && rgen[t_j] == gen[n] && rcaught[t_j] &&
		   answered[IX(n,t_j)] && fack[IX(n,t_j)] >= t_mark -> t_a = 1
		:: else -> skip
		fi;
		t_j++
	:: else -> break
	od;
	t_ok = (t_ok && t_a);
#endif
	if
	:: t_ok && t_mark > hwm[n] -> quorum_release(n, gen[n], t_mark)
	:: else -> skip
	fi
}

/* cp_report (cp_report.c): a report lands only while its sender leads the
 * shard at its generation; followers it leaves out are no longer caught up
 * (a report naming none leaves the rows alone: felix sends no such part
 * any more; OLD_CONFIRM_WITHOUT_ROWS does, riding with other shards' rows) */
inline cp_report(n) {
	if
	:: cp_leader == n && cp_gen == mgen[n] ->
		if
		:: mpres[IX(n,0)] || mpres[IX(n,1)] || mpres[IX(n,2)] ->
			t_j = 0;
			do
			:: t_j < NN ->
				if
				:: t_j != n && mpres[IX(n,t_j)] ->
					/* within a generation a stored acknowledged end is
					 * never lowered; caught up is the new report's word */
					if
					:: !(rpres[t_j] && rgen[t_j] == mgen[n] && racked[t_j] > macked[IX(n,t_j)]) ->
						racked[t_j] = macked[IX(n,t_j)]
					:: else -> skip
					fi;
					rpres[t_j] = 1; rgen[t_j] = mgen[n]; rcaught[t_j] = mcaught[IX(n,t_j)]
				:: else ->
					rcaught[t_j] = 0
				fi;
				t_j++
			:: else -> break
			od
		:: else -> skip
		fi;
		printf("MSC: the report of node %d lands\n", n);
#ifdef REPORT_WINDOW
		mst[n] = M_LANDED       /* the answer, later (control_plane) */
#else
		/* the leader sees it land, or its connection fails first */
		if
		:: true -> finish_request(n, 1)
		:: true -> finish_request(n, 0)
		fi
#endif
	:: else ->
		finish_request(n, 0)
	fi
}

/* cp_heartbeat (control/cp_heartbeat.c), the claim: the node the
 * assignment names claims its generation's lease; the first claim of a
 * generation records the boot, and only that boot claims it again.  The
 * first claim is made only with a log, as this heartbeat gives it, that
 * ends at or after Max(acked_floor, grant_end) -- the shard's floor (C3)
 * and the claimer's own log end at the grant (C8); otherwise nothing is
 * claimed, the grant lapses unclaimed, and consider looks again.  The
 * heartbeat's end is the node's durable end now (README: the real one can
 * only be lower, or unknown, which claims nothing) */
#if defined(OLD_CLAIM_WITHOUT_CHECK)
/* the code before C3: the first claim compares nothing */
#define CLAIM_HOLDS(n)  (1)
#elif defined(OLD_CLAIM_FLOOR_ONLY)
/* the code before C8: acked_floor only */
#define CLAIM_HOLDS(n)  (cp_floor == 0 || flushed[n] >= cp_floor)
#elif defined(BY_LOG)
/* ... and the generation of its last record is at least the grant's
 * (holds_granted_generation) */
#define CLAIM_HOLDS(n)  (flushed[n] >= (cp_floor > cp_gend -> cp_floor : cp_gend) && LASTGEN(n) >= cp_glg)
#else
#define CLAIM_HOLDS(n)  (flushed[n] >= (cp_floor > cp_gend -> cp_floor : cp_gend))
#endif
#ifdef BY_LOG
/* note_taken_copies (cp_heartbeat.c): the first claim records the
 * claimer's log and every copy's token.  (The C reads each follower's
 * token from its last heartbeat before the claim, which can only be
 * older: a copy restarted since then no longer matches.) */
#define NOTE_TAKEN(n) \
	cp_tend = flushed[n]; cp_tlg = LASTGEN(n); \
	cp_tok[0] = boot[0]; cp_tok[1] = boot[1]; cp_tok[2] = boot[2]; \
	cp_tokset[0] = 1; cp_tokset[1] = 1; cp_tokset[2] = 1
#else
#define NOTE_TAKEN(n)  skip
#endif
#ifdef C8_GRANT_END
/* (model reduction: grant_end is read only by a generation's first claim) */
#define GRANT_END_DONE  cp_gend = 0
#else
#define GRANT_END_DONE  skip
#endif
#ifdef C9_GRANT_BOOT
/* (model reduction: grant_boot is read only while the generation is untaken) */
#define GRANT_BOOT_DONE  cp_gboot = 0
#else
#define GRANT_BOOT_DONE  skip
#endif
inline cp_heartbeat(n, granted) {
	granted = 0;
	if
	:: cp_leader == n && took[n] ->
		granted = 1                             /* the boot that took it renews */
	:: cp_leader == n && !cp_taken && CLAIM_HOLDS(n) ->
		cp_taken = 1; took[n] = 1; granted = 1; /* the first claim takes it */
		NOTE_TAKEN(n);
		GRANT_END_DONE;
		GRANT_BOOT_DONE
	:: cp_leader == n && !cp_taken && !CLAIM_HOLDS(n) ->
#ifdef C8_GRANT_END
		printf("MSC: node %d does not claim generation %d: its log ends at %d (acked_floor %d, grant_end %d)\n", n, cp_gen, flushed[n], cp_floor, cp_gend)
#else
		printf("MSC: node %d does not claim generation %d: its log ends at %d (acked_floor %d)\n", n, cp_gen, flushed[n], cp_floor)
#endif
	:: else -> skip
	fi
}

/* lease_apply_assignment (lease.c): the heartbeat's answer applied */
inline lease_apply_assignment(n, granted) {
	if
	:: cp_gen < gen[n] -> skip      /* never lower the generation */
	:: cp_gen >= gen[n] && cp_leader == n && (cp_gen > gen[n] || role[n] != LEADER) ->
		/* taking the shard: record where the generation begins, before
		 * any write of it can exist (genmap_note) */
		genmap_note(n, cp_gen, wend[n], t_a);
		if
		:: t_a ->
			role[n] = LEADER; gen[n] = cp_gen; lknown[n] = n; live[n] = granted;
			printf("MSC: node %d takes the shard at generation %d (lease live: %d)\n", n, cp_gen, granted);
			repl_state_reset(n);
			acked_survive()         /* P1 at the takeover */
		:: else -> skip
		fi
	:: cp_gen == gen[n] && cp_leader == n && role[n] == LEADER ->
		/* renewal at the same generation, anchored at the send */
		if
		:: granted && !live[n] -> live[n] = 1;
			printf("MSC: node %d claims its lease again\n", n)
		:: else -> skip
		fi
	:: cp_gen >= gen[n] && cp_leader != n ->
		if
		:: role[n] == LEADER || gen[n] != cp_gen ->
			printf("MSC: node %d follows node %d at generation %d\n", n, cp_leader, cp_gen)
		:: else -> skip
		fi;
		if :: role[n] == LEADER -> repl_state_clear(n) :: else -> skip fi;
		role[n] = FOLLOWER; gen[n] = cp_gen; live[n] = 0; lknown[n] = cp_leader;
		ack_word_gc(n)
	fi
}

/* heartbeat_once (worker/heartbeat.c): a heartbeat, its claim, and the
 * assignment it brings back.  One step: the lease is anchored at the send,
 * so a slow answer only shortens it (duty.pml keeps send and claim apart) */
inline heartbeat_once(n) {
#if defined(CAUGHT_UP_ALIVE) && !defined(CAUGHT_UP_HEARD)
	hbend[n] = flushed[n];      /* the log end it gives (held_ends) */
#endif
	cp_heartbeat(n, t_ok);
	lease_apply_assignment(n, t_ok)
}

/* lease_writable (lease.c): this node's monotonic clock passed its lease's
 * expiry (minus felix.lease_epsilon); the lease is forgotten */
inline lease_writable(n) {
	live[n] = 0;
	printf("MSC: node %d's lease runs out\n", n)
}

/* shard_flush (storage/shard.c): the group flush makes the written end durable */
inline shard_flush(n) {
	flushed[n] = wend[n]
}

/* ship_follower (ship.c): a shipment of [cursor, written end), felix_replicate
 * on the follower, and apply_answer on what it answers, in one step (README:
 * a late answer only makes the leader know less) */
inline ship_follower(n, f) {
	felix_replicate(n, f);
	apply_answer(n, f)
}

/* report_tick with consider_slot's second half (report.c): the rows of a
 * report -- caught up = acked_end >= Max(hwm_end, mark) -- and the mark
 * riding on it; the rows it says are caught up become doubtful until it is
 * seen to land */
inline report_tick(n) {
	quorum_mark(n);
	t_c = (hwm[n] > t_mark -> hwm[n] : t_mark);     /* caught_up_at */
	t_j = 0;
	do
	:: t_j < NN ->
		if
		:: t_j != n && (answered[IX(n,t_j)] || halted[IX(n,t_j)]) ->
			mpres[IX(n,t_j)] = 1;
			macked[IX(n,t_j)] = fack[IX(n,t_j)];
			mcaught[IX(n,t_j)] = (!halted[IX(n,t_j)] && fack[IX(n,t_j)] >= t_c)
		:: else ->
			mpres[IX(n,t_j)] = 0; macked[IX(n,t_j)] = 0; mcaught[IX(n,t_j)] = 0
		fi;
		t_j++
	:: else -> break
	od;
	mgen[n] = gen[n];
#ifdef BROKEN_REPORT_ORDER
	mmark[n] = 0;
#else
	mmark[n] = (t_mark > hwm[n] -> t_mark : 0);
#endif
	/* Model reduction, not felix: a report that carries no mark, would
	 * write exactly the rows the control plane holds, and would leave
	 * the leader's beliefs as they are, changes nothing; skip it. */
	t_ok = (mmark[n] == 0 && conf[n] && cp_leader == n && cp_gen == gen[n]);
	t_j = 0;
	do
	:: t_j < NN ->
		if
		:: t_j != n && (doubt[IX(n,t_j)] || lastc[IX(n,t_j)] != mcaught[IX(n,t_j)] ||
		                (mpres[IX(n,t_j)] && !(rpres[t_j] && rgen[t_j] == gen[n] &&
		                   racked[t_j] == macked[IX(n,t_j)] && rcaught[t_j] == mcaught[IX(n,t_j)])) ||
		                (!mpres[IX(n,t_j)] && rcaught[t_j])) -> t_ok = 0
		:: else -> skip
		fi;
		t_j++
	:: else -> break
	od;
#if !defined(SEVERAL_SHARDS) || !defined(OLD_CONFIRM_WITHOUT_ROWS)
	/* a part naming no follower is not queued (consider_slot: nnamed == 0)
	 * and has no rows: a request with other shards' rows lands without
	 * touching this shard's ReportSlot, and with one shard per node no
	 * request goes at all (report_tick: nrows == 0) -- either way, for
	 * this shard, as if nothing was sent.  (No mark can ride on it: with
	 * no follower answered, the mark of a majority is 0.) */
	if
	:: !mpres[IX(n,0)] && !mpres[IX(n,1)] && !mpres[IX(n,2)] -> t_ok = 1
	:: else -> skip
	fi;
#else
	/* the code before the change: the part is queued with other shards'
	 * rows, lands, and confirms the shard with nobody caught up */
#endif
	if
	:: t_ok -> report_forget(n)
	:: else ->
		t_j = 0;
		do
		:: t_j < NN ->
			/* from now on the control plane may believe it */
			if :: mcaught[IX(n,t_j)] -> doubt[IX(n,t_j)] = 1 :: else -> skip fi;
			t_j++
		:: else -> break
		od;
		mst[n] = M_INNET;
		infl[n] = 1;
		printf("MSC: node %d sends a report (gen %d, mark %d): caught up %d %d %d, acked %d %d %d\n", n, gen[n], mmark[n],
			mcaught[IX(n,0)], mcaught[IX(n,1)], mcaught[IX(n,2)], macked[IX(n,0)], macked[IX(n,1)], macked[IX(n,2)]);
#ifndef REPORT_WINDOW
		/* felix.cp_report answers within this step (README: why this
		 * loses nothing); or the request is lost */
		if
		:: true -> cp_report(n)
		:: true -> finish_request(n, 0)
		fi
#else
		skip
#endif
	fi
}

/* a crash, then shard_open_locked (storage/shard.c) at the restart: what
 * was not flushed is gone, the node follows nobody until its heartbeat,
 * and its publishers fail */
inline shard_open_locked(n) {
	ncrash++;
	boot[n]++;
	printf("MSC: node %d crashes and restarts\n", n);
#ifdef RESTORE_FAULT
	/* the shard's leader -- the node the assignment names -- comes back
	 * from an older copy of its data directory (same identity): any
	 * shorter durable prefix */
	t_a = flushed[n];
	do
#if defined(RESTORE_TAKEN_ONLY)
	/* (only once its generation's lease was claimed) */
	:: n == cp_leader && cp_taken && flushed[n] > 0 -> flushed[n]--
#elif defined(RESTORE_UNTAKEN_ONLY)
	/* (only between a grant and its first claim) */
	:: n == cp_leader && !cp_taken && flushed[n] > 0 -> flushed[n]--
#elif defined(RESTORE_ANY_NODE)
	:: !restored && flushed[n] > 0 -> flushed[n]--
#else
	:: n == cp_leader && flushed[n] > 0 -> flushed[n]--
#endif
	:: true -> break
	od;
#ifdef RESTORE_ANY_NODE
	if :: flushed[n] < t_a -> restored = 1 :: else -> skip fi;
	/* a new boot: what its rows said is doubted until its leader says it
	 * again (void_reports, at its first heartbeat of the boot -- before
	 * which the control plane has not heard from it) */
	rcaught[n] = 0;
#endif
	if
	:: flushed[n] < t_a ->
		printf("MSC: node %d comes back from an older copy: its log ends at %d, not %d\n", n, flushed[n], t_a)
	:: else -> skip
	fi;
#endif
#if defined(CAUGHT_UP_ALIVE) && !defined(CAUGHT_UP_HEARD)
	hbend[n] = 0;           /* a new boot: no end given yet (README) */
#endif
	/* what was not flushed is gone */
	do
	:: wend[n] > flushed[n] -> wend[n]--; LOG(n, wend[n]) = 0
	:: else -> break
	od;
	/* (the generation map is durable and kept as it is) */
	hwm[n] = 0;             /* the durable mark may be older: take the least */
	log_last_generation(n, t_lg);
	genmap_last(n, t_mg);
	gen[n] = (t_lg > t_mg -> t_lg : t_mg);
	role[n] = FOLLOWER; lknown[n] = NONE; live[n] = 0; took[n] = 0;
#ifdef C9_GRANT_BOOT
	/* a new boot: not the one the generation was granted to */
	if :: n == cp_leader -> cp_gboot = 0 :: else -> skip fi;
#endif
	ackg[n] = 0; acke[n] = 0;
	repl_state_clear(n);
	/* its leaders' connections to it are gone: what it answered on them is
	 * no longer believed (ship_follower); neither the mark nor a report
	 * uses it until it answers again (README: why at the restart) */
	t_i = 0;
	do
	:: t_i < NN -> answered[IX(t_i,n)] = 0; t_i++
	:: else -> break
	od;
	t_i = 0;
	infl[n] = 0;
	report_forget(n)    /* (landing it first is another interleaving) */
}

/* ======================= the nodes ======================= */

proctype node(byte n) {
	byte f;
end_node:
	do
	/* ---- heartbeat_once (worker/heartbeat.c) ---- */
	:: atomic { heartbeat_once(n) }

	/* ---- the lease runs out by this node's clock ---- */
	:: atomic { live[n] -> lease_writable(n) }

#if MAXCRASH > 0
	/* ---- the group flush ---- */
	:: atomic { flushed[n] < wend[n] -> shard_flush(n) }
#endif

	/* ---- a shipment to either follower, answered ---- */
	:: atomic { role[n] == LEADER && !halted[IX(n,(n+1)%NN)] -> f = (n+1)%NN; ship_follower(n, f); f = 0 }
	:: atomic { role[n] == LEADER && !halted[IX(n,(n+2)%NN)] -> f = (n+2)%NN; ship_follower(n, f); f = 0 }

	/* ---- consider_slot (report.c) returns at once unless this node
	 * leads the shard with a live lease: no rows, no mark ---- */
#ifdef OLD_REPORT_WITHOUT_LEASE
#define SPEAKS(n)  (role[n] == LEADER)      /* the code before the change */
#else
#define SPEAKS(n)  (role[n] == LEADER && live[n])
#endif
	/* ---- the mark moves on the standing report ---- */
	:: atomic { SPEAKS(n) -> consider_slot(n) }

	/* ---- a report is sent ---- */
	:: atomic { SPEAKS(n) && !infl[n] && mst[n] == M_NONE -> report_tick(n) }

	/* ---- a crash, and the restart ---- */
	:: atomic {
		ncrash < MAXCRASH ->
		shard_open_locked(n)
	   }
	od
}

/* ======================= the control plane ======================= */

/* leader_holds_reported (cp_duty.c): the lapsed leader's log end, as its
 * heartbeat gave it (README: taken as its durable end now), is at or after
 * the shard's acked_floor and the largest acknowledged end of the newest
 * reporting generation; and at or after the log end of every follower
 * that generation's rows call caught up and that is alive, as that
 * follower's own heartbeat of this boot gave it.  t_rep is left holding
 * the newest generation's largest acknowledged end (for the floor). */
#if defined(CAUGHT_UP_HEARD)
/* assumption: every such follower heartbeated since the lapse */
#define CP_END(f)   (flushed[f])
#elif defined(CAUGHT_UP_ALIVE)
/* assumption: every such follower is alive; its end is its last heartbeat's */
#define CP_END(f)   (hbend[f])
#else
/* any value will do: the follower may be not alive, and then is skipped */
#define CP_END(f)   (flushed[f])
#endif
inline leader_holds_reported(l, res) {
	t_newest = 0;
	t_rep = 0;
	t_j = 0;
	do
	:: t_j < NN -> if :: rpres[t_j] && rgen[t_j] > t_newest -> t_newest = rgen[t_j] :: else -> skip fi; t_j++
	:: else -> break
	od;
	t_j = 0;
	do
	:: t_j < NN ->
		if :: rpres[t_j] && rgen[t_j] == t_newest && racked[t_j] > t_rep -> t_rep = racked[t_j] :: else -> skip fi;
		t_j++
	:: else -> break
	od;
	res = (flushed[l] >= t_rep && flushed[l] >= cp_floor);
#ifndef OLD_LEADER_CHECK_REPORTS_ONLY
	/* every follower reported caught up, if alive, bounds it from below */
	t_j = 0;
	do
	:: t_j < NN ->
		if
		:: t_j != l && rpres[t_j] && rgen[t_j] == t_newest && rcaught[t_j] && CP_END(t_j) > flushed[l] ->
			if
			:: res = 0;                         /* alive at its row's incarnation */
				printf("MSC: node %d's log (end %d) ends before caught-up node %d's (end %d)\n", l, flushed[l], t_j, CP_END(t_j))
#if !defined(CAUGHT_UP_ALIVE) && !defined(CAUGHT_UP_HEARD)
			:: printf("MSC: node %d, reported caught up, is not alive (not compared)\n", t_j)
#endif
			fi
		:: t_j != l && rpres[t_j] && rgen[t_j] == t_newest && rcaught[t_j] && CP_END(t_j) <= flushed[l] ->
			printf("MSC: caught-up node %d's log end, as the control plane has it, is %d (node %d's: %d)\n", t_j, CP_END(t_j), l, flushed[l])
		:: else -> skip
		fi;
		t_j++
	:: else -> break
	od;
#endif
	skip
}

/* restarted_leader_check (cp_duty.c, C9): a lapsed leader that was
 * started again since it took its generation -- its boot is not the one
 * that claimed it (took[l] clear: a crash clears it, and a grantee that
 * never claimed counts as started again; it may still make the first
 * claim while the grant stands) -- qualifies only if every other replica
 * of the shard is alive and gave, in a heartbeat that read its log after
 * the lapse, a log end no later than the leader's (RESTART_HOLDS; else
 * RESTART_SHORT, RESTART_WAITS or RESTART_PENDING).  A heartbeat is one
 * step here, reading the log and sending at once, so each replica's end
 * is taken as its durable end now, as if it heartbeated just before the
 * holder looked; and every replica is taken as alive, which only lets the
 * leader qualify more often (README: Promotion): only RESTART_SHORT is
 * left to refuse it.  res is left 0 if the leader falls short, untouched
 * otherwise. */
#if defined(C9_GRANT_BOOT)
/* what-if: while the generation is untaken, a grantee in the boot it was
 * granted to (cp_gboot) is not started again either */
#define SAME_BOOT(l)  (took[l] || (!cp_taken && cp_gboot))
#else
#define SAME_BOOT(l)  (took[l])
#endif
inline restarted_leader_check(l, res) {
#ifndef OLD_RESTARTED_LEADER_UNCHECKED
	if
	:: !SAME_BOOT(l) ->
		t_j = 0;
		do
		:: t_j < NN ->
			if
			:: t_j != l && flushed[t_j] > flushed[l] ->
				res = 0;        /* RESTART_SHORT */
				printf("MSC: node %d was started again since it took generation %d (or never took it), and its log (end %d) ends before node %d's (end %d)\n", l, cp_gen, flushed[l], t_j, flushed[t_j])
			:: else -> skip
			fi;
			t_j++
		:: else -> break
		od
	:: else -> skip
	fi;
#endif
	skip
}

/* disqualified (cp_duty.c) for a follower of a quorum stream: a row of
 * the newest reporting generation saying caught up */
#ifdef PROMOTE_ANY
/* guard deletion: any follower with a row of the newest generation */
#define QUALIFIES(x) ((x) != cp_leader && rpres[x] && rgen[x] == t_newest)
#else
#define QUALIFIES(x) ((x) != cp_leader && rpres[x] && rgen[x] == t_newest && rcaught[x])
#endif
#if defined(PROMOTE_ANY) || defined(ANY_CAUGHT_UP)
/* no order: whichever qualifies (the placement score alone) */
#define FURTHEST(x)  (QUALIFIES(x))
#else
#define FURTHEST(x)  (QUALIFIES(x) && \
	(!QUALIFIES((x+1)%NN) || racked[x] >= racked[(x+1)%NN]) && \
	(!QUALIFIES((x+2)%NN) || racked[x] >= racked[(x+2)%NN]))
#endif

#ifdef BY_LOG
/* copies_candidate (cp_duty.c): count the copies whose token is the one the
 * taking claim recorded and that the holder heard from since the lapse --
 * any copy may not have been (not alive, cut off, its heartbeat not yet
 * in): each is counted or passed over, both ways searched; a log end is
 * the one read now, after the lapse.  With n - n/2 of them, the newest log
 * (last generation, then end) is promoted if it reaches the leader's log
 * at the taking claim.  best is left NONE otherwise. */
#ifdef BY_LOG_ANY_COPY
#define KEPT(x)     (1)
#else
#define KEPT(x)     (cp_tokset[x] && cp_tok[x] == boot[x])
#endif
#ifdef BY_LOG_NEED_ONE
#define BY_LOG_NEED 1
#else
#define BY_LOG_NEED (NN - NN/2)
#endif
#ifdef BY_LOG_NOT_PAST_TAKEN
#define PAST_TAKEN(x)  (1)
#else
#define PAST_TAKEN(x)  (LASTGEN(x) > cp_tlg || (LASTGEN(x) == cp_tlg && flushed[x] >= cp_tend))
#endif
/* A generation granted and never taken wrote nothing, so what the last
 * taking claim recorded stands for it too (the grant keeps it) */
inline copies_candidate(best) {
	best = NONE;
	t_c = 0;
	t_j = 0;
	do
	:: t_j < NN ->
		if
		:: KEPT(t_j) ->
			if
			:: true ->
				t_c++;
				if
				:: best == NONE || LASTGEN(t_j) > LASTGEN(best) ||
				   (LASTGEN(t_j) == LASTGEN(best) && flushed[t_j] > flushed[best]) -> best = t_j
				:: else -> skip
				fi
			:: true -> skip                 /* not heard from since the lapse */
			fi
		:: else -> skip
		fi;
		t_j++
	:: else -> break
	od;
	if
	:: t_c < BY_LOG_NEED || (best != NONE && !PAST_TAKEN(best)) -> best = NONE
	:: else ->
		printf("MSC: %d copies kept their log since the last generation taken (now %d): node %d's is the newest (end %d, last generation %d)\n", t_c, cp_gen, best, flushed[best], LASTGEN(best))
	fi;
	t_c = 0
}
#endif

/* consider (cp_duty.c): promote at G+1 -- the last leader if it holds
 * what it reported (leader_holds_reported) and, if it was started again
 * since it took its generation, every other replica shows it holds theirs
 * (restarted_leader_check, C9); else the furthest ahead of the followers
 * reported caught up in the newest reporting generation (disqualified,
 * better); nobody: the shard stays unplaced, and the grant stands.  The
 * grant records acked_floor and grant_end (C8) -- and, with GRANT_BOOT,
 * grant_boot */
inline consider() {
	leader_holds_reported(cp_leader, t_ok);
	restarted_leader_check(cp_leader, t_ok);
	t_best = NONE;
	if
	:: t_ok -> t_best = cp_leader            /* the last leader comes first ... */
	:: true ->
		/* ... if it is heard from again after the lapse; else, or while
		 * it is not, */
		/* the furthest ahead of those reported caught up; the
		 * placement score (any of them here) breaks ties */
		if
		:: FURTHEST(0) -> t_best = 0
		:: FURTHEST(1) -> t_best = 1
		:: FURTHEST(2) -> t_best = 2
#ifdef BY_LOG
		:: else -> copies_candidate(t_best); t_bylog = (t_best != NONE)   /* by log, or unplaced */
#else
		:: else -> skip                      /* unplaced */
#endif
		fi
	fi;
	if
	:: t_best != NONE ->
		/* acked_floor: a returning leader held the floor and what was
		 * reported; a promoted follower holds what its row says */
		t_a = (t_best == cp_leader -> t_rep : racked[t_best]);
		if :: t_bylog -> t_a = cp_floor; t_bylog = 0 :: else -> skip fi;   /* by log: the floor stays */
		if :: t_a > cp_floor -> cp_floor = t_a :: else -> skip fi;
		printf("MSC: the control plane grants generation %d to node %d (acked_floor %d)\n", cp_gen+1, t_best, cp_floor);
		holds_every_acked(t_best);           /* P1 at the promotion */
#ifdef C8_GRANT_END
		cp_gend = flushed[t_best];           /* grant_end (C8) */
#endif
#ifdef C9_GRANT_BOOT
		cp_gboot = 1;                        /* what-if: grant_boot, the grantee's boot now */
#endif
#ifdef BY_LOG
		cp_glg = LASTGEN(t_best);            /* grant_last_generation */
#ifdef BY_LOG_TOKENS_AT_GRANT
		cp_tok[0] = boot[0]; cp_tok[1] = boot[1]; cp_tok[2] = boot[2];
		cp_tokset[0] = 1; cp_tokset[1] = 1; cp_tokset[2] = 1;
#endif
		/* else the grant keeps what the last taking claim recorded (the C
		 * copies the shard's fields into the grant) */
#endif
		cp_gen++;
		cp_leader = t_best;
		cp_taken = 0;
		took[0] = 0; took[1] = 0; took[2] = 0
	:: else -> skip
	fi;
	t_best = 0
}

proctype control_plane() {
end_cp:
	do
#ifdef REPORT_WINDOW
	/* ---- felix.cp_report lands a request, or refuses it ---- */
	:: atomic { mst[0] == M_INNET -> cp_report(0) }
	:: atomic { mst[1] == M_INNET -> cp_report(1) }
	:: atomic { mst[2] == M_INNET -> cp_report(2) }
	/* ---- the leader reads the answer of a request that landed ---- */
	:: atomic { mst[0] == M_LANDED -> finish_request(0, 1) }
	:: atomic { mst[1] == M_LANDED -> finish_request(1, 1) }
	:: atomic { mst[2] == M_LANDED -> finish_request(2, 1) }
	/* ---- ... or the request never arrives, or its answer is lost ---- */
	:: atomic { mst[0] != M_NONE -> finish_request(0, 0) }
	:: atomic { mst[1] != M_NONE -> finish_request(1, 0) }
	:: atomic { mst[2] != M_NONE -> finish_request(2, 0) }
#endif

	/* ---- the lease lapsed: the safety interval is duty.pml's -- by the
	 * time the holder may grant, the leader's own clock has run out ---- */
	:: atomic {
		!live[cp_leader] && cp_gen < MAXGEN ->
		consider()
	   }

	/* ---- P1 in every state ---- */
#ifdef SERVED
	:: d_step { acked_survive(); marks_show_one_history(); t_i = 0; t_j = 0 }
#else
	:: d_step { acked_survive(); t_i = 0 }
#endif
	od
}

init {
	byte i;
	atomic {
		/* generation 1: node 0 leads with a live lease, all logs empty */
		i = 0;
		do
		:: i < NN*(MAXGEN+1) -> gm[i] = NONE; i++
		:: else -> break
		od;
		GM(0, 1) = 0;
		role[0] = LEADER; gen[0] = 1; lknown[0] = 0; live[0] = 1; took[0] = 1;
#ifdef BY_LOG
		/* generation 1 was taken with every copy there, empty */
		cp_tokset[0] = 1; cp_tokset[1] = 1; cp_tokset[2] = 1;
#endif
		gen[1] = 1; lknown[1] = 0;
		gen[2] = 1; lknown[2] = 0;
		i = 0;
		run control_plane();
		run node(0); run node(1); run node(2);
		i = 1;
		do
		:: i <= NREC -> run leader_publish(i); i++
		:: else -> break
		od;
		i = 0
	}
}
