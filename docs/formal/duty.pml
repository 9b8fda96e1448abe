/*
 * duty.pml -- a Promela model of felix's control-plane duties moving
 * between nodes, and of the lease timing that keeps two leaders of one
 * shard from acknowledging at the same time.
 *
 * Three nodes.  Each may lead the shard, and each may run the duties
 * (cp_duty.c): the holder rewrites the `duty` key every tick; another node
 * takes the duties over with a compare-and-set on the key's revision; the
 * holder grants generation G+1 only after a lease plus margin has passed,
 * on its own clock, since it first saw the leader's last claim -- and a
 * new holder, knowing nothing, counts from its first look after taking
 * over.  A grant is a compare-and-set on the duty key's revision, the
 * shard's assignment and the old leader's node record.  Leaders claim
 * their lease with a heartbeat (cp_heartbeat.c) and hold it from the
 * instant they sent it (lease_apply_assignment, lease.c).
 *
 * Time: a `clock` process makes real time pass in ticks.  At each tick
 * every node's monotonic clock advances by RMIN or RMAX units, chosen
 * freely per node and per tick: clocks drift within a bound and never
 * agree.  Every timer below is a countdown on its node's own clock.  A
 * paused process (SIGSTOP) is one that takes no step while ticks go by;
 * its clock keeps running, and it resumes with the beliefs it had -- in
 * particular a holder may decide a promotion, stop, and commit it later.
 *
 * Abstracted (README): a node may take the duties over at any time, not
 * only after the key went a lease unchanged, and a holder may give them
 * up at any time; only takeovers whose compare-and-set succeeds are
 * modelled.  Each only adds behaviours.  -DDUTY_TIMING models the real
 * timing instead (a watcher takes over once the key has gone a lease
 * unchanged on its own clock; a holder stops once its last confirmed
 * refresh is a lease old), at about thirty times the states.
 *
 * Property, checked at every acknowledgement (a leader may acknowledge
 * whenever its own clock says its lease is live -- quorum_release's
 * lease_live_locked):
 *   D1  no generation after the acknowledging leader's has been granted;
 *   D2  no other node believes it holds a live lease for the shard.
 *
 * Parameters (-D): RMIN, RMAX clock units per tick; LEASE, EPS, MARGIN in
 * clock units; MAXGEN generations; NN nodes.  The design needs
 * ceil((LEASE+MARGIN)/RMAX) >= ceil((LEASE-EPS)/RMIN) ticks.
 *
 * Variants (-D), each expected to FAIL:
 *   BROKEN_GRANT_AT_ONCE   a new holder grants at its first look, without
 *                          waiting out a lease and margin.
 *   NO_CLAIM_CAS           a grant does not compare the old leader's node
 *                          record, so a claim made after the holder looked
 *                          does not stop it.
 *   EPS=0 MARGIN=0         nothing covers the clocks' drift.
 * (TWO_LEADERS_ONLY checks D2 alone, to show the two-leader form of a
 * counterexample; TRAIL_BFS lets pan search breadth-first, for the
 * shortest trail.)
 * And one expected to PASS (a guard this property does not need):
 *   NO_DUTY_CAS            a grant does not compare the duty key.
 */

#ifndef NN
#define NN 3
#endif

#ifndef RMIN
#define RMIN   1        /* clock units per tick, slowest clock */
#endif
#ifndef RMAX
#define RMAX   2        /* fastest clock */
#endif
#ifndef LEASE
#define LEASE  3        /* felix.lease_duration */
#endif
#ifndef EPS
#define EPS    1        /* felix.lease_epsilon */
#endif
#ifndef MARGIN
#define MARGIN 1        /* felix.lease_margin */
#endif
#ifndef MAXGEN
#define MAXGEN 3
#endif

#define LE    (LEASE - EPS)     /* what a claim gives, from the send */
#define WAIT  (LEASE + MARGIN)  /* what the holder waits after a claim */
#define NONE  255

