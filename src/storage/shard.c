/*-------------------------------------------------------------------------
 *
 * shard.c
 *	  Shared per-shard state and the write path: opening a shard (recovery,
 *	  generation start), admission, the append under the shard's lock, the
 *	  group flush that lets one fdatasync serve every waiting publisher, and
 *	  the high-water mark readers are bounded by.
 *
 *	  The storage layer (segment.c and friends) owns the bytes; this file
 *	  owns who may write them and when a write counts as acknowledged.
 *
 * Locking rule: see shard.h.  In short: registry lock for the slot table;
 * append_lock for the log tail; flush_lock for the single flusher; the
 * spinlock for the small mirrored fields readers and flushers look at.
 * No path takes two shards' locks, and append_lock is never held while
 * waiting for a flush, so the two LWLocks of a shard never deadlock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "felix.h"
#include "metrics.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shard.h"
#include "control/conninfo.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
#include "port/atomics.h"
#include "utils/memutils.h"

typedef struct FelixShardRegistry
{
	LWLock		lock;			/* guards the hash and slot allocation */
	int			tranche_id;		/* the registry lock */
	int			append_tranche_id;	/* every shard's append_lock */
	int			flush_tranche_id;	/* every shard's flush_lock */
	Latch	   *shipper_latch;	/* the ship worker's latch, or NULL */
	pg_atomic_uint64 streams_forgotten; /* streams gone so far (see shard.h) */
	pg_atomic_uint32 slots_used;	/* slots [0, slots_used) were ever used */
	int			nslots;
	FelixShard	slots[FLEXIBLE_ARRAY_MEMBER];
} FelixShardRegistry;

typedef struct FelixShardHashEntry
{
	FelixShardKey key;
	int			slot;
} FelixShardHashEntry;

static FelixShardRegistry *registry = NULL;
static HTAB *shard_hash = NULL;

/* ---------------------------------------------------------------------
 * Shared memory
 * ---------------------------------------------------------------------
 */
Size
shard_registry_size(void)
{
	Size		size;

	size = add_size(offsetof(FelixShardRegistry, slots),
					mul_size(sizeof(FelixShard), felix_max_shards));
	size = MAXALIGN(size);
	size = add_size(size, hash_estimate_size(felix_max_shards,
											 sizeof(FelixShardHashEntry)));
	return size;
}

void
shard_registry_init(void)
{
	bool		found;
	HASHCTL		info;

	registry = ShmemInitStruct("felix shard registry",
							   offsetof(FelixShardRegistry, slots) +
							   sizeof(FelixShard) * felix_max_shards,
							   &found);
	if (!found)
	{
		registry->tranche_id = LWLockNewTrancheId();
		registry->append_tranche_id = LWLockNewTrancheId();
		registry->flush_tranche_id = LWLockNewTrancheId();
		registry->shipper_latch = NULL;
		pg_atomic_init_u64(&registry->streams_forgotten, 0);
		pg_atomic_init_u32(&registry->slots_used, 0);
		registry->nslots = felix_max_shards;
		LWLockInitialize(&registry->lock, registry->tranche_id);
		for (int i = 0; i < felix_max_shards; i++)
		{
			FelixShard *s = &registry->slots[i];

			memset(s, 0, sizeof(FelixShard));
			LWLockInitialize(&s->append_lock, registry->append_tranche_id);
			LWLockInitialize(&s->flush_lock, registry->flush_tranche_id);
			SpinLockInit(&s->mutex);
			ConditionVariableInit(&s->hwm_cv);
			for (int k = 0; k < FELIX_ACK_CVS; k++)
				ConditionVariableInit(&s->ack_cv[k]);
		}
	}

	/*
	 * Named here, in the postmaster, so every backend (forked from it)
	 * shows felix's waits by name in pg_stat_activity.
	 */
	LWLockRegisterTranche(registry->tranche_id, "felix_registry");
	LWLockRegisterTranche(registry->append_tranche_id, "felix_append");
	LWLockRegisterTranche(registry->flush_tranche_id, "felix_flush");

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(FelixShardKey);
	info.entrysize = sizeof(FelixShardHashEntry);
	shard_hash = ShmemInitHash("felix shard hash", felix_max_shards,
							   felix_max_shards, &info,
							   HASH_ELEM | HASH_BLOBS);
}

static void
registry_attach(void)
{
	felix_require_preload();
}

/* ---------------------------------------------------------------------
 * Slots
 * ---------------------------------------------------------------------
 */
FelixShard *
shard_lookup(const FelixShardKey *key)
{
	FelixShardHashEntry *e;
	FelixShard *s = NULL;

	registry_attach();
	LWLockAcquire(&registry->lock, LW_SHARED);
	e = hash_search(shard_hash, key, HASH_FIND, NULL);
	if (e)
		s = &registry->slots[e->slot];
	LWLockRelease(&registry->lock);
	return s;
}

