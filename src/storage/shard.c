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
#include "storage/fd.h"
#include "storage/shard.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

typedef struct FelixShardRegistry
{
	LWLock		lock;			/* guards the hash and slot allocation */
	int			tranche_id;
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
		registry->nslots = felix_max_shards;
		LWLockInitialize(&registry->lock, registry->tranche_id);
		for (int i = 0; i < felix_max_shards; i++)
		{
			FelixShard *s = &registry->slots[i];

			memset(s, 0, sizeof(FelixShard));
			LWLockInitialize(&s->append_lock, registry->tranche_id);
			LWLockInitialize(&s->flush_lock, registry->tranche_id);
			SpinLockInit(&s->mutex);
			ConditionVariableInit(&s->hwm_cv);
		}
	}

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
	static bool tranche_registered = false;

	felix_require_preload();
	if (!tranche_registered)
	{
		LWLockRegisterTranche(registry->tranche_id, "felix_shard");
		tranche_registered = true;
	}
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
	s->error[0] = '\0';
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
	return registry->nslots;
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

/*
 * Recover the shard's log and open it as this node's leader.  Called with
 * append_lock held exclusively.  On a single node the shard is led here at
 * the generation its map last recorded (1 for a new shard), with no lease
 * to expire; replication fills these in from the control plane.
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

	/*
	 * What survived a crash may still sit in the page cache only; make it
	 * durable before anything is shown to readers as acknowledged.
	 */
	if (s->log.has_active)
		log_sync(dir, what, s->log.active_base);

	nmap = genmap_load(dir, what, &map);
	generation = Max((uint64) 1, s->log.last_generation);
	if (nmap > 0)
		generation = Max(generation, map[nmap - 1].generation);

	/*
	 * Record where this leadership's generation begins while the shard is
	 * still closed to writers: it is the one moment the tail is exactly the
	 * generation's start.
	 */
	genmap_note(dir, what, generation, s->log.next_seq);

	shard_mirror_log(s);
	SpinLockAcquire(&s->mutex);
	s->role = FELIX_ROLE_LEADER;
	s->generation = generation;
	s->lease_expiry_ns = PG_INT64_MAX;
	s->flushed_end = s->log.next_seq;
	s->hwm_end = s->log.next_seq;
	s->phase = FELIX_SHARD_OPEN;
	SpinLockRelease(&s->mutex);
	felix_count(FELIX_CTR_SHARDS_RECOVERED, 1);
	ConditionVariableBroadcast(&s->hwm_cv);
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
			ConditionVariableBroadcast(&s->hwm_cv);
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

/* ---------------------------------------------------------------------
 * Write path
 * ---------------------------------------------------------------------
 */

/*
 * Conditions 1-3 of the write rule: this node leads the shard at
 * `generation` (or, at admission, at whatever generation it holds), its
 * lease has not run out by the monotonic clock, and the shard is open.
 * Returns the generation the write will be stamped with.
 */
static uint64
shard_check_writable(FelixShard *s, uint64 expect_generation)
{
	FelixShardPhase phase;
	FelixRole	role;
	uint64		generation;
	int64		expiry;

	SpinLockAcquire(&s->mutex);
	phase = s->phase;
	role = s->role;
	generation = s->generation;
	expiry = s->lease_expiry_ns;
	SpinLockRelease(&s->mutex);

	if (phase == FELIX_SHARD_FAILED)
		shard_report_failed(s);
	if (phase != FELIX_SHARD_OPEN || role != FELIX_ROLE_LEADER ||
		(expect_generation != 0 && generation != expect_generation))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" shard %d is not led by this node",
						s->stream_name, s->key.shard),
				 errhint("Publish on the shard's leader; felix_shards shows each shard's role.")));
	if (expiry != PG_INT64_MAX && felix_monotonic_ns() >= expiry)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("stream \"%s\" shard %d: this node's lease for generation " UINT64_FORMAT " has expired",
						s->stream_name, s->key.shard, generation),
				 errhint("Retry the publish; the shard is served again once a lease is granted.")));
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
			 * On a single node the shard is its own majority: what is
			 * durable here is acknowledged, so the high-water mark moves
			 * with the flush.
			 */
			SpinLockAcquire(&s->mutex);
			if (target > s->flushed_end)
				s->flushed_end = target;
			if (s->flushed_end > s->hwm_end)
				s->hwm_end = s->flushed_end;
			SpinLockRelease(&s->mutex);
			ConditionVariableBroadcast(&s->hwm_cv);
		}
		LWLockRelease(&s->flush_lock);
	}
	if (waited)
		felix_count(FELIX_CTR_FLUSH_WAITS, 1);
}

void
shard_admit(FelixShard *s)
{
	(void) shard_check_writable(s, 0);
}

uint64
shard_publish_batches(FelixShard *s, StringInfo *batches, const uint32 *counts, int n)
{
	uint64		generation;
	uint64		base;
	uint64		total = 0;
	TimestampTz now;
	char		dir[MAXPGPATH];
	char	   *what;

	/* A batch that disagrees with its caller must never become durable. */
	for (int i = 0; i < n; i++)
	{
		if (counts[i] == 0 || batch_count(batches[i]->data) != counts[i])
			elog(ERROR, "felix: batch for %s claims %u records, caller expects %u",
				 shard_what(s), batch_count(batches[i]->data), counts[i]);
		total += counts[i];
	}
	Assert(n > 0);

	/* Admission: conditions 1-3, cheap, before queueing for the lock. */
	generation = shard_check_writable(s, 0);

	what = shard_what(s);
	shard_dir(s, dir);
	now = GetCurrentTimestamp();

	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);

	/*
	 * Invariant: conditions 1-3 are checked again immediately before the
	 * bytes go down, at the generation admission saw.  Waiting for the lock
	 * can take arbitrarily long (a slow fsync, a paused process), and a
	 * lease valid at admission may have lapsed by now.
	 */
	shard_check_writable(s, generation);

	base = s->log.next_seq;
	for (int i = 0; i < n; i++)
	{
		batch_stamp(batches[i]->data, s->log.next_seq, generation, now);
		log_append(dir, what, &s->log, batches[i]->data, batches[i]->len);
		felix_count(FELIX_CTR_BYTES_APPENDED, batches[i]->len);
	}

	/*
	 * Flushers see the new tail only now, so the batches become durable and
	 * visible together.
	 */
	shard_mirror_log(s);

	LWLockRelease(&s->append_lock);

	felix_count(FELIX_CTR_RECORDS_PUBLISHED, total);
	felix_count(FELIX_CTR_BATCHES_APPENDED, n);

	/* Durability: acknowledged once the group flush covers the batches. */
	shard_flush(s, base + total);
	pfree(what);
	return base;
}

uint64
shard_publish(FelixShard *s, StringInfo batch, uint32 count)
{
	return shard_publish_batches(s, &batch, &count, 1);
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
	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
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
	LWLockAcquire(&s->append_lock, LW_EXCLUSIVE);
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

	felix_stream_dir(dboid, relid, dir);
	log_remove_all(dir);
}
