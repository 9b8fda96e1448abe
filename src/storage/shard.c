/*-------------------------------------------------------------------------
 *
 * shard.c
 *	  The storage side of a shard: its slot in shared memory, opening it
 *	  (recovery), its tail (the append lock behind the commit gate), the
 *	  append with its cut-back on failure, the group flush that lets one
 *	  fdatasync serve every waiting writer, the high-water mark readers are
 *	  bounded by (kept durable), and retention, truncation and drop.
 *
 *	  The storage layer below (segment.c and friends) owns the bytes; this
 *	  file owns the slot.  Who may write, and when a write counts as
 *	  acknowledged, are replication's decisions (lease.c, quorum.c,
 *	  leader.c): nothing here calls them.  Replication hears what happens
 *	  through the one notify hook (shard_set_notify).
 *
 * Locking rule: see shard.h.  In short: registry lock for the slot table;
 * the tail (append_lock behind the commit gate) for the log; flush_lock
 * for the single flusher; mark_lock for the durable mark file, taken after
 * the tail when both are held; the spinlock for the small mirrored fields.
 * No path takes two shards' LWLocks, and the tail is never held while
 * waiting for a flush, so the LWLocks of a shard never deadlock.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "felix.h"
#include "base/metrics.h"
#include "storage/incarnation.h"
#include "storage/shard.h"

typedef struct FelixShardRegistry
{
	LWLock		lock;			/* guards the hash and slot allocation */
	int			tranche_id;		/* the registry lock */
	int			append_tranche_id;	/* every shard's append_lock */
	int			flush_tranche_id;	/* every shard's flush_lock */
	int			mark_tranche_id;	/* every shard's mark_lock */
	pg_atomic_uint64 streams_changes; /* streams come or gone so far (shard.h) */
	pg_atomic_uint32 slots_used;	/* slots [0, slots_used) were ever used */
	pg_atomic_uint64 copies_begun;	/* logs opened or begun anew so far (copy_epoch) */
	pg_atomic_uint64 changes;	/* slot states changed so far (shard_changes) */
	pg_atomic_uint32 changes_armed; /* a reader awaits the next change */
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
static FelixShardNotify notify = NULL;

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
		registry->mark_tranche_id = LWLockNewTrancheId();
		pg_atomic_init_u64(&registry->streams_changes, 0);
		pg_atomic_init_u32(&registry->slots_used, 0);
		pg_atomic_init_u64(&registry->copies_begun, 0);
		pg_atomic_init_u64(&registry->changes, 0);
		pg_atomic_init_u32(&registry->changes_armed, 1);
		registry->nslots = felix_max_shards;
		LWLockInitialize(&registry->lock, registry->tranche_id);
		for (int i = 0; i < felix_max_shards; i++)
		{
			FelixShard *s = &registry->slots[i];

			memset(s, 0, sizeof(FelixShard));
			LWLockInitialize(&s->append_lock, registry->append_tranche_id);
			LWLockInitialize(&s->flush_lock, registry->flush_tranche_id);
			LWLockInitialize(&s->mark_lock, registry->mark_tranche_id);
			SpinLockInit(&s->mutex);
			ConditionVariableInit(&s->tail_cv);
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
	LWLockRegisterTranche(registry->mark_tranche_id, "felix_mark");

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

void
shard_set_notify(FelixShardNotify fn)
{
	notify = fn;
}

static void
shard_notify(FelixShard *s, FelixShardEvent event)
{
	if (notify != NULL)
		notify(s, event);
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

	/*
	 * The slot is free, so nobody holds its locks (a mark persister may
	 * look in under mark_lock, and leaves a slot not in use alone): reset
	 * it in place.
	 */
	SpinLockAcquire(&s->mutex);
	s->key = spec->key;
	strlcpy(s->stream_name, spec->stream_name, NAMEDATALEN);
	s->phase = FELIX_SHARD_CLOSED;
	s->start_seq = s->written_end = s->written_base = 0;
	s->last_generation = s->copy_epoch = 0;
	s->copy_beginnings = 0;
	s->flushed_end = s->hwm_end = s->total_bytes = 0;
	s->retention_bytes = spec->retention_bytes;
	s->retention_ms = spec->retention_ms;
	s->commit_holder = 0;
	s->error[0] = '\0';
	s->copy_stale = false;
	s->diverged_at = PG_UINT64_MAX;
	s->hwm_persisted = 0;
	memset(&s->log, 0, sizeof(FelixLogState));
	s->role = FELIX_ROLE_FOLLOWER;
	s->generation = 0;
	s->lease_expiry_ns = 0;
	s->genmap_unsynced = false;
	s->consistency = spec->consistency;
	s->replication_factor = spec->replication_factor;
	s->leader[0] = '\0';
	s->leader_conninfo[0] = '\0';
	s->nreplicas = 0;
	s->joining[0] = s->leaving[0] = '\0';
	s->unplaced_reason[0] = '\0';
	s->clustered = false;
	s->handing_to[0] = '\0';
	s->lease_released_ns = 0;
	s->acked_generation = 0;
	s->acked_end = 0;
	s->in_use = true;
	SpinLockRelease(&s->mutex);
	shard_note_changed();

	LWLockRelease(&registry->lock);
	return s;
}

void
shard_read(FelixShard *s, FelixShardView *v)
{
	SpinLockAcquire(&s->mutex);
	v->key = s->key;
	memcpy(v->stream_name, s->stream_name, NAMEDATALEN);
	v->in_use = s->in_use;
	v->phase = s->phase;
	v->start_seq = s->start_seq;
	v->written_end = s->written_end;
	v->written_base = s->written_base;
	v->flushed_end = s->flushed_end;
	v->hwm_end = s->hwm_end;
	v->total_bytes = s->total_bytes;
	v->retention_bytes = s->retention_bytes;
	v->retention_ms = s->retention_ms;
	v->role = s->role;
	v->generation = s->generation;
	v->lease_expiry_ns = s->lease_expiry_ns;
	v->consistency = s->consistency;
	v->replication_factor = s->replication_factor;
	memcpy(v->leader, s->leader, NAMEDATALEN);
	memcpy(v->leader_conninfo, s->leader_conninfo, FELIX_CONNINFO_LEN);
	v->nreplicas = Min(s->nreplicas, FELIX_MAX_REPLICAS);
	memcpy(v->replicas, s->replicas, sizeof(v->replicas));
	memcpy(v->joining, s->joining, NAMEDATALEN);
	memcpy(v->leaving, s->leaving, NAMEDATALEN);
	memcpy(v->unplaced_reason, s->unplaced_reason, FELIX_REASON_LEN);
	v->clustered = s->clustered;
	memcpy(v->handing_to, s->handing_to, NAMEDATALEN);
	v->acked_generation = s->acked_generation;
	v->acked_end = s->acked_end;
	memcpy(v->error, s->error, FELIX_SHARD_ERROR_LEN);
	v->copy_stale = s->copy_stale;
	v->diverged_at = s->diverged_at;
	SpinLockRelease(&s->mutex);
}

void
shard_read_positions(FelixShard *s, FelixShardPositions *p)
{
	SpinLockAcquire(&s->mutex);
	p->key = s->key;
	p->in_use = s->in_use;
	p->phase = s->phase;
	p->start_seq = s->start_seq;
	p->written_end = s->written_end;
	p->last_generation = s->last_generation;
	p->copy_epoch = s->copy_epoch;
	p->copy_first = s->copy_beginnings == 1;
	p->flushed_end = s->flushed_end;
	p->hwm_end = s->hwm_end;
	p->total_bytes = s->total_bytes;
	p->diverged_at = s->diverged_at;
	p->role = s->role;
	p->generation = s->generation;
	p->lease_expiry_ns = s->lease_expiry_ns;
	p->consistency = s->consistency;
	p->replication_factor = s->replication_factor;
	p->nreplicas = s->nreplicas;
	p->acked_generation = s->acked_generation;
	p->acked_end = s->acked_end;
	p->copy_stale = s->copy_stale;
	memcpy(p->leader, s->leader, NAMEDATALEN);
	memcpy(p->joining, s->joining, NAMEDATALEN);
	memcpy(p->leaving, s->leaving, NAMEDATALEN);
	SpinLockRelease(&s->mutex);
}

void
shard_read_ends(FelixShard *s, FelixShardEnds *e)
{
	memset(e, 0, sizeof(*e));	/* padding too: callers compare with memcmp */
	SpinLockAcquire(&s->mutex);
	e->key = s->key;
	e->in_use = s->in_use;
	e->phase = s->phase;
	e->written_end = s->written_end;
	e->flushed_end = s->flushed_end;
	e->last_generation = s->last_generation;
	e->copy_epoch = s->copy_epoch;
	e->copy_first = s->copy_beginnings == 1;
	SpinLockRelease(&s->mutex);
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

int
shard_slot_index(FelixShard *s)
{
	return (int) (s - registry->slots);
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
	bool		changed;

	SpinLockAcquire(&s->mutex);
	/* (a pass of retention that removed nothing changes nothing) */
	changed = s->start_seq != s->log.start_seq || s->written_end != s->log.next_seq ||
		s->last_generation != s->log.last_generation;
	s->start_seq = s->log.start_seq;
	s->written_end = s->log.next_seq;
	s->last_generation = s->log.last_generation;
	s->written_base = s->log.active_base;
	s->total_bytes = s->log.total_bytes;
	SpinLockRelease(&s->mutex);
	if (changed)
		shard_note_changed();
}

/*
 * A new copy epoch: the log of a slot is continuous -- nothing it held
 * since was lost -- for as long as its copy_epoch stays the same (shard.h).
 * Numbers are unique within a server start and never reused in it.
 */
static uint64
next_copy_epoch(void)
{
	return pg_atomic_add_fetch_u64(&registry->copies_begun, 1);
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

void
shard_check_serving(FelixShard *s)
{
	char		error[FELIX_SHARD_ERROR_LEN];

	SpinLockAcquire(&s->mutex);
	if (s->phase != FELIX_SHARD_FAILED)
	{
		SpinLockRelease(&s->mutex);
		return;
	}
	strlcpy(error, s->error, sizeof(error));
	SpinLockRelease(&s->mutex);
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("stream \"%s\" shard %d refuses to serve: its log is damaged",
					s->stream_name, s->key.shard),
			 errdetail("%s", error),
			 errhint("Restore the damaged segment from a replica or a backup, then restart the server.")));
}

/* Stop serving: the log is in a state nobody can vouch for. */
static void
shard_fail(FelixShard *s, const char *why)
{
	SpinLockAcquire(&s->mutex);
	snprintf(s->error, FELIX_SHARD_ERROR_LEN, "%s", why);
	s->phase = FELIX_SHARD_FAILED;
	SpinLockRelease(&s->mutex);
	shard_note_changed();
	ConditionVariableBroadcast(&s->tail_cv);
}

/*
 * Recover a replicated shard's copy made under an older incarnation of
 * this node.  Nothing counts on such a copy (its leader replaces it), and
 * one restored from a base backup may be damaged past its tail: the
 * backup copied segments while batches were appended to them, so a batch
 * half written when it was read can have whole ones after it.  Damage
 * there does not stop the shard: the copy is discarded, and the shard
 * opens empty, as this incarnation's, to be filled by its leader like a
 * new replica's.  Returns true if it did so.  A single copy is the only
 * one there is and is never discarded here (its damage is reported).
 */
static bool
recover_stale_copy(FelixShard *s, const char *dir, const char *what)
{
	MemoryContext oldcxt = CurrentMemoryContext;
	ErrorData  *edata;

	PG_TRY();
	{
		log_recover(dir, what, &s->log);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode != ERRCODE_DATA_CORRUPTED)
			PG_RE_THROW();
		FlushErrorState();
		ereport(LOG,
				(errmsg("%s: its copy, made under an older incarnation of this node, is damaged; it is discarded",
						what),
				 errdetail("%s", edata->message),
				 errhint("The shard's leader ships the whole log to this node again.")));
		FreeErrorData(edata);
		log_discard(dir, what, &s->log, 0, 0);
		incarnation_stamp_write(dir, what);
		return true;
	}
	PG_END_TRY();
	return false;
}