static FelixShard *
shard_allocate(const FelixShardSpec *spec)
{
	FelixShardHashEntry *e;
	FelixShard *s = NULL;
	bool		found;

	LWLockAcquire(&registry->lock, LW_EXCLUSIVE);
	e = hash_search(shard_hash, &spec->key, HASH_FIND, NULL);
	if (e)
	{
		s = &registry->slots[e->slot];
		LWLockRelease(&registry->lock);
		return s;
	}
	for (int i = 0; i < registry->nslots; i++)
	{
		if (!registry->slots[i].in_use)
		{
			s = &registry->slots[i];
			e = hash_search(shard_hash, &spec->key, HASH_ENTER_NULL, &found);
			if (e == NULL)
				break;
			e->slot = i;
			if (pg_atomic_read_u32(&registry->slots_used) < (uint32) i + 1)
				pg_atomic_write_u32(&registry->slots_used, i + 1);
			break;
		}
	}
	if (s == NULL || e == NULL)
	{
		LWLockRelease(&registry->lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("stream \"%s\" shard %d cannot be opened: all %d shard slots are in use",
						spec->stream_name, spec->key.shard, felix_max_shards),
				 errhint("Raise felix.max_shards and restart the server.")));
	}

	/* The slot is free, so nobody holds its locks: reset it in place. */
	SpinLockAcquire(&s->mutex);
	s->key = spec->key;
	strlcpy(s->stream_name, spec->stream_name, NAMEDATALEN);
	s->phase = FELIX_SHARD_CLOSED;
	s->role = FELIX_ROLE_LEADER;
	s->generation = 0;
	s->lease_expiry_ns = 0;
	s->start_seq = s->written_end = s->written_base = 0;
	s->flushed_end = s->hwm_end = s->total_bytes = 0;
	s->retention_bytes = spec->retention_bytes;
	s->retention_ms = spec->retention_ms;
	s->consistency = spec->consistency;
	s->replication_factor = spec->replication_factor;
	s->leader[0] = '\0';
	s->leader_conninfo[0] = '\0';
	s->nreplicas = 0;
	s->unplaced_reason[0] = '\0';
	s->clustered = false;
	s->error[0] = '\0';
	s->commit_holder = 0;
	memset(&s->log, 0, sizeof(FelixLogState));
	s->in_use = true;
	SpinLockRelease(&s->mutex);

	LWLockRelease(&registry->lock);
	return s;
}

int
shard_count_slots(void)
{
	registry_attach();
	return (int) pg_atomic_read_u32(&registry->slots_used);
}

FelixShard *
shard_slot(int i)
{
	registry_attach();
	Assert(i >= 0 && i < registry->nslots);
	return &registry->slots[i];
}

char *
shard_what(FelixShard *s)
{
	return psprintf("stream \"%s\" shard %d", s->stream_name, s->key.shard);
}

void
shard_dir(FelixShard *s, char *buf)
{
	felix_shard_dir(&s->key, buf);
}

/* Copy the log's tail bookkeeping into the spinlock-guarded mirrors. */
static void
shard_mirror_log(FelixShard *s)
{
	SpinLockAcquire(&s->mutex);
	s->start_seq = s->log.start_seq;
	s->written_end = s->log.next_seq;
	s->written_base = s->log.active_base;
	s->total_bytes = s->log.total_bytes;
	SpinLockRelease(&s->mutex);
}

static FelixShardPhase
shard_phase(FelixShard *s)
{
	FelixShardPhase phase;

	SpinLockAcquire(&s->mutex);
	phase = s->phase;
	SpinLockRelease(&s->mutex);
	return phase;
}

static void
shard_report_failed(FelixShard *s)
{
	char		error[FELIX_SHARD_ERROR_LEN];

	SpinLockAcquire(&s->mutex);
	strlcpy(error, s->error, sizeof(error));
	SpinLockRelease(&s->mutex);
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("stream \"%s\" shard %d refuses to serve: its log is damaged",
					s->stream_name, s->key.shard),
			 errdetail("%s", error),
			 errhint("Restore the damaged segment from a replica or a backup, then restart the server.")));
}

static void shard_wait_quorum(FelixShard *s, uint64 generation, uint64 end);

/* Phase, role or generation changed: wake every waiter (see shard.h). */
static void
shard_wake_all(FelixShard *s)
{
	ConditionVariableBroadcast(&s->hwm_cv);
	for (int k = 0; k < FELIX_ACK_CVS; k++)
		ConditionVariableBroadcast(&s->ack_cv[k]);
}

/* The mark moved from old_end to new_end: wake the waiters it released. */
static void
shard_wake_acks(FelixShard *s, uint64 old_end, uint64 new_end)
{
	if (new_end - old_end >= FELIX_ACK_CVS)
	{
		for (int k = 0; k < FELIX_ACK_CVS; k++)
			ConditionVariableBroadcast(&s->ack_cv[k]);
		return;
	}
	for (uint64 end = old_end + 1; end <= new_end; end++)
		ConditionVariableBroadcast(&s->ack_cv[end % FELIX_ACK_CVS]);
}

/* Records on this node count as acknowledged once durable here. */
static bool
shard_acks_on_flush(FelixShard *s)
{
	return s->consistency == FELIX_CONSISTENCY_LEADER || s->replication_factor <= 1;
}

