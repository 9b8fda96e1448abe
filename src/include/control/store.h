/*-------------------------------------------------------------------------
 *
 * store.h
 *	  The control-plane store: the small interface every control-plane
 *	  rule is written over (docs/control-plane.md).  Keys are text, values
 *	  are JSON text, every change bumps a store-wide revision, and a key's
 *	  mod_revision is the revision that last wrote it.  Two operations:
 *
 *	  - a linearizable read of one key or of every key under a prefix;
 *	  - a transaction: if every compare holds (a key's mod_revision equals
 *		the one given; 0 means the key must not exist), apply every put and
 *		delete at one new revision, else apply nothing.
 *
 *	  Two stores implement it: the embedded one (store_table.c: a table in
 *	  the control-plane database, used by the felix.cp_* functions running
 *	  there) and etcd (store_etcd.c: the v3 JSON gateway over libcurl,
 *	  used by a node's own processes).  Which one a process uses is fixed
 *	  by felix.etcd_endpoints.
 *
 *	  Every call reports a failure at the caller's elevel (ERROR raises; a
 *	  worker passes LOG and carries on) and returns what it knows.
 *
 * Locking rule: none here.  The embedded store serializes transactions
 * with a table lock held to the end of the calling transaction; etcd
 * serializes them itself.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_STORE_H
#define FELIX_CONTROL_STORE_H

#include "postgres.h"

/* One key as read. */
typedef struct FelixKV
{
	char	   *key;
	char	   *value;
	int64		mod_revision;
} FelixKV;

/* A transaction's condition: key's mod_revision == mod_revision (0: absent). */
typedef struct FelixStoreCmp
{
	const char *key;
	int64		mod_revision;
} FelixStoreCmp;

/* A transaction's change: put value at key, or delete key (value NULL). */
typedef struct FelixStoreOp
{
	const char *key;
	const char *value;
} FelixStoreOp;

typedef enum FelixStoreStatus
{
	FELIX_STORE_OK,				/* read done / transaction applied */
	FELIX_STORE_CONFLICT,		/* a compare failed: nothing applied */
	FELIX_STORE_FAILED,			/* not done, nothing applied (reported) */
	FELIX_STORE_UNKNOWN			/* a transaction that may or may not have
								 * applied: read again to know (reported) */
} FelixStoreStatus;

typedef struct FelixStoreMethods
{
	const char *name;			/* "embedded" or "etcd" */
	FelixStoreStatus (*range) (const char *key, bool prefix, bool guarded,
							   int64 changed_after,
							   FelixKV **kvs, int *nkvs, int64 *revision,
							   int elevel);
	FelixStoreStatus (*page) (const char *after, int limit, FelixKV **kvs,
							  int *nkvs, bool *more, int64 *revision, int elevel);
	FelixStoreStatus (*txn) (const FelixStoreCmp *cmps, int ncmps,
							 const FelixStoreOp *ops, int nops,
							 int64 *revision, int elevel);
	void		(*serialize) (void);
} FelixStoreMethods;

extern const FelixStoreMethods felix_store_table;
extern const FelixStoreMethods felix_store_etcd;

/* True when felix.etcd_endpoints names an etcd cluster. */
extern bool felix_store_is_etcd(void);

/*
 * Read key (or, with prefix, every key starting with it, in byte order)
 * into a palloc'd array; *revision is the store's revision as of the read.
 */
extern FelixStoreStatus felix_store_range(const char *key, bool prefix,
										  FelixKV **kvs, int *nkvs,
										  int64 *revision, int elevel);

/*
 * The same, for a rule that decides nothing on the read that a
 * compare-and-set does not check: the store may answer from a member's
 * own copy, a moment behind (etcd's serializable read, no Raft round).
 * What the rule then writes compares the revisions it read, so a stale
 * read makes the transaction fail and the rule read again -- at once,
 * with felix_store_range.
 */