/*
 * Recover the shard's log and open it.  Called with the tail held.  The
 * shard opens as a follower at the newest generation its log or map
 * knows: only the control plane makes it a leader (lease.c), even on a
 * single node whose control plane is embedded.
 *
 * What readers may see after a start: with one copy, everything durable
 * here (acknowledged or not, it is the only copy); with several, what this
 * replica last knew to be acknowledged -- its durable high-water mark --
 * and nothing above it until a leader says more, because the tail of a
 * replica may be a proposal no majority ever adopted.
 */
static void
shard_open_locked(FelixShard *s)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	uint64		generation;
	uint64		persisted;
	uint64		diverged_at;
	FelixGenEntry *map;
	int			nmap;
	char		stamp[FELIX_INCARNATION_LEN];
	char		incarnation[FELIX_INCARNATION_LEN];
	bool		stale;

	shard_dir(s, dir);

	/* whose copy is this?  unstamped: ours from now on */
	incarnation_stamp_read(dir, stamp);
	felix_incarnation(incarnation, NULL);
	stale = stamp[0] != '\0' && strcmp(stamp, incarnation) != 0;
	if (stale && s->replication_factor > 1)
		stale = !recover_stale_copy(s, dir, what);
	else
		log_recover(dir, what, &s->log);
	if (stamp[0] == '\0')
		incarnation_stamp_write(dir, what);

	nmap = genmap_load(dir, what, &map);
	generation = s->log.last_generation;
	if (nmap > 0)
		generation = Max(generation, map[nmap - 1].generation);
	persisted = log_hwm_read(dir, &diverged_at);
	if (persisted > s->log.next_seq)
		ereport(WARNING,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("%s: its log ends at seq %llu, before the high-water mark %llu it had made durable",
						what, (unsigned long long) s->log.next_seq,
						(unsigned long long) persisted),
				 errdetail("Acknowledged records are missing from this replica."),
				 errhint("Rebuild this replica from the shard's leader.")));

	shard_mirror_log(s);
	LWLockAcquire(&s->mark_lock, LW_EXCLUSIVE);
	s->hwm_persisted = persisted;
	SpinLockAcquire(&s->mutex);
	s->copy_epoch = next_copy_epoch();
	s->copy_beginnings++;
	s->role = FELIX_ROLE_FOLLOWER;
	s->generation = generation;
	s->lease_expiry_ns = 0;
	s->flushed_end = s->log.next_seq;
	if (s->replication_factor <= 1)
		s->hwm_end = s->log.next_seq;
	else
		s->hwm_end = Max(s->log.start_seq, Min(persisted, s->log.next_seq));
	s->copy_stale = stale;
	s->diverged_at = diverged_at;
	s->opened_end = s->log.next_seq;
	s->checked_end = s->log.start_seq;
	s->phase = FELIX_SHARD_OPEN;
	SpinLockRelease(&s->mutex);
	LWLockRelease(&s->mark_lock);
	shard_note_changed();
	felix_count(FELIX_CTR_SHARDS_RECOVERED, 1);
	ConditionVariableBroadcast(&s->tail_cv);
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
			shard_check_serving(s);
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
			shard_fail(s, edata->message);
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
			shard_check_serving(s);
			break;
		case FELIX_SHARD_CLOSED:
			shard_open(s);
			break;
	}
	return s;
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
		ConditionVariablePrepareToSleep(&s->tail_cv);
		for (;;)
		{
			SpinLockAcquire(&s->mutex);
			holder = s->commit_holder;
			SpinLockRelease(&s->mutex);
			if (holder == 0 || holder == my_gate_mark())
				break;
			ConditionVariableSleep(&s->tail_cv, PG_WAIT_EXTENSION);
		}
		ConditionVariableCancelSleep();
	}
}