/* ---- the store ---- */
byte cp_gen = 1;
byte cp_leader = 0;

/* ---- per node: the shard's lease (lease.c) ---- */
byte lease[NN];         /* lease left, own clock; live iff > 0 */
byte lgen[NN];          /* generation it leads, 0 if none */
bit  hbp[NN];           /* a heartbeat is on its way */
byte hbt[NN];           /* ... the lease it would give, counted from its send */

/* ---- per node: the duties (cp_duty.c) ---- */
byte kowner = 1;        /* who wrote the duty key last: its duty_rev is the key's
                           revision; everyone else's compare fails */
bit  hold[NN];          /* `holding` */
#ifdef DUTY_TIMING
byte ref[NN];           /* lease left since its last confirmed refresh (refreshed_ns) */
bit  kchg[NN];          /* the key was written since it last looked (duty_seen_rev) */
byte dk[NN];            /* lease left before the key, unchanged, may be taken (duty_seen_ns) */
#endif
byte obsg[NN];          /* generation its shard observation is of, 0: none since takeover */
byte wt[NN];            /* wait left before the lapse (claim_seen_ns + lease + margin) */
bit  cdirty[NN];        /* the leader's record changed since it looked */
bit  pg[NN];            /* a promotion decided, its transaction not yet committed */
bit  pgok[NN];          /* ... whose compares still hold (assignment, records) */

/* scratch, always 0 between steps (visible when pan searches breadth-first,
 * which refuses hidden variables: -DTRAIL_BFS) */
#ifdef TRAIL_BFS
byte t_i, t_r;
#else
hidden byte t_i, t_r;
#endif

inline dec(x, r) {
	if :: x > r -> x = x - r :: else -> x = 0 fi
}

/* ---- quorum_release (quorum.c): a leader acknowledges, which it does only
 *      while lease_live_locked says its lease is live ---- */
inline quorum_release(n) {
	printf("MSC: node %d acknowledges at generation %d (lease left %d)\n", n, lgen[n], lease[n]);
#ifndef TWO_LEADERS_ONLY
	/* no generation after ours exists */
	assert(cp_gen == lgen[n]);    /* D1: no later generation exists */
#endif
	/* nobody else believes it holds a live lease */
	t_i = 0;
	do
	:: t_i < NN -> assert(t_i == n || lease[t_i] == 0); t_i++    /* D2: no second live lease */
	:: else -> break
	od;
	t_i = 0
}

/* ---- heartbeat_once (worker/heartbeat.c) sends, anchoring the lease;
 *      cp_heartbeat (control/cp_heartbeat.c) claims and lease_apply_assignment
 *      (lease.c) applies, when the answer comes back ---- */
inline heartbeat_once(n) {
	printf("MSC: node %d sends a heartbeat\n", n);
	hbp[n] = 1;
	hbt[n] = LE         /* anchored at the send */
}

inline cp_heartbeat(n) {
	if
	:: cp_leader == n ->
		/* claims the lease: the node record changes */
		if :: hbt[n] > lease[n] -> lease[n] = hbt[n] :: else -> skip fi;
		lgen[n] = cp_gen;
		printf("MSC: node %d claims generation %d: lease left %d\n", n, cp_gen, lease[n]);
		t_i = 0;
		do
		:: t_i < NN ->
			/* promotions decided before it fail their compare; the holder
			 * sees the claim at its next look (only the key's writer can
			 * look again before forgetting everything) */
			pgok[t_i] = 0;
			if :: t_i == kowner && hold[t_i] -> cdirty[t_i] = 1 :: else -> skip fi;
			t_i++
		:: else -> break
		od
	:: else ->
		/* follows the leader the store names */
		lease[n] = 0;
		lgen[n] = 0
	fi;
	t_i = 0;
	hbp[n] = 0;
	hbt[n] = 0
}

