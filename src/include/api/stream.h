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

/* Install the drop hook and transaction callbacks (from _PG_init). */
extern void felix_stream_init(void);

#endif							/* FELIX_API_STREAM_H */