/*
 * Recover the shard's log and open it.  Called with append_lock held
 * exclusively.  Nobody may write yet: leadership, and the lease that
 * bounds it, only come from the control plane (shard_apply_assignment),
 * even on a single node whose control plane is embedded.
 *
 * What readers may see after a start: with one copy, everything durable
 * here (acknowledged or not, it is the only copy); with several, nothing
 * until a leader says what a majority holds, because the tail of a
 * replica may be a proposal no majority ever adopted.
 */
static void
shard_open_locked(FelixShard *s)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	uint64		generation;
	FelixGenEntry *map;
	int			nmap;

	shard_dir(s, dir);
	log_recover(dir, what, &s->log);

	nmap = genmap_load(dir, what, &map);
	generation = s->log.last_generation;
	if (nmap > 0)
		generation = Max(generation, map[nmap - 1].generation);

	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	s->role = FELIX_ROLE_FOLLOWER;
	s->generation = generation;
	s->lease_expiry_ns = 0;
	s->flushed_end = s->log.next_seq;
	s->hwm_end = s->replication_factor <= 1 ? s->log.next_seq : s->log.start_seq;
	s->phase = FELIX_SHARD_OPEN;
	SpinLockRelease(&s->mutex);
	felix_count(FELIX_CTR_SHARDS_RECOVERED, 1);
	shard_wake_all(s);
}

static void
shard_open(FelixShard *s)
{
	MemoryContext oldcxt = CurrentMemoryContext;

	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
	switch (shard_phase(s))
	{
		case FELIX_SHARD_OPEN:
			LWLockRelease(&s->append_lock);
			return;
		case FELIX_SHARD_FAILED:
			LWLockRelease(&s->append_lock);
			shard_report_failed(s);
			break;
		case FELIX_SHARD_CLOSED:
			break;
	}

	PG_TRY();
	{
		shard_open_locked(s);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/*
		 * Damage makes the shard refuse until an operator acts; any other
		 * failure (interrupt, out of file descriptors) leaves it closed so
		 * the next access tries again.
		 */
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode == ERRCODE_DATA_CORRUPTED)
		{
			SpinLockAcquire(&s->mutex);
			snprintf(s->error, FELIX_SHARD_ERROR_LEN, "%s", edata->message);
			s->phase = FELIX_SHARD_FAILED;
			SpinLockRelease(&s->mutex);
			shard_wake_all(s);
		}
		FreeErrorData(edata);
		PG_RE_THROW();
	}
	PG_END_TRY();
	LWLockRelease(&s->append_lock);
}

FelixShard *
shard_acquire(const FelixShardSpec *spec)
{
	FelixShard *s;

	s = shard_lookup(&spec->key);
	if (s == NULL)
		s = shard_allocate(spec);

	switch (shard_phase(s))
	{
		case FELIX_SHARD_OPEN:
			return s;
		case FELIX_SHARD_FAILED:
			shard_report_failed(s);
			break;
		case FELIX_SHARD_CLOSED:
			shard_open(s);
			break;
	}
	return s;
}

/*
 * Cut the log back to end before seq `end`: what a failed append or an
 * abandoned commit appended, none of it mirrored, so none of it flushed
 * or visible.  Called with the tail held.  A cut that cannot be made
 * leaves the log in a state nobody can vouch for: the shard refuses to
 * serve (FAILED) until a restart runs recovery.
 */