bool
shard_lock_tail_nowait_gate(FelixShard *s)
{
	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
	return s->commit_holder != 0 && s->commit_holder != my_gate_mark();
}

/*
 * The tail, for a change that needs the shard open: a copy whose discard
 * failed meanwhile (closed, to be opened again at its next use) or a
 * failed one is not changed through what this backend looked up before.
 */
void
shard_lock_tail_open(FelixShard *s)
{
	shard_lock_tail(s);
	if (shard_phase(s) == FELIX_SHARD_OPEN)
		return;
	shard_unlock_tail(s);
	shard_check_serving(s);
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("stream \"%s\" shard %d was closed while this call waited for it",
					s->stream_name, s->key.shard),
			 errhint("The next call opens it again, if the stream still exists.")));
}

void
shard_unlock_tail(FelixShard *s)
{
	LWLockRelease(&s->append_lock);
}

void
shard_unlock_tail_if_held(FelixShard *s)
{
	if (LWLockHeldByMe(&s->append_lock))
		LWLockRelease(&s->append_lock);
}

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
		char	   *why;

		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		why = psprintf("records of a failed append could not be removed: %s", edata->message);
		shard_fail(s, why);
		FreeErrorData(edata);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

uint64
shard_append_locked(FelixShard *s, uint64 generation, StringInfo *batches, int n,
					const TimestampTz *stamps, int64 at)
{
	uint64		base;
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext oldcxt = CurrentMemoryContext;
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);

	if (at >= 0 && s->log.next_seq != s->log.start_seq)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: cannot restore records into it: the shard already holds records (its next seq is " UINT64_FORMAT ")",
						what, s->log.next_seq),
				 errdetail("Restored records keep the seqs they were dumped with; felix never renumbers them."),
				 errhint("Restore into a stream that holds no records: a fresh database, or drop and restore the stream.")));
	if (at >= 0 && (uint64) at != s->log.start_seq)
	{
		/*
		 * The dump begins past seq 0 (retention had removed the records
		 * before it): the empty shard begins where the dump does, as a
		 * copy bootstrapped from a trimmed leader does.  Nothing is
		 * discarded but an empty log.
		 */
		shard_begin_at_locked(s, (uint64) at, generation);
	}
	base = s->log.next_seq;
	shard_dir(s, dir);
	PG_TRY();
	{
		for (int i = 0; i < n; i++)
		{
			batch_stamp(batches[i]->data, s->log.next_seq, generation,
						stamps ? stamps[i] : now);
			log_append(dir, what, &s->log, batches[i]->data, batches[i]->len);
			felix_count(FELIX_CTR_BYTES_APPENDED, batches[i]->len);
		}
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/*
		 * Nothing appended was published, so none of it was flushed, read
		 * or shipped, and the cut lies above the high-water mark: a failed
		 * append leaves the log as it was.
		 */
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		FlushErrorState();
		shard_cut_back(s, base);
		ReThrowError(edata);
	}
	PG_END_TRY();
	felix_count(FELIX_CTR_BATCHES_APPENDED, n);
	pfree(what);
	return base;
}

