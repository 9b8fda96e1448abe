/*-------------------------------------------------------------------------
 *
 * format.h
 *	  felix's on-disk format: segment file header, batch header, record
 *	  encoding, index and generation-map entries.  docs/storage-format.md is
 *	  the prose description; this file is the authority.
 *
 * All integers are stored in host order; felix refuses to build on
 * big-endian hosts so that every node of a cluster agrees byte for byte
 * (batches are shipped between nodes unchanged).
 *
 * Pure data and pure functions: no locks, no I/O.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_FORMAT_H
#define FELIX_STORAGE_FORMAT_H

#include "postgres.h"
#include "lib/stringinfo.h"
#include "port/pg_crc32c.h"
#include "utils/timestamp.h"

#ifdef WORDS_BIGENDIAN
#error "felix's segment format is little-endian only"
#endif

/* ---- segment file: <base_seq %020llu>.seg ---- */
#define FELIX_SEGMENT_MAGIC		"FELIXSEG"	/* 8 bytes, no terminator */
#define FELIX_SEGMENT_VERSION	2	/* 2: batches end with a trailer */

typedef struct FelixSegmentHeader
{
	char		magic[8];
	uint32		version;
	uint32		header_size;	/* sizeof(FelixSegmentHeader) */
	uint64		base_seq;		/* seq of the first record in the file */
	int64		created_at;		/* TimestampTz */
	uint64		generation;		/* generation at creation (informational) */
	uint8		reserved[20];
	uint32		crc;			/* CRC-32C over the preceding 60 bytes */
} FelixSegmentHeader;

StaticAssertDecl(sizeof(FelixSegmentHeader) == 64, "segment header is 64 bytes");

/* ---- batch: header, then body_len bytes of body, then the trailer ----
 * A batch is stored as 48 + body_len + 8 bytes (batch_stored_len).  Batches
 * follow each other with no padding; the active segment file may hold
 * preallocated zero bytes after its last batch.
 */
#define FELIX_BATCH_MAGIC		0x31425846	/* "FXB1" read as little-endian */
#define FELIX_BATCH_RECORDS		1	/* body: count encoded records */
#define FELIX_BATCH_SEAL		2	/* body: uint32 CRC-32C of every byte
									 * of the file before this batch */

typedef struct FelixBatchHeader
{
	uint32		magic;
	uint32		header_crc;		/* CRC-32C over bytes [8, 48) of this header */
	uint16		kind;			/* FELIX_BATCH_* */
	uint16		flags;			/* zero */
	uint32		count;			/* records in the body; 0 for a seal */
	uint64		base_seq;		/* first record's seq; for a seal, the seq
								 * after the segment's last record */
	uint64		generation;		/* leadership generation that wrote it */
	int64		timestamp;		/* TimestampTz: when it was published */
	uint32		body_len;		/* bytes of body following the header */
	uint32		body_crc;		/* CRC-32C over the body */
} FelixBatchHeader;

StaticAssertDecl(sizeof(FelixBatchHeader) == 48, "batch header is 48 bytes");

#define FELIX_BATCH_HEADER_CRC_OFFSET	8

/*
 * The trailer closes every batch: the batch magic's end-of-batch twin and a
 * copy of the header's header_crc.  A batch is written front to back in one
 * write, so the trailer is the last thing of it to exist: a write that was
 * interrupted never leaves one, and recovery uses its presence to tell a
 * complete batch that got damaged (corruption) from an unfinished write
 * (torn tail).  It is not covered by a CRC of its own; its fields are
 * compared with the header.
 */
#define FELIX_BATCH_TRAILER_MAGIC	0x45425846	/* "FXBE" read as little-endian */

typedef struct FelixBatchTrailer
{
	uint32		magic;			/* FELIX_BATCH_TRAILER_MAGIC */
	uint32		header_crc;		/* copy of the header's header_crc */
} FelixBatchTrailer;

StaticAssertDecl(sizeof(FelixBatchTrailer) == 8, "batch trailer is 8 bytes");

/* Header plus trailer: what a batch stores besides its body. */
#define FELIX_BATCH_OVERHEAD	(sizeof(FelixBatchHeader) + sizeof(FelixBatchTrailer))

/*
 * Bytes a batch occupies in a segment (header, body, trailer).  Use it only
 * on a header whose CRC matched (batch_header_check), or as an explicitly
 * unverified claim.
 */
static inline uint64
batch_stored_len(const FelixBatchHeader *h)
{
	return (uint64) FELIX_BATCH_OVERHEAD + h->body_len;
}

/* How a trailer compares with its header (batch_trailer_check). */
typedef enum FelixTrailerCheck
{
	FELIX_TRAILER_OK,			/* magic and header_crc copy both match */
	FELIX_TRAILER_PARTIAL,		/* exactly one of the two matches */
	FELIX_TRAILER_ABSENT		/* neither matches (zeros, stale bytes) */
} FelixTrailerCheck;