extern FelixStoreStatus felix_store_range_guarded(const char *key, bool prefix,
												  FelixKV **kvs, int *nkvs,
												  int64 *revision, int elevel);

/*
 * At most limit keys after `after` ("": from the first), in key order, and
 * whether more follow: the whole state a page at a time, each page read
 * at its own revision (*revision).
 */
extern FelixStoreStatus felix_store_range_page(const char *after, int limit,
											   FelixKV **kvs, int *nkvs, bool *more,
											   int64 *revision, int elevel);
/*
 * A section a reader of what changed reads apart (apart, NULL: none): for
 * its keys written after changed_after rather than the reader's, and, when
 * only_key is set, for that one key alone.  complete_to then holds for
 * the section as of its own changed_after, and, with only_key, for that
 * key only: the reader keeps track of what it left unread.
 */
typedef struct FelixStoreApart
{
	const char *section;		/* as marked: "ends/" */
	int64		changed_after;
	const char *only_key;
} FelixStoreApart;

/*
 * The keys under prefix whose mod_revision is above changed_after, in no
 * particular order, and more (the marks, and keys written meanwhile): what
 * changed since a reader last read them all.  *complete_to: every change
 * up to this revision is in what was read.  It reads the marks (every
 * transaction marks each section it writes: FELIX_STORE_MARKS plus the
 * key up to its first '/', or the whole key), then only the sections
 * marked after changed_after -- with etcd, whose range reads every key it
 * spans before it filters them, this is what keeps the cost of a read
 * with what changed.  A deletion does not show in it; every transaction
 * that deletes also puts FELIX_STORE_KEY_DELETIONS, so a reader that
 * finds that key among the changes knows something went away and reads
 * everything again.  guarded: as felix_store_range_guarded.
 */
extern FelixStoreStatus felix_store_range_changed(const char *prefix, int64 changed_after,
												  bool guarded,
												  const FelixStoreApart *apart,
												  FelixKV **kvs, int *nkvs,
												  int64 *revision, int64 *complete_to,
												  int elevel);

#define FELIX_STORE_MARKS	"marks/"
/* Put by every transaction that deletes a key (felix_store_txn). */
#define FELIX_STORE_KEY_DELETIONS	"deletions"

/*
 * How many of this process's transactions found a compare that did not
 * hold.  With the embedded store, whose rules compare under its lock,
 * one means the state they read was not the store's.
 */
extern uint64 felix_store_conflicts(void);

/* Apply ops at one new revision (*revision) if every compare holds. */
extern FelixStoreStatus felix_store_txn(const FelixStoreCmp *cmps, int ncmps,
										const FelixStoreOp *ops, int nops,
										int64 *revision, int elevel);

/*
 * Called by a rule before it reads what it will decide on: the embedded
 * store takes its transaction lock now, so the rule's compares cannot
 * fail (callers of one database queue instead of retrying); etcd does
 * nothing, and a rule that loses a compare reads again.
 */
extern void felix_store_serialize(void);

/*
 * Has this transaction written to the embedded store?  Its reads after
 * that saw writes that an abort undoes.
 */
extern bool felix_store_table_wrote(void);

/* The store this process uses (etcd, or the table in this database). */
extern const FelixStoreMethods *felix_store(void);

/*
 * The store's health as this process last saw it, for felix_nodes: the
 * endpoint that last answered, the etcd leader it named, and the last
 * failure ("" when the last request succeeded).
 */
typedef struct FelixStoreHealth
{
	char		endpoint[256];
	char		leader[64];
	char		last_error[256];
	int64		last_ok_ns;		/* felix_monotonic_ns of the last success */
} FelixStoreHealth;

extern const FelixStoreHealth *felix_store_health(void);

/* etcd: ask the endpoint that answers who leads (fills health.leader). */
extern bool felix_store_etcd_status(int elevel);

/* At start: refuse an unusable felix.etcd_* setting (FATAL, no secrets). */
extern void felix_store_check_settings(void);

#endif							/* FELIX_CONTROL_STORE_H */