void
shard_publish_tail(FelixShard *s)
{
	shard_mirror_log(s);
	shard_notify(s, FELIX_SHARD_PUBLISHED);
}

/* ---------------------------------------------------------------------
 * The commit gate
 * ---------------------------------------------------------------------
 */

/* The gates this backend holds, with where each would be cut back to. */
typedef struct HeldGate
{
	FelixShard *s;
	uint64		cut_to;
} HeldGate;

static HeldGate *held = NULL;
static int	nheld = 0;
static int	held_cap = 0;
static bool exit_callback_set = false;

static int
held_find(FelixShard *s)
{
	for (int i = 0; i < nheld; i++)
		if (held[i].s == s)
			return i;
	return -1;
}

/* Release the gate of held[i] (tail held): publish, or cut back. */
static void
gate_release_at(int i, bool publish)
{
	FelixShard *s = held[i].s;
	uint64		cut_to = held[i].cut_to;
	MemoryContext oldcxt = CurrentMemoryContext;

	held[i] = held[--nheld];
	if (publish)
		shard_publish_tail(s);
	else
	{
		PG_TRY();
		{
			shard_cut_back(s, cut_to);
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			/* never raises: it runs while another error is handled, and at exit */
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
	}
	SpinLockAcquire(&s->mutex);
	s->commit_holder = 0;
	SpinLockRelease(&s->mutex);
	ConditionVariableBroadcast(&s->tail_cv);
}

/*
 * A backend leaving while it holds gates (terminated between two shards'
 * appends) cuts them back: none of those batches was ever published.
 */
static void
held_gates_exit(int code, Datum arg)
{
	LWLockReleaseAll();
	while (nheld > 0)
		shard_release_gate(held[nheld - 1].s, false);
}

void
shard_hold_gate(FelixShard *s, uint64 cut_to)
{
	if (!exit_callback_set)
	{
		before_shmem_exit(held_gates_exit, (Datum) 0);
		exit_callback_set = true;
	}
	if (nheld == held_cap)
	{
		held_cap = held_cap == 0 ? 16 : held_cap * 2;
		held = held == NULL ?
			MemoryContextAlloc(TopMemoryContext, held_cap * sizeof(HeldGate)) :
			repalloc(held, held_cap * sizeof(HeldGate));
	}
	held[nheld].s = s;
	held[nheld].cut_to = cut_to;
	nheld++;
	SpinLockAcquire(&s->mutex);
	s->commit_holder = my_gate_mark();
	SpinLockRelease(&s->mutex);
}

void
shard_release_gate(FelixShard *s, bool publish)
{
	int			i = held_find(s);

	if (i < 0)
		return;
	/* the gate is ours: the lock is all there is to take */
	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
	gate_release_at(i, publish);
	LWLockRelease(&s->append_lock);
}

/* ---------------------------------------------------------------------
 * Durability
 * ---------------------------------------------------------------------
 */
void
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

			SpinLockAcquire(&s->mutex);
			if (target > s->flushed_end)
				s->flushed_end = target;
			SpinLockRelease(&s->mutex);
			shard_note_changed();
			shard_notify(s, FELIX_SHARD_FLUSHED);
		}
		LWLockRelease(&s->flush_lock);
	}
	if (waited)
		felix_count(FELIX_CTR_FLUSH_WAITS, 1);
}

