/*-------------------------------------------------------------------------
 *
 * report_queue.c
 *	  The hand-over of replica reports from the ship worker to the report
 *	  worker ("felix report", started only with the etcd control-plane
 *	  store), in shared memory.  With the embedded store the ship worker
 *	  sends felix.cp_report without waiting (a pipelined libpq request);
 *	  with etcd the report rule takes a read and a transaction -- a Raft
 *	  commit -- so the report worker makes it, and the ship worker goes on
 *	  shipping meanwhile.
 *
 *	  The protocol: the ship worker, with no request pending, writes the
 *	  JSON into the slot, bumps req_seq and sets the report worker's latch
 *	  (report_queue_submit); the report worker takes it
 *	  (report_queue_take), runs felix_cp_report, writes the outcome, sets
 *	  done_seq and wakes the ship worker (report_queue_finish).  A request
 *	  the ship worker gave up on (it took longer than its timeout) finishes
 *	  all the same; its outcome is for an old number and is not taken for a
 *	  newer request's.  The ship worker counts a report as landed only from
 *	  the outcome of its own request, and treats one that timed out as
 *	  possibly committed, as it does a libpq request (report.c).
 *
 * Locking rule: the slot's spinlock guards the numbers, the outcome and
 * the latch pointer; the JSON buffer belongs to whichever side the
 * numbers say (writer while req_seq == done_seq, reader otherwise).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "base/wake.h"
#include "felix.h"
#include "miscadmin.h"
#include "replication/report_queue.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "storage/spin.h"

/* Room per shard slot for its rows (followers x one JSON object each). */
#define REPORT_BYTES_PER_SHARD	(8 * 320)

typedef struct ReporterShared
{
	slock_t		mutex;
	Latch	   *latch;			/* the reporter's, while it runs */
	uint64		req_seq;		/* last request handed over */
	uint64		done_seq;		/* last request finished */
	int64		token;
	int			accepted;		/* of done_seq: rows written, -1 failed */
	char		error[256];
	Size		cap;
	Size		len;
	char		json[FLEXIBLE_ARRAY_MEMBER];
} ReporterShared;

static ReporterShared *rep = NULL;

static Size
json_capacity(void)
{
	return (Size) felix_max_shards * REPORT_BYTES_PER_SHARD + 16;
}

Size
report_queue_shmem_size(void)
{
	return MAXALIGN(offsetof(ReporterShared, json) + json_capacity());
}

void
report_queue_shmem_init(void)
{
	bool		found;

	rep = ShmemInitStruct("felix reporter", report_queue_shmem_size(), &found);
	if (!found)
	{
		memset(rep, 0, offsetof(ReporterShared, json));
		SpinLockInit(&rep->mutex);
		rep->cap = json_capacity();
	}
}

uint64
report_queue_submit(const char *json, int64 token)
{
	Size		len = strlen(json);
	Latch	   *latch;
	uint64		seq = 0;

	if (rep == NULL || len + 1 > rep->cap)
		return 0;
	SpinLockAcquire(&rep->mutex);
	latch = rep->latch;
	if (latch != NULL && rep->req_seq == rep->done_seq)
	{
		/* nothing pending: the buffer is ours to write */
		SpinLockRelease(&rep->mutex);
		memcpy(rep->json, json, len + 1);
		SpinLockAcquire(&rep->mutex);
		rep->len = len;
		rep->token = token;
		seq = ++rep->req_seq;
	}
	SpinLockRelease(&rep->mutex);
	if (seq != 0)
		SetLatch(latch);
	return seq;
}

bool
report_queue_busy(void)
{
	bool		busy;

	SpinLockAcquire(&rep->mutex);
	busy = rep->latch != NULL && rep->req_seq != rep->done_seq;
	SpinLockRelease(&rep->mutex);
	return busy;
}

bool
report_queue_outcome(uint64 seq, int *accepted, char *error, Size errlen)
{
	bool		done;

	SpinLockAcquire(&rep->mutex);
	done = rep->done_seq >= seq;
	if (done)
	{
		*accepted = rep->done_seq == seq ? rep->accepted : -1;
		strlcpy(error, rep->done_seq == seq ? rep->error : "superseded", errlen);
	}
	SpinLockRelease(&rep->mutex);
	return done;
}

static void
queue_exit(int code, Datum arg)
{
	SpinLockAcquire(&rep->mutex);
	rep->latch = NULL;
	/* a request it will not finish: let the ship worker see it failed */
	if (rep->req_seq != rep->done_seq)
	{
		rep->done_seq = rep->req_seq;
		rep->accepted = -1;
		strlcpy(rep->error, "the report worker exited", sizeof(rep->error));
	}
	SpinLockRelease(&rep->mutex);
}

void
report_queue_attach(void)
{
	SpinLockAcquire(&rep->mutex);
	rep->latch = MyLatch;
	/* whatever was pending belonged to an earlier report worker: it failed */
	rep->done_seq = rep->req_seq;
	SpinLockRelease(&rep->mutex);
	before_shmem_exit(queue_exit, (Datum) 0);
}

char *
report_queue_take(uint64 *seq, int64 *token)
{
	bool		pending;

	SpinLockAcquire(&rep->mutex);
	*seq = rep->req_seq;
	pending = *seq != rep->done_seq;
	*token = pending ? rep->token : 0;
	SpinLockRelease(&rep->mutex);
	return pending ? pnstrdup(rep->json, rep->len) : NULL;
}

void
report_queue_finish(uint64 seq, int accepted, const char *error)
{
	SpinLockAcquire(&rep->mutex);
	rep->accepted = accepted;
	strlcpy(rep->error, error, sizeof(rep->error));
	rep->done_seq = seq;
	SpinLockRelease(&rep->mutex);
	felix_wake(FELIX_WORKER_SHIP);
}
