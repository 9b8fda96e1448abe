/*-------------------------------------------------------------------------
 *
 * seclabel.h
 *	  The security label FOR felix that carries a stream's settings with
 *	  its table through pg_dump.  See seclabel.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_API_SECLABEL_H
#define FELIX_API_SECLABEL_H

#include "api/stream.h"

/* The label stating these settings (palloc'd JSON). */
extern char *felix_stream_label(const FelixStreamSettings *s);

/* Put the label on a stream's table (no check: felix's own write). */
extern void felix_stream_set_label(Oid relid, const FelixStreamSettings *s);

/* Register the label provider "felix" (from _PG_init). */
extern void felix_seclabel_init(void);

#endif							/* FELIX_API_SECLABEL_H */