/* ---------------------------------------------------------------------
 * What readers see
 * ---------------------------------------------------------------------
 */
void
shard_unchecked(FelixShard *s, uint64 *lo, uint64 *hi)
{
	SpinLockAcquire(&s->mutex);
	*lo = Max(s->checked_end, s->start_seq);
	*hi = s->opened_end;
	SpinLockRelease(&s->mutex);
}

void
shard_set_checked(FelixShard *s, uint64 opened_end, uint64 checked_end)
{
	SpinLockAcquire(&s->mutex);
	if (s->phase == FELIX_SHARD_OPEN && s->opened_end == opened_end &&
		checked_end > s->checked_end)
		s->checked_end = checked_end;
	SpinLockRelease(&s->mutex);
}

void
shard_visible(FelixShard *s, uint64 *start_seq, uint64 *end)
{
	SpinLockAcquire(&s->mutex);
	*start_seq = s->start_seq;
	*end = Max(Min(s->hwm_end, s->diverged_at), s->start_seq);
	SpinLockRelease(&s->mutex);
}

/*
 * Write the durable mark file: hwm_end (at least the last one made
 * durable) and the divergence point, both as they are now.  Called with
 * mark_lock held; releases it, also on error.
 */
static void
shard_write_mark(FelixShard *s)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	FelixShardPositions v;

	shard_dir(s, dir);
	shard_read_positions(s, &v);
	PG_TRY();
	{
		uint64		hwm_end = Max(v.hwm_end, s->hwm_persisted);

		log_hwm_write(dir, what, hwm_end, v.diverged_at);
		s->hwm_persisted = hwm_end;
	}
	PG_FINALLY();
	{
		LWLockRelease(&s->mark_lock);
	}
	PG_END_TRY();
	pfree(what);
}

