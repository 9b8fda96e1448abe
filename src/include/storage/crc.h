/*-------------------------------------------------------------------------
 *
 * crc.h
 *	  CRC-32C of long buffers (crc.c): the value COMP_CRC32C computes,
 *	  faster on buffers of a few kilobytes and more.
 *
 * Locking rule: none.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_CRC_H
#define FELIX_STORAGE_CRC_H

#include "postgres.h"
#include "port/pg_crc32c.h"

/*
 * Feed len bytes into a running CRC-32C register, as
 * COMP_CRC32C(crc, data, len) does (INIT_CRC32C before, FIN_CRC32C after).
 */
extern pg_crc32c felix_crc32c_update(pg_crc32c crc, const void *data, Size len);

/* The finished CRC-32C of len bytes (of a small record, say). */
static inline pg_crc32c
felix_crc32c(const void *data, Size len)
{
	pg_crc32c	crc;

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, data, len);
	FIN_CRC32C(crc);
	return crc;
}

#endif							/* FELIX_STORAGE_CRC_H */
