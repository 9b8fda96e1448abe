/*-------------------------------------------------------------------------
 *
 * payload.h
 *	  Is a byte string the stored form of a valid value of a stream's
 *	  payload type (payload.c)?  A follower checks every record a peer ships
 *	  before storing it, so that forged bytes are refused at the door
 *	  instead of crashing whoever reads them later.
 *
 * Locking rule: none (pure function).
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CORE_PAYLOAD_H
#define FELIX_CORE_PAYLOAD_H

#include "postgres.h"

/*
 * Is data[0..len) the stored form of a valid value of type typid
 * (JSONBOID, TEXTOID or BYTEAOID)?  The stored form is the contents of the
 * value's varlena (VARDATA_ANY bytes, no varlena header); keys are checked
 * as TEXTOID.  On false, *why (palloc'd, one short English clause, no
 * trailing period, never containing the bytes themselves) says what is
 * wrong, e.g. "jsonb element 3 runs past the end of the value"; on true,
 * *why is set to NULL.  why may be NULL when the reason is not wanted.
 *
 * Never reads outside data[0..len), never crashes, never raises an ERROR
 * for bad input (only for out-of-memory or the stack-depth check that
 * bounds the recursion into nested jsonb containers).  data need not be
 * aligned.
 *
 * A jsonb value is accepted only in the exact form PostgreSQL writes it, so
 * an accepted value is byte-identical to jsonb_in(jsonb_out(value)).
 */
extern bool payload_is_valid(Oid typid, const char *data, uint32 len,
							 char **why);

/*
 * The name of a payload type ("jsonb", "text", "bytea"), or NULL when typid
 * is none of them: a domain over one, or any other type, is not a payload
 * type.
 */
extern const char *felix_payload_type_name(Oid typid);

#endif							/* FELIX_CORE_PAYLOAD_H */