/*
 * Record encoding inside a RECORDS body, repeated count times, no padding:
 *	 uint32 key_len (FELIX_NULL_KEY for a NULL key), uint32 payload_len,
 *	 key bytes, payload bytes.
 * payload bytes are the datum's varlena contents (jsonb's binary form, text
 * bytes, bytea bytes); readers rebuild the varlena around them.
 */
#define FELIX_NULL_KEY			0xFFFFFFFFu
#define FELIX_RECORD_OVERHEAD	8

/* ---- sparse index: <base_seq %020llu>.idx ----
 * A 32-byte header, then 16-byte entries {seq, offset}: the batch starting
 * at file offset `offset` of the segment has base_seq `seq`.  Entries are
 * hints only; every use verifies the batch header it points at.
 */
#define FELIX_INDEX_MAGIC		"FELIXIDX"

typedef struct FelixIndexHeader
{
	char		magic[8];
	uint32		version;
	uint32		reserved;
	uint64		base_seq;
	uint32		pad;
	uint32		crc;			/* CRC-32C over the preceding 28 bytes */
} FelixIndexHeader;

typedef struct FelixIndexEntry
{
	uint64		seq;
	uint64		offset;
} FelixIndexEntry;

StaticAssertDecl(sizeof(FelixIndexHeader) == 32, "index header is 32 bytes");

/* ---- generation map: file "generations" ----
 * 24-byte entries appended in generation order; an entry with a bad CRC
 * ends the map (a torn last entry is ignored).
 */
typedef struct FelixGenEntry
{
	uint64		generation;
	uint64		first_seq;		/* seq of the generation's first record */
	uint32		crc;			/* CRC-32C over the preceding 16 bytes */
	uint32		pad;
} FelixGenEntry;

/* One decoded record; pointers stay valid until the reader moves on. */
typedef struct FelixRecord
{
	uint64		seq;
	uint64		generation;
	TimestampTz published_at;
	const char *key;			/* NULL for a NULL key */
	uint32		key_len;
	const char *payload;
	uint32		payload_len;
} FelixRecord;

/* ---- building a batch (format.c) ----
 * batch_begin resets an initialised StringInfo and leaves room for the
 * header; batch_add appends one record; batch_seal_body (called once, after
 * the last batch_add) computes body_len/body_crc and appends the trailer
 * (no lock needed); batch_stamp fills base_seq, generation, timestamp, the
 * header CRC and the trailer's copy of it (done under the shard's append
 * lock, once the seq is known).  After batch_seal_body the buffer holds the
 * whole stored batch: buf->len == batch_stored_len(header).
 */
extern void batch_begin(StringInfo buf);
extern void batch_add(StringInfo buf, const char *key, int32 key_len,
					  const char *payload, uint32 payload_len);
extern void batch_seal_body(StringInfo buf, uint16 kind);
extern void batch_stamp(char *batch, uint64 base_seq, uint64 generation,
						TimestampTz ts);
extern uint32 batch_count(const char *batch);

/* ---- checking (format.c) ---- */
typedef enum FelixHeaderCheck
{
	FELIX_HDR_OK,
	FELIX_HDR_ZERO,				/* all zero bytes: clean end of data */
	FELIX_HDR_BAD_MAGIC,
	FELIX_HDR_BAD_CRC,
	FELIX_HDR_BAD_FIELDS		/* CRC fine, fields impossible */
} FelixHeaderCheck;

/* Verify a batch header (CRC first, then fields); never trusts a length
 * before the CRC has matched. */
extern FelixHeaderCheck batch_header_check(const FelixBatchHeader *h);
/* Verify the body against the header's body_crc and record structure. */
extern bool batch_body_check(const FelixBatchHeader *h, const char *body);
/* Compare the 8 trailer bytes at `trailer` with the header. */
extern FelixTrailerCheck batch_trailer_check(const FelixBatchHeader *h,
											 const char *trailer);
/* The trailer a header calls for (to write it, or compare with it). */
extern void batch_trailer_make(const FelixBatchHeader *h, FelixBatchTrailer *t);
/* Walk the records of a checked body in order. */
typedef struct FelixBatchIter
{
	const FelixBatchHeader *header;
	const char *body;
	uint32		offset;			/* byte offset of the next record */
	uint32		index;			/* number of records already returned */
} FelixBatchIter;

extern void batch_iter_init(FelixBatchIter *it, const FelixBatchHeader *h,
							const char *body);
extern bool batch_iter_next(FelixBatchIter *it, FelixRecord *rec);

extern void segment_header_init(FelixSegmentHeader *h, uint64 base_seq,
								uint64 generation);
extern bool segment_header_check(const FelixSegmentHeader *h);

#endif							/* FELIX_STORAGE_FORMAT_H */