void
shard_mark_diverged_locked(FelixShard *s, uint64 at)
{
	LWLockAcquire(&s->mark_lock, LW_EXCLUSIVE);
	SpinLockAcquire(&s->mutex);
	s->diverged_at = Min(s->diverged_at, at);
	SpinLockRelease(&s->mutex);
	/* durable at once: a restart must not serve it again */
	shard_write_mark(s);
}

uint64
shard_advance_hwm(FelixShard *s, uint64 hwm_end,
				  bool (*only_if) (FelixShard *s, void *arg), void *arg)
{
	uint64		old_end;
	bool		moved;

	SpinLockAcquire(&s->mutex);
	old_end = s->hwm_end;
	if (hwm_end > s->hwm_end && hwm_end <= s->flushed_end &&
		(only_if == NULL || only_if(s, arg)))
		s->hwm_end = hwm_end;
	moved = s->hwm_end != old_end;
	SpinLockRelease(&s->mutex);
	if (moved)
		shard_note_changed();
	return old_end;
}

/*
 * Not under the tail: appends and shipments go on while the mark file is
 * fdatasync'd.  mark_lock orders this write with the paths that change the
 * file or the slot under it (divergence, discard, open, forgetting the
 * stream), which hold it while they do.
 */
void
shard_persist_hwm(FelixShard *s)
{
	FelixShardPositions v;

	/* a cheap look first: most shards are not replicated, or not open */
	shard_read_positions(s, &v);
	if (!v.in_use || v.phase != FELIX_SHARD_OPEN || v.replication_factor <= 1)
		return;
	LWLockAcquire(&s->mark_lock, LW_EXCLUSIVE);
	shard_read_positions(s, &v);
	if (v.in_use && v.phase == FELIX_SHARD_OPEN && v.hwm_end > s->hwm_persisted)
		shard_write_mark(s);
	else
		LWLockRelease(&s->mark_lock);
}