void
shard_cut_back(FelixShard *s, uint64 end)
{
	uint64		hwm_end;
	MemoryContext oldcxt = CurrentMemoryContext;
	char		dir[MAXPGPATH];
	char		what[NAMEDATALEN + 32];

	if (s->log.next_seq <= end)
		return;
	shard_dir(s, dir);
	snprintf(what, sizeof(what), "stream \"%s\" shard %d", s->stream_name, s->key.shard);
	SpinLockAcquire(&s->mutex);
	hwm_end = s->hwm_end;
	SpinLockRelease(&s->mutex);
	PG_TRY();
	{
		log_truncate_to(dir, what, &s->log, end, hwm_end);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		SpinLockAcquire(&s->mutex);
		snprintf(s->error, FELIX_SHARD_ERROR_LEN,
				 "records of a failed append could not be removed: %s", edata->message);
		s->phase = FELIX_SHARD_FAILED;
		SpinLockRelease(&s->mutex);
		FreeErrorData(edata);
		shard_wake_all(s);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/* ---------------------------------------------------------------------
 * Write path
 * ---------------------------------------------------------------------
 */

typedef enum Writable
{
	WRITABLE,
	WRITABLE_NOT_YET,			/* lease or assignment pending for this node */
	WRITABLE_ELSEWHERE,			/* another node leads */
	WRITABLE_EXPIRED			/* our lease ran out */
} Writable;

/*
 * Conditions 1-3 of the write rule, read once under the spinlock: this node
 * holds a lease for the shard at `expect_generation` (any, when 0), its
 * monotonic clock is before expiry - epsilon (the expiry is stored with
 * epsilon already taken off), and the shard is open at exactly that
 * generation.
 */
static Writable
shard_writable(FelixShard *s, uint64 expect_generation, uint64 *generation)
{
	FelixShardPhase phase;
	FelixRole	role;
	int64		expiry;
	bool		expired_now = false;
	Writable	result;

	SpinLockAcquire(&s->mutex);
	phase = s->phase;
	role = s->role;
	*generation = s->generation;
	expiry = s->lease_expiry_ns;
	if (role == FELIX_ROLE_LEADER && expiry != 0 &&
		felix_monotonic_ns() >= expiry)
	{
		/* The lease lapsed: forget it, so the expiry is counted once. */
		s->lease_expiry_ns = expiry = 0;
		expired_now = true;
	}
	SpinLockRelease(&s->mutex);

	if (expired_now)
		felix_count(FELIX_CTR_LEASE_EXPIRIES, 1);
	if (phase == FELIX_SHARD_FAILED)
		shard_report_failed(s);

	if (phase != FELIX_SHARD_OPEN)
		result = WRITABLE_NOT_YET;
	else if (role == FELIX_ROLE_LEADER && expiry != 0)
		result = (expect_generation == 0 || *generation == expect_generation) ?
			WRITABLE : WRITABLE_ELSEWHERE;
	else if (role == FELIX_ROLE_LEADER)
		result = expired_now ? WRITABLE_EXPIRED : WRITABLE_NOT_YET;
	else if (s->leader[0] == '\0' || felix_is_this_node(s->leader))
		result = WRITABLE_NOT_YET;
	else
		result = WRITABLE_ELSEWHERE;
	return result;
}

static void
shard_refuse_write(FelixShard *s, Writable why, uint64 generation)
{
	char		leader[NAMEDATALEN];
	char		conninfo[FELIX_CONNINFO_LEN];
	char		reason[FELIX_REASON_LEN];

	SpinLockAcquire(&s->mutex);
	strlcpy(leader, s->leader, sizeof(leader));
	strlcpy(conninfo, s->leader_conninfo, sizeof(conninfo));
	strlcpy(reason, s->unplaced_reason, sizeof(reason));
	SpinLockRelease(&s->mutex);

	if (why == WRITABLE_EXPIRED)
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_LEASE_EXPIRED),
				 errmsg("stream \"%s\" shard %d: this node's lease for generation " UINT64_FORMAT " has expired",
						s->stream_name, s->key.shard, generation),
				 errdetail("The lease was not renewed in time; the control plane may be unreachable."),
				 errhint("Retry the publish; the shard is served again once a lease is granted.")));
	if (leader[0] != '\0' && !felix_is_this_node(leader))
		ereport(ERROR,
				(errcode(FELIX_ERRCODE_NOT_LEADER),
				 errmsg("stream \"%s\" shard %d is led by node \"%s\", not by this node",
						s->stream_name, s->key.shard, leader),
				 errhint("Publish on the leader: node \"%s\" (%s).",
						 leader, felix_conninfo_mask(conninfo))));
	ereport(ERROR,
			(errcode(FELIX_ERRCODE_NOT_LEADER),
			 errmsg("stream \"%s\" shard %d has no leader with a lease on this node",
					s->stream_name, s->key.shard),
			 reason[0] ? errdetail("%s", reason) : 0,
			 errhint("felix_shards shows the shard's leader; retry once a lease is granted.")));
}

/*
 * Admission: wait (bounded) while this node is about to hold the lease --
 * just started, or just created the stream -- and refuse at once when
 * another node leads.  Returns the generation the write is admitted at.
 */
