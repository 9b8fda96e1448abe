/*-------------------------------------------------------------------------
 *
 * stream.h
 *	  Stream lifecycle: creation, drop (files removed when the drop
 *	  commits) and whole-stream operations.  See stream.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_STREAM_H
#define FELIX_API_STREAM_H

#include "core/catalog.h"


/*
 * Create a stream's table and catalog row on this node, in the caller's
 * transaction (felix_create_stream, and the node agent for streams created
 * elsewhere in the cluster).  Returns the table's OID.
 */
extern Oid	felix_stream_create_local(const char *name, const char *schema,
									  const char *creation_id,
									  const char *payload_type,
									  const FelixStreamSettings *s);

/*
 * Make an existing, empty table USING felix the stream its label states
 * (a restore: seclabel.c), registering it at the control plane.
 */
extern void felix_stream_adopt(Oid relid, const FelixStreamSettings *s);

/*
 * Drop this node's table of a stream the control plane has replaced with
 * another creation of its name (the node agent): as DROP TABLE does, its
 * files at commit, without telling the control plane, which dropped that
 * creation already.
 */
extern void felix_stream_drop_superseded(const FelixStream *stream);

/* Lock a stream name until the end of the transaction (false: busy). */
extern bool felix_stream_lock_name(const char *name, bool wait);

/* Refuse a name already taken by a stream or relation on this node. */
extern void felix_stream_check_name_free(const char *name, const char *schema);

/* Install the drop hook and transaction callbacks (from _PG_init). */
extern void felix_stream_init(void);

#endif							/* FELIX_API_STREAM_H */