void
shard_after_replicated(FelixShard *s, uint64 leader_hwm_end)
{
	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	s->flushed_end = s->written_end;
	SpinLockRelease(&s->mutex);
	shard_note_changed();
	(void) shard_advance_hwm(s, leader_hwm_end, NULL, NULL);
}

void
shard_begin_at_locked(FelixShard *s, uint64 start_seq, uint64 generation)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	MemoryContext oldcxt = CurrentMemoryContext;

	shard_dir(s, dir);
	/* no mark of the old copy is written into the new one */
	LWLockAcquire(&s->mark_lock, LW_EXCLUSIVE);
	PG_TRY();
	{
		log_discard(dir, what, &s->log, start_seq, generation);
		incarnation_stamp_write(dir, what);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		/*
		 * Half a copy is no copy, and the slot's view of it is gone with
		 * it.  But nothing on disk vouches for more than it holds (the
		 * mark went first, and what is left of the old segments is an
		 * unbroken, shorter run), so the shard is closed, not failed:
		 * the next use opens what is on disk as a restart would, and its
		 * leader ships again.  A discard that failed for want of space
		 * (the fault harness, seed 5096) is so retried once there is
		 * some, without a restart.  Closed under mark_lock: no mark is
		 * written in between.
		 */
		SpinLockAcquire(&s->mutex);
		s->phase = FELIX_SHARD_CLOSED;
		SpinLockRelease(&s->mutex);
		LWLockRelease(&s->mark_lock);
		shard_note_changed();
		ConditionVariableBroadcast(&s->tail_cv);
		MemoryContextSwitchTo(oldcxt);
		edata = CopyErrorData();
		ereport(LOG,
				(errmsg("%s: its copy could not be discarded; the shard is opened again from disk at its next use",
						what),
				 errdetail("%s", edata->message)));
		FreeErrorData(edata);
		PG_RE_THROW();
	}
	PG_END_TRY();
	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	s->copy_epoch = next_copy_epoch();
	s->copy_beginnings++;
	s->flushed_end = s->hwm_end = start_seq;
	s->copy_stale = false;
	s->diverged_at = PG_UINT64_MAX;
	SpinLockRelease(&s->mutex);
	s->hwm_persisted = 0;
	LWLockRelease(&s->mark_lock);
	shard_note_changed();
	pfree(what);
}

void
shard_claim_copy_locked(FelixShard *s)
{
	char		dir[MAXPGPATH];
	char	   *what;

	if (!s->copy_stale)
		return;
	what = shard_what(s);
	shard_dir(s, dir);
	incarnation_stamp_write(dir, what);
	SpinLockAcquire(&s->mutex);
	s->copy_stale = false;
	SpinLockRelease(&s->mutex);
	pfree(what);
}