static uint64
shard_admit_write(FelixShard *s)
{
	uint64		generation;
	Writable	w = shard_writable(s, 0, &generation);
	TimestampTz deadline;

	if (w == WRITABLE)
		return generation;
	if (w != WRITABLE_NOT_YET)
		shard_refuse_write(s, w, generation);

	deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
										   felix_lease_duration + 2 * felix_heartbeat_interval);
	ConditionVariablePrepareToSleep(&s->hwm_cv);
	for (;;)
	{
		long		left;

		w = shard_writable(s, 0, &generation);
		if (w != WRITABLE_NOT_YET)
			break;
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
			break;
		ConditionVariableTimedSleep(&s->hwm_cv, Min(left, felix_heartbeat_interval),
									PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	if (w != WRITABLE)
		shard_refuse_write(s, w, generation);
	return generation;
}

/*
 * Wait until [.., upto) is durable on this node, doing the fdatasync
 * ourselves if no one else is.  As in XLogFlush, a waiter that finds the
 * flush lock taken waits for it to be released and re-checks: the holder's
 * fdatasync usually covers the waiter too, so one sync serves a group.
 */
static void
shard_flush(FelixShard *s, uint64 upto)
{
	bool		waited = false;

	for (;;)
	{
		uint64		flushed;
		uint64		target;
		uint64		base;
		char		dir[MAXPGPATH];

		SpinLockAcquire(&s->mutex);
		flushed = s->flushed_end;
		SpinLockRelease(&s->mutex);
		if (flushed >= upto)
			break;

		if (!LWLockAcquireOrWait(&s->flush_lock, LW_EXCLUSIVE))
		{
			waited = true;
			continue;
		}

		/*
		 * Snapshot what is written and where; everything before the active
		 * segment was synced when that segment was sealed.
		 */
		SpinLockAcquire(&s->mutex);
		flushed = s->flushed_end;
		target = s->written_end;
		base = s->written_base;
		SpinLockRelease(&s->mutex);

		if (flushed < upto)
		{
			char	   *what = shard_what(s);

			shard_dir(s, dir);
			log_sync(dir, what, base);
			pfree(what);

			/*
			 * With leader consistency (or a single copy) what is durable on
			 * the leader is acknowledged, so the high-water mark moves with
			 * the flush; a quorum shard's mark moves only in shard_set_hwm,
			 * once the shipper has seen the new flushed end.
			 */
			SpinLockAcquire(&s->mutex);
			if (target > s->flushed_end)
				s->flushed_end = target;
			if (shard_acks_on_flush(s) && s->role == FELIX_ROLE_LEADER &&
				s->flushed_end > s->hwm_end)
				s->hwm_end = s->flushed_end;
			SpinLockRelease(&s->mutex);
			if (s->replication_factor > 1)
				shard_wake_shipper();
		}
		LWLockRelease(&s->flush_lock);
	}
	if (waited)
		felix_count(FELIX_CTR_FLUSH_WAITS, 1);
}

void
shard_admit(FelixShard *s)
{
	(void) shard_admit_write(s);
}

/* ---------------------------------------------------------------------
 * The tail: the append lock behind the commit gate
 * ---------------------------------------------------------------------
 */

/* This backend's mark in commit_holder. */
static int
my_gate_mark(void)
{
	return MyProc->pgprocno + 1;
}

void
shard_lock_tail(FelixShard *s)
{
	for (;;)
	{
		int			holder;

		LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
		if (s->commit_holder == 0 || s->commit_holder == my_gate_mark())
			return;
		LWLockRelease(&s->append_lock);

		/* another backend's commit holds the tail: wait for its decision */
		ConditionVariablePrepareToSleep(&s->hwm_cv);
		for (;;)
		{
			SpinLockAcquire(&s->mutex);
			holder = s->commit_holder;
			SpinLockRelease(&s->mutex);
			if (holder == 0 || holder == my_gate_mark())
				break;
			ConditionVariableSleep(&s->hwm_cv, PG_WAIT_EXTENSION);
		}
		ConditionVariableCancelSleep();
	}
}

void
shard_unlock_tail(FelixShard *s)
{
	LWLockRelease(&s->append_lock);
}

static void
shard_set_gate(FelixShard *s, int holder)
{
	SpinLockAcquire(&s->mutex);
	s->commit_holder = holder;
	SpinLockRelease(&s->mutex);
}

/*
 * Append n batches at the tail, stamped at `generation`; the caller holds
 * the tail and has checked the write conditions.  If batch k fails (a full
 * disk, an I/O error), the batches before it are cut back before the
 * error goes on: a failed append leaves the log as it was.  The cut lies
 * above the high-water mark (nothing appended here is mirrored, so nothing
 * of it can have been flushed or acknowledged).  Should the cut itself
 * fail, the shard refuses to serve until a restart.  Returns the first
 * record's seq.
 */
static uint64
append_locked(FelixShard *s, uint64 generation, StringInfo *batches, int n,
			  const char *dir, const char *what)
{
	uint64		base = s->log.next_seq;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext oldcxt = CurrentMemoryContext;

	PG_TRY();
	{
		for (int i = 0; i < n; i++)
		{
			batch_stamp(batches[i]->data, s->log.next_seq, generation, now);
			log_append(dir, what, &s->log, batches[i]->data, batches[i]->len);
			felix_count(FELIX_CTR_BYTES_APPENDED, batches[i]->len);
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		shard_cut_back(s, base);
		ReThrowError(edata);
	}
	PG_END_TRY();
	return base;
}

/* The write conditions again, right before the append (the tail is held). */
static void
shard_recheck_locked(FelixShard *s, uint64 generation)
{
	uint64		now_generation;
	Writable	w = shard_writable(s, generation, &now_generation);

	/*
	 * Invariant: conditions 1-3 are checked again immediately before the
	 * bytes go down, at the generation admission saw.  Waiting for the tail
	 * can take arbitrarily long (a slow fsync, a paused process, another
	 * commit's gate), and a lease valid at admission may have lapsed by now.
	 */
	if (w != WRITABLE)
	{
		shard_unlock_tail(s);
		shard_refuse_write(s, w, now_generation);
	}
}

/* Check that each batch holds what its caller says; returns the total. */
static uint64
shard_count_batches(FelixShard *s, StringInfo *batches, const uint32 *counts, int n)
{
	uint64		total = 0;

	/* A batch that disagrees with its caller must never become durable. */
	for (int i = 0; i < n; i++)
	{
		if (counts[i] == 0 || batch_count(batches[i]->data) != counts[i])
			elog(ERROR, "felix: batch for %s claims %u records, caller expects %u",
				 shard_what(s), batch_count(batches[i]->data), counts[i]);
		total += counts[i];
	}
	Assert(n > 0);
	return total;
}

/* Durability, then acknowledgement, of records [.., end) at `generation`. */
static void
shard_acknowledge(FelixShard *s, uint64 generation, uint64 end)
{
	if (s->replication_factor > 1)
		shard_wake_shipper();
	shard_flush(s, end);
	if (!shard_acks_on_flush(s))
		shard_wait_quorum(s, generation, end);
}

uint64
shard_publish_batches(FelixShard *s, StringInfo *batches, const uint32 *counts, int n)
{
	uint64		generation;
	uint64		base;
	uint64		total = shard_count_batches(s, batches, counts, n);
	char		dir[MAXPGPATH];
	char	   *what;

	/* Admission: conditions 1-3, cheap, before queueing for the lock. */
	generation = shard_admit_write(s);

	what = shard_what(s);
	shard_dir(s, dir);

	shard_lock_tail(s);
	shard_recheck_locked(s, generation);
	base = append_locked(s, generation, batches, n, dir, what);

	/*
	 * Flushers see the new tail only now, so the batches become durable and
	 * visible together.
	 */
	shard_mirror_log(s);
	shard_unlock_tail(s);

	felix_count(FELIX_CTR_RECORDS_PUBLISHED, total);
	felix_count(FELIX_CTR_BATCHES_APPENDED, n);

	/* Durability: acknowledged once the group flush covers the batches. */
	shard_acknowledge(s, generation, base + total);
	pfree(what);
	return base;
}

/* ---------------------------------------------------------------------
 * Commits over several shards
 * ---------------------------------------------------------------------
 */

/* The parts whose gates this backend holds, for an exit in between. */
static FelixCommitPart **held_parts = NULL;
static int	nheld = 0;
static int	held_cap = 0;
static bool exit_callback_set = false;

static void
held_remember(FelixCommitPart *part)
{
	if (nheld == held_cap)
	{
		held_cap = held_cap == 0 ? 16 : held_cap * 2;
		held_parts = held_parts == NULL ?
			MemoryContextAlloc(TopMemoryContext, held_cap * sizeof(FelixCommitPart *)) :
			repalloc(held_parts, held_cap * sizeof(FelixCommitPart *));
	}
	held_parts[nheld++] = part;
}

static void
held_forget(FelixCommitPart *part)
{
	for (int i = 0; i < nheld; i++)
		if (held_parts[i] == part)
		{
			held_parts[i] = held_parts[--nheld];
			return;
		}
}

/*
 * A backend leaving while it holds gates (terminated between two shards'
 * appends) abandons them: the batches are cut back and the tails freed.
 * The parts live in the transaction's memory, which is still there.
 */
static void
commit_gates_exit(int code, Datum arg)
{
	LWLockReleaseAll();
	while (nheld > 0)
		shard_commit_abandon(held_parts[nheld - 1]);
}

void
shard_commit_append(FelixShard *s, StringInfo *batches, const uint32 *counts, int n,
					FelixCommitPart *part)
{
	uint64		total = shard_count_batches(s, batches, counts, n);
	char		dir[MAXPGPATH];
	char	   *what;

	if (!exit_callback_set)
	{
		before_shmem_exit(commit_gates_exit, (Datum) 0);
		exit_callback_set = true;
	}
	memset(part, 0, sizeof(FelixCommitPart));
	part->s = s;
	part->generation = shard_admit_write(s);
	what = shard_what(s);
	shard_dir(s, dir);

	shard_lock_tail(s);
	shard_recheck_locked(s, part->generation);
	part->base = append_locked(s, part->generation, batches, n, dir, what);
	part->end = part->base + total;
	/* held from here until publish or abandon: nobody else moves the tail */
	shard_set_gate(s, my_gate_mark());
	part->gated = true;
	held_remember(part);
	shard_unlock_tail(s);

	felix_count(FELIX_CTR_BATCHES_APPENDED, n);
	pfree(what);
}

static void
gate_release(FelixCommitPart *part)
{
	shard_set_gate(part->s, 0);
	part->gated = false;
	held_forget(part);
}

void
shard_commit_publish(FelixCommitPart *part)
{
	FelixShard *s = part->s;

	if (!part->gated)
		return;
	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
	shard_mirror_log(s);
	gate_release(part);
	LWLockRelease(&s->append_lock);
	ConditionVariableBroadcast(&s->hwm_cv);
	felix_count(FELIX_CTR_RECORDS_PUBLISHED, part->end - part->base);
}

/*
 * Never raises: it runs while another error is being handled, and at
 * exit.  A cut that fails leaves the shard FAILED (shard_cut_back) and is
 * logged; the gate is released either way.
 */
void
shard_commit_abandon(FelixCommitPart *part)
{
	FelixShard *s = part->s;
	MemoryContext oldcxt = CurrentMemoryContext;

	if (!part->gated)
		return;
	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
	PG_TRY();
	{
		shard_cut_back(s, part->base);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		ereport(WARNING,
				(errcode(edata->sqlerrcode),
				 errmsg("the records of a failed commit could not be removed: %s",
						edata->message),
				 errhint("The shard refuses to serve until the server is restarted.")));
		FreeErrorData(edata);
	}
	PG_END_TRY();
	gate_release(part);
	LWLockRelease(&s->append_lock);
	ConditionVariableBroadcast(&s->hwm_cv);
}

void
shard_commit_wait(FelixCommitPart *part)
{
	shard_acknowledge(part->s, part->generation, part->end);
}

uint64
shard_publish(FelixShard *s, StringInfo batch, uint32 count)
{
	return shard_publish_batches(s, &batch, &count, 1);
}

/*
 * Quorum acknowledgement: wait until the high-water mark covers `end`.
 * The mark moves only when every follower the control plane may take for
 * caught up holds the records, and only under a live lease (report.c,
 * shard_set_hwm), so a client is never told more than the control plane
 * knows.  Losing the leadership ends the wait at once: the answer can no
 * longer come from here.
 */
static void
shard_wait_quorum(FelixShard *s, uint64 generation, uint64 end)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   felix_quorum_timeout);

	ConditionVariable *cv = &s->ack_cv[end % FELIX_ACK_CVS];

	ConditionVariablePrepareToSleep(cv);
	for (;;)
	{
		uint64		hwm;
		uint64		now_generation;
		FelixRole	role;
		long		left;

		SpinLockAcquire(&s->mutex);
		hwm = s->hwm_end;
		now_generation = s->generation;
		role = s->role;
		SpinLockRelease(&s->mutex);

		if (hwm >= end)
			break;
		if (role != FELIX_ROLE_LEADER || now_generation != generation)
		{
			ConditionVariableCancelSleep();
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_NOT_LEADER),
					 errmsg("stream \"%s\" shard %d: leadership moved to generation " UINT64_FORMAT " while waiting for a quorum",
							s->stream_name, s->key.shard, now_generation),
					 errdetail("The records up to seq " UINT64_FORMAT " are durable on this node but were not acknowledged by a majority at generation " UINT64_FORMAT ".",
							   end - 1, generation),
					 errhint("Read the stream on the new leader to see whether the records survived, and publish again if not.")));
		}
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
		if (left <= 0)
		{
			ConditionVariableCancelSleep();
			felix_count(FELIX_CTR_QUORUM_TIMEOUTS, 1);
			ereport(ERROR,
					(errcode(FELIX_ERRCODE_QUORUM_TIMEOUT),
					 errmsg("stream \"%s\" shard %d: no quorum within felix.quorum_timeout (%d ms)",
							s->stream_name, s->key.shard, felix_quorum_timeout),
					 errdetail("The records up to seq " UINT64_FORMAT " are durable on the leader and may still reach a majority; they are not acknowledged.",
							   end - 1),
					 errhint("Check felix_replication for followers that are down or halted.")));
		}
		ConditionVariableTimedSleep(cv, left, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
}