/* ---- write_duty, hold_duty and take_over (cp_duty.c) ---- */
inline write_duty(n) {
	/* a write of the key changes its revision under everyone else */
	if
	:: kowner != n ->
		/* Model reduction: a holder whose key was overwritten only ever
		 * fails its next refresh and forgets; do it now */
		obsg[kowner] = 0; wt[kowner] = 0; cdirty[kowner] = 0
	:: else -> skip
	fi;
	kowner = n;
#ifdef DUTY_TIMING
	/* counted from the write: it may have landed then */
	ref[n] = LEASE;
	t_i = 0;
	do
	:: t_i < NN -> if :: t_i != n && !hold[t_i] -> kchg[t_i] = 1 :: else -> skip fi; t_i++
	:: else -> break
	od;
	t_i = 0
#else
	skip
#endif
}

/* Model reduction: what only a holder reads is forgotten when it stops
 * holding (a later takeover forgets it anyway) */
inline stop_holding(n) {
	hold[n] = 0; obsg[n] = 0; wt[n] = 0; cdirty[n] = 0;
#ifdef DUTY_TIMING
	/* it watches the key afresh (its duty_seen_rev is stale) */
	ref[n] = 0; kchg[n] = 1; dk[n] = 0
#else
	skip
#endif
}

#ifdef DUTY_TIMING
#define MAY_STOP(n)     (ref[n] == 0)       /* its last refresh is a lease old */
#define MAY_REFRESH(n)  (ref[n] > 0)
#define WATCH(n)        (!hold[n] && kchg[n])
#define MAY_TAKE(n)     (!hold[n] && !kchg[n] && dk[n] == 0)
#else
#define MAY_STOP(n)     (1)                 /* abstracted: at any time */
#define MAY_REFRESH(n)  (1)
#define WATCH(n)        (0)
#define MAY_TAKE(n)     (!hold[n])          /* abstracted: at any time */
#endif

inline hold_duty(n) {
	if
	:: hold[n] && MAY_STOP(n) ->
		/* its own clock says its last refresh is a lease old, and the late
		 * refresh below was refused or not made: it stops */
		stop_holding(n)
	:: hold[n] && kowner == n ->
		/* refresh: a compare-and-set on its own last revision, on time or
		 * late (nobody took over, so it keeps what it observed) */
		write_duty(n)
	:: hold[n] && MAY_REFRESH(n) && kowner != n ->
		/* the refresh is refused: another node took over */
		stop_holding(n)
#ifdef DUTY_TIMING
	:: WATCH(n) ->
		/* the key changed since it looked: watch it for a lease afresh */
		kchg[n] = 0;
		dk[n] = LEASE
	:: !hold[n] && !kchg[n] && dk[n] > 0 -> skip
#endif
	:: MAY_TAKE(n) ->
		/* the key unchanged for a lease on its own clock: take over with a
		 * compare-and-set on the revision it read (unchanged since, or it
		 * would have looked again); one that fails changes nothing, so
		 * only those that succeed are modelled */
#ifdef DUTY_TIMING
		dk[n] = 0;
#endif
		write_duty(n);
		hold[n] = 1;
		/* forget_everything: knows nothing of any claim */
		obsg[n] = 0; wt[n] = 0; cdirty[n] = 0;
		pg[n] = 0; pgok[n] = 0;
		printf("MSC: node %d takes over the duties\n", n)
	fi
}

/* ---- consider (cp_duty.c) up to its transaction: shard_seen, then the
 *      lapse test ---- */