void
shard_mark_stale_copies(void)
{
	char		incarnation[FELIX_INCARNATION_LEN];

	felix_incarnation(incarnation, NULL);
	for (int i = 0; i < shard_count_slots(); i++)
	{
		FelixShard *s = shard_slot(i);
		char		dir[MAXPGPATH];
		char		stamp[FELIX_INCARNATION_LEN];

		/* a flag, not the tail: never wait for a commit's gate (heartbeat) */
		(void) shard_lock_tail_nowait_gate(s);
		if (s->in_use && shard_phase(s) == FELIX_SHARD_OPEN)
		{
			shard_dir(s, dir);
			incarnation_stamp_read(dir, stamp);
			SpinLockAcquire(&s->mutex);
			s->copy_stale = strcmp(stamp, incarnation) != 0;
			SpinLockRelease(&s->mutex);
		}
		shard_unlock_tail(s);
	}
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
	shard_unlock_tail(s);
	pfree(what);
	return removed;
}

/* Remove every record from seq `cut` on (keeping [start, cut)). */
void
shard_truncate_to_locked(FelixShard *s, uint64 cut)
{
	char		dir[MAXPGPATH];
	char	   *what = shard_what(s);
	uint64		hwm_end;

	shard_dir(s, dir);
	LWLockAcquire(&s->mark_lock, LW_SHARED);
	SpinLockAcquire(&s->mutex);
	hwm_end = Max(s->hwm_end, s->hwm_persisted);
	SpinLockRelease(&s->mutex);
	LWLockRelease(&s->mark_lock);

	/*
	 * INVARIANT: nothing at or below the high-water mark -- in memory or
	 * the last one made durable -- is ever cut; log_truncate_to refuses.
	 */
	log_truncate_to(dir, what, &s->log, cut, hwm_end);
	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	if (s->flushed_end > s->written_end)
		s->flushed_end = s->written_end;
	SpinLockRelease(&s->mutex);
	shard_note_changed();
	pfree(what);
}

void
shard_truncate_after(FelixShard *s, uint64 seq)
{
	shard_lock_tail(s);
	if (shard_phase(s) != FELIX_SHARD_OPEN)
	{
		shard_unlock_tail(s);
		shard_check_serving(s);
		elog(ERROR, "felix: stream \"%s\" shard %d is not open", s->stream_name, s->key.shard);
	}
	shard_truncate_to_locked(s, seq + 1);	/* seq < 2^63 (felix.truncate_after) */
	shard_unlock_tail(s);
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
			/* a mark persister is done with it before its files go */
			LWLockAcquire(&s->mark_lock, LW_EXCLUSIVE);
			SpinLockAcquire(&s->mutex);
			s->in_use = false;
			s->phase = FELIX_SHARD_CLOSED;
			SpinLockRelease(&s->mutex);
			LWLockRelease(&s->mark_lock);
			shard_note_changed();
		}
	}
	LWLockRelease(&registry->lock);
	shard_note_streams_changed();

	felix_stream_dir(dboid, relid, dir);
	log_remove_all(dir);
}

void
shard_note_streams_changed(void)
{
	registry_attach();
	pg_atomic_fetch_add_u64(&registry->streams_changes, 1);
}

uint64
shard_streams_changes(void)
{
	registry_attach();
	return pg_atomic_read_u64(&registry->streams_changes);
}

/*
 * Called after the change is made and its spinlock released.  Every append
 * calls it, from every backend: it counts only the first change after a
 * reader asked (changes_armed), so that the publish path reads a word that
 * seldom changes instead of writing one all of them share.  The barrier
 * orders the change before the look at the flag.
 */
void
shard_note_changed(void)
{
	registry_attach();
	pg_memory_barrier();
	if (pg_atomic_read_u32(&registry->changes_armed) == 0)
		return;
	pg_atomic_write_u32(&registry->changes_armed, 0);
	pg_atomic_fetch_add_u64(&registry->changes, 1);
}

/*
 * The count, with the next change armed to move it.  A change made before
 * the flag is set but after the count is read is one the caller's look at
 * the slots, which comes after, sees; one made later moves the count.
 */
uint64
shard_changes(void)
{
	uint64		count;

	registry_attach();
	count = pg_atomic_read_u64(&registry->changes);
	pg_atomic_write_u32(&registry->changes_armed, 1);
	pg_memory_barrier();
	return count;
}