/* ---------------------------------------------------------------------
 * Leadership from the control plane, and replication hooks
 * ---------------------------------------------------------------------
 */
bool
felix_is_this_node(const char *node)
{
	return node != NULL && strcmp(node, felix_node_name_resolved()) == 0;
}

int
shard_slot_index(FelixShard *s)
{
	return (int) (s - registry->slots);
}

void
shard_apply_assignment(FelixShard *s, const FelixAssignment *a)
{
	bool		lead = a->leader[0] != '\0' && felix_is_this_node(a->leader);
	int64		expiry = 0;

	if (a->lease_granted)
		expiry = a->sent_at_ns + (a->lease_ms - felix_lease_epsilon) * INT64CONST(1000000);

	shard_lock_tail(s);
	if (shard_phase(s) != FELIX_SHARD_OPEN)
	{
		LWLockRelease(&s->append_lock);
		return;
	}

	SpinLockAcquire(&s->mutex);
	strlcpy(s->leader, a->leader, NAMEDATALEN);
	strlcpy(s->leader_conninfo, a->leader_conninfo, FELIX_CONNINFO_LEN);
	s->nreplicas = Min(a->nreplicas, FELIX_MAX_REPLICAS);
	for (int i = 0; i < s->nreplicas; i++)
		strlcpy(s->replicas[i], a->replicas[i], NAMEDATALEN);
	strlcpy(s->unplaced_reason, a->unplaced_reason, FELIX_REASON_LEN);
	s->clustered = true;
	SpinLockRelease(&s->mutex);

	if (a->generation < s->generation)
	{
		/* Stale word from the control plane: never lower the generation. */
	}
	else if (lead && (a->generation > s->generation || s->role != FELIX_ROLE_LEADER))
	{
		char		dir[MAXPGPATH];
		char	   *what = shard_what(s);

		/*
		 * Taking the shard at a new generation.  Its start is recorded in
		 * the generation map before any write of it can exist: under the
		 * append lock the tail is exactly where the generation begins.
		 */
		shard_dir(s, dir);
		genmap_note(dir, what, a->generation, s->log.next_seq);
		pfree(what);

		SpinLockAcquire(&s->mutex);
		s->role = FELIX_ROLE_LEADER;
		s->generation = a->generation;
		s->lease_expiry_ns = expiry;
		if (shard_acks_on_flush(s) && s->flushed_end > s->hwm_end)
			s->hwm_end = s->flushed_end;
		SpinLockRelease(&s->mutex);
		if (a->generation > 1)
			felix_count(FELIX_CTR_PROMOTIONS, 1);
	}
	else if (lead)
	{
		/* Renewal at the same generation, anchored at the heartbeat's send. */
		if (a->lease_granted)
		{
			SpinLockAcquire(&s->mutex);
			if (expiry > s->lease_expiry_ns)
				s->lease_expiry_ns = expiry;
			SpinLockRelease(&s->mutex);
		}
	}
	else
	{
		SpinLockAcquire(&s->mutex);
		s->role = FELIX_ROLE_FOLLOWER;
		s->generation = a->generation;
		s->lease_expiry_ns = 0;
		SpinLockRelease(&s->mutex);
	}
	LWLockRelease(&s->append_lock);
	shard_wake_all(s);
	if (lead && s->replication_factor > 1)
		shard_wake_shipper();
}