inline consider(n) {
	if
	:: obsg[n] == 0 ->
		/* the first look since taking over */
#ifdef BROKEN_GRANT_AT_ONCE
		wt[n] = 0
#else
		wt[n] = WAIT
#endif
	:: obsg[n] != 0 && (obsg[n] != cp_gen || cdirty[n]) ->
		/* a new generation, or a new claim: a full lease and margin from now */
		wt[n] = WAIT
	:: else -> skip
	fi;
	obsg[n] = cp_gen;
	cdirty[n] = 0;
	if
	:: wt[n] == 0 && !pg[n] && cp_gen < MAXGEN ->
		/* now > claim_seen_ns + lease + margin: promote (to anyone; who,
		 * is chosen when the transaction commits) */
		printf("MSC: node %d decides the lease of generation %d lapsed\n", n, cp_gen);
		pg[n] = 1;
		pgok[n] = 1
	:: else -> skip
	fi
}

/* ---- consider's felix_store_txn (cp_duty.c): the promotion's
 *      compare-and-set, maybe long after the decision ---- */
inline consider_commit(n) {
	if
#if defined(NO_CLAIM_CAS) && defined(NO_DUTY_CAS)
	:: true ->
#elif defined(NO_CLAIM_CAS)
	:: kowner == n ->
#elif defined(NO_DUTY_CAS)
	:: pgok[n] ->
#else
	:: pgok[n] && kowner == n ->
#endif
		cp_gen++;
		if
		:: cp_leader = 0
		:: cp_leader = 1
#if NN > 2
		:: cp_leader = 2
#endif
		fi;
		printf("MSC: node %d grants generation %d to node %d\n", n, cp_gen, cp_leader);
		/* the assignment changed under every other decided promotion */
		t_i = 0;
		do
		:: t_i < NN -> pgok[t_i] = 0; t_i++
		:: else -> break
		od;
		t_i = 0
	:: else -> skip
	fi;
	pg[n] = 0; pgok[n] = 0
}

proctype node(byte n) {
end:
	do
	:: atomic { lgen[n] != 0 && lease[n] > 0 -> quorum_release(n) }
	/* (only a node with something to claim or to learn heartbeats here:
	 *  other heartbeats change nothing this model looks at) */
	:: atomic { !hbp[n] && (cp_leader == n || lease[n] > 0) -> heartbeat_once(n) }
	:: atomic { hbp[n] -> cp_heartbeat(n) }
	/* cp_duty_tick: hold_duty, and consider() in the same tick only if it
	 * still holds (its refresh or takeover just succeeded) */
	:: atomic { hold_duty(n); if :: hold[n] -> consider(n) :: else -> skip fi }
	/* the promotion's compare-and-set, after any pause */
	:: atomic { pg[n] -> consider_commit(n) }
	od
}

/* real time: every node's clock moves on by RMIN or RMAX */
proctype clock() {
end:
	do
	:: atomic {
		t_i = 0;
		do
		:: t_i < NN ->
			if
			:: t_r = RMIN
			:: t_r = RMAX
			fi;
			dec(lease[t_i], t_r);
			/* Model reduction: a lapsed lease's generation is read by nothing */
			if :: lease[t_i] == 0 -> lgen[t_i] = 0 :: else -> skip fi;
			dec(hbt[t_i], t_r);
			dec(wt[t_i], t_r);
#ifdef DUTY_TIMING
			dec(ref[t_i], t_r);
			dec(dk[t_i], t_r);
#endif
			t_i++
		:: else -> break
		od;
		printf("MSC: tick: leases left %d %d %d, holder waits %d %d %d\n",
			lease[0], lease[1], lease[NN-1], wt[0], wt[1], wt[NN-1]);
		t_i = 0; t_r = 0
	   }
	od
}

init {
	atomic {
		/* node 0 leads generation 1, its lease just claimed */
		lgen[0] = 1; lease[0] = LE;
		/* node 1 runs the duties and saw that claim */
		hold[1] = 1;
#ifdef DUTY_TIMING
		ref[1] = LEASE;
		kchg[0] = 1; kchg[2] = 1;
#endif
		obsg[1] = 1; wt[1] = WAIT;
		run clock();
		run node(0); run node(1);
#if NN > 2
		run node(2)
#endif
	}
}
