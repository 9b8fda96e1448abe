/*-------------------------------------------------------------------------
 *
 * incarnation.h
 *	  The identity of this node's felix data directory: a random id
 *	  created with the directory (its incarnation) and a count of the
 *	  server starts it has seen.  A wiped or replaced directory gets a new
 *	  incarnation; one restored from an old copy carries a start count
 *	  lower than the control plane last saw, and is given a new one.  Each
 *	  shard's copy is stamped with the incarnation it was made under, so a
 *	  copy older than the node's incarnation is known not to be trusted.
 *	  See incarnation.c.
 *
 * Locking rule: the shared copy is written under its spinlock (at startup
 * and when the incarnation is renewed) and read under it.  Stamps are
 * written with the shard's tail held.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_INCARNATION_H
#define FELIX_STORAGE_INCARNATION_H

#include "postgres.h"

/* A uuid in text form, with its terminator. */
#define FELIX_INCARNATION_LEN	37

extern Size incarnation_shmem_size(void);
/* Read (or create) the identity file, counting this start. */
extern void incarnation_shmem_init(void);

/* This node's incarnation and start count (and this start's boot id),
 * copied out; the pointers but buf may be NULL. */
extern void felix_incarnation(char *buf, uint64 *boots);
extern void felix_incarnation_boot(char *buf, uint64 *boots, char *boot_id);

/* Does felix.node_conninfo reach this very node: 1 yes, -1 another node
 * (or incarnation), 0 not known yet.  Set by whoever checked. */
extern int	felix_conninfo_verified(void);
extern void felix_set_conninfo_verified(int verdict);

/*
 * The control plane saw a later start of this incarnation than this
 * directory remembers: it is a restored copy.  Give it a new incarnation
 * (durably), so nothing it holds counts as the old one's.
 */
extern void felix_incarnation_renew(void);

/*
 * What this directory has seen of its control-plane store: its id ("" if
 * none) and the highest revision seen in it.  _note raises it (a new id
 * replaces the old); _persist (the heartbeat worker) writes it durably,
 * reporting a failure at elevel (false if it returns).
 */
extern void felix_store_seen(char *store_id, uint64 *revision);
extern void felix_store_seen_note(const char *store_id, uint64 revision);
extern bool felix_store_seen_persist(int elevel);

/* The incarnation a shard's copy in dir was made under; "" if unstamped. */
extern void incarnation_stamp_read(const char *dir, char *buf);
/* Stamp the copy in dir with this node's incarnation (durably). */
extern void incarnation_stamp_write(const char *dir, const char *what);

#endif							/* FELIX_STORAGE_INCARNATION_H */