bool
shard_set_hwm(FelixShard *s, uint64 generation, uint64 hwm_end)
{
	bool		moved = false;
	uint64		old_end = 0;

	/*
	 * Only under a live lease for the generation: the control plane grants
	 * G+1 no earlier than this lease's end, so no record is acknowledged at
	 * G once G+1 exists -- however long this process was stopped between
	 * deciding the mark and getting here.  (lease_expiry_ns already has
	 * felix.lease_epsilon taken off.)
	 */
	SpinLockAcquire(&s->mutex);
	if (s->role == FELIX_ROLE_LEADER && s->generation == generation &&
		s->lease_expiry_ns != 0 && felix_monotonic_ns() < s->lease_expiry_ns &&
		hwm_end > s->hwm_end && hwm_end <= s->flushed_end)
	{
		old_end = s->hwm_end;
		s->hwm_end = hwm_end;
		moved = true;
	}
	SpinLockRelease(&s->mutex);
	if (moved)
		shard_wake_acks(s, old_end, hwm_end);
	return moved;
}

void
shard_after_replicated(FelixShard *s, uint64 leader_hwm_end)
{
	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	s->flushed_end = s->written_end;
	if (Min(leader_hwm_end, s->flushed_end) > s->hwm_end)
		s->hwm_end = Min(leader_hwm_end, s->flushed_end);
	SpinLockRelease(&s->mutex);
}

void
shard_set_shipper_latch(Latch *latch)
{
	registry_attach();
	registry->shipper_latch = latch;
}

void
shard_wake_shipper(void)
{
	Latch	   *latch = registry->shipper_latch;

	if (latch != NULL)
		SetLatch(latch);
}

void
shard_visible(FelixShard *s, uint64 *start_seq, uint64 *hwm_end)
{
	SpinLockAcquire(&s->mutex);
	*start_seq = s->start_seq;
	*hwm_end = Max(s->hwm_end, s->start_seq);
	SpinLockRelease(&s->mutex);
}

/* ---------------------------------------------------------------------
 * Retention, truncation, drop
 * ---------------------------------------------------------------------
 */
int
shard_trim(FelixShard *s)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	int64		retention_bytes;
	int64		retention_ms;
	int			removed = 0;

	SpinLockAcquire(&s->mutex);
	retention_bytes = s->retention_bytes;
	retention_ms = s->retention_ms;
	SpinLockRelease(&s->mutex);
	if (retention_bytes <= 0 && retention_ms <= 0)
		return 0;

	shard_dir(s, dir);
	shard_lock_tail(s);
	if (shard_phase(s) == FELIX_SHARD_OPEN)
	{
		removed = log_trim(dir, what, &s->log, retention_bytes, retention_ms,
						   GetCurrentTimestamp());
		shard_mirror_log(s);
	}
	LWLockRelease(&s->append_lock);
	pfree(what);
	return removed;
}

void
shard_truncate_after(FelixShard *s, uint64 seq)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	uint64		hwm_end;

	shard_dir(s, dir);
	shard_lock_tail(s);
	if (shard_phase(s) != FELIX_SHARD_OPEN)
	{
		LWLockRelease(&s->append_lock);
		shard_report_failed(s);
	}
	SpinLockAcquire(&s->mutex);
	hwm_end = s->hwm_end;
	SpinLockRelease(&s->mutex);

	/* log_truncate_after refuses a cut at or below the high-water mark. */
	log_truncate_after(dir, what, &s->log, seq, hwm_end);
	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	if (s->flushed_end > s->written_end)
		s->flushed_end = s->written_end;
	SpinLockRelease(&s->mutex);
	LWLockRelease(&s->append_lock);
	pfree(what);
}

void
shard_forget_stream(Oid dboid, Oid relid)
{
	char		dir[MAXPGPATH];

	registry_attach();
	LWLockAcquire(&registry->lock, LW_EXCLUSIVE);
	for (int i = 0; i < registry->nslots; i++)
	{
		FelixShard *s = &registry->slots[i];

		if (s->in_use && s->key.dboid == dboid && s->key.relid == relid)
		{
			hash_search(shard_hash, &s->key, HASH_REMOVE, NULL);
			SpinLockAcquire(&s->mutex);
			s->in_use = false;
			s->phase = FELIX_SHARD_CLOSED;
			SpinLockRelease(&s->mutex);
		}
	}
	LWLockRelease(&registry->lock);
	shard_note_stream_gone();

	felix_stream_dir(dboid, relid, dir);
	log_remove_all(dir);
}

void
shard_note_stream_gone(void)
{
	registry_attach();
	pg_atomic_fetch_add_u64(&registry->streams_forgotten, 1);
}

uint64
shard_streams_forgotten(void)
{
	registry_attach();
	return pg_atomic_read_u64(&registry->streams_forgotten);
}
