/*-------------------------------------------------------------------------
 *
 * format.c
 *	  Building, stamping, checking and decoding felix batches, and the
 *	  segment file header.  format.h is the layout; this file is the code
 *	  that every other storage module uses to produce or trust those bytes.
 *
 * A batch is built in two steps because the seq is only known under the
 * shard's append lock: batch_begin/batch_add/batch_seal_body run in the
 * publishing backend without any lock (the body and its CRC are computed
 * there, and the trailer is appended), and batch_stamp, run under the lock,
 * only writes the header's position fields, the header CRC and the
 * trailer's copy of that CRC.
 *
 * Checking follows one rule: no length read from disk is used before the
 * header CRC has matched, and no record is decoded before the body CRC has
 * matched and the records have been shown to fill the body exactly.
 *
 * Batches in a segment are not aligned (no padding between them), so
 * headers and record lengths are always copied out with memcpy rather than
 * read through a cast pointer.
 *
 * Locking rule: none.  Pure functions over caller-owned memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "felix.h"
#include "storage/crc.h"
#include "storage/format.h"
#include "utils/timestamp.h"

StaticAssertDecl(sizeof(FelixGenEntry) == 24, "generation map entry is 24 bytes");
StaticAssertDecl(sizeof(FelixIndexEntry) == 16, "index entry is 16 bytes");

#define HDR_SIZE	((uint32) sizeof(FelixBatchHeader))

/* Largest body any writer produces (a whole batch is at most this). */
#define MAX_BODY_LEN	((uint32) FELIX_MAX_BATCH_BYTES)

static pg_crc32c
batch_header_crc(const FelixBatchHeader *h)
{
	pg_crc32c	crc;

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, ((const char *) h) + FELIX_BATCH_HEADER_CRC_OFFSET,
				sizeof(FelixBatchHeader) - FELIX_BATCH_HEADER_CRC_OFFSET);
	FIN_CRC32C(crc);
	return crc;
}

/* Start a batch: reserve a zeroed header at the front of buf. */
void
batch_begin(StringInfo buf)
{
	FelixBatchHeader h;

	resetStringInfo(buf);
	memset(&h, 0, sizeof(h));
	appendBinaryStringInfo(buf, (const char *) &h, sizeof(h));
}

/*
 * Append one record.  A NULL key (key == NULL or key_len < 0) is encoded as
 * FELIX_NULL_KEY.  The record count in the reserved header is kept current,
 * so batch_count() is right at any point.
 */
void
batch_add(StringInfo buf, const char *key, int32 key_len,
		  const char *payload, uint32 payload_len)
{
	uint32		lens[2];
	uint32		count;
	bool		null_key = (key == NULL || key_len < 0);

	Assert(buf->len >= (int) HDR_SIZE);

	lens[0] = null_key ? FELIX_NULL_KEY : (uint32) key_len;
	lens[1] = payload_len;
	appendBinaryStringInfo(buf, (const char *) lens, sizeof(lens));
	if (!null_key && key_len > 0)
		appendBinaryStringInfo(buf, key, key_len);
	if (payload_len > 0)
		appendBinaryStringInfo(buf, payload, payload_len);

	memcpy(&count, buf->data + offsetof(FelixBatchHeader, count), sizeof(count));
	count++;
	memcpy(buf->data + offsetof(FelixBatchHeader, count), &count, sizeof(count));
}

/*
 * Finish the body: kind, flags, body_len and body_crc, then append the
 * trailer (its header_crc copy is filled by batch_stamp).  The count was
 * kept by batch_add (a SEAL body is raw bytes appended by the caller; its
 * count stays zero).  Called once per batch: everything after the header
 * is taken as the body.
 */
void
batch_seal_body(StringInfo buf, uint16 kind)
{
	FelixBatchHeader h;
	FelixBatchTrailer t;
	pg_crc32c	crc;
	Size		body_len;

	Assert(buf->len >= (int) HDR_SIZE);
	body_len = buf->len - HDR_SIZE;
	if (body_len > MAX_BODY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("felix batch of %zu bytes is too large", body_len),
				 errdetail("A batch body may hold at most %u bytes.", MAX_BODY_LEN),
				 errhint("Publish fewer records per call.")));

	memcpy(&h, buf->data, sizeof(h));
	h.kind = kind;
	h.flags = 0;
	h.body_len = (uint32) body_len;
	INIT_CRC32C(crc);
	crc = felix_crc32c_update(crc, buf->data + HDR_SIZE, body_len);
	FIN_CRC32C(crc);
	h.body_crc = crc;
	memcpy(buf->data, &h, sizeof(h));

	t.magic = FELIX_BATCH_TRAILER_MAGIC;
	t.header_crc = 0;
	appendBinaryStringInfo(buf, (const char *) &t, sizeof(t));
}

/*
 * Fill the position fields, the magic, the header CRC and the trailer's
 * copy of it.  `batch` is a whole stored batch (batch_seal_body done): the
 * trailer sits body_len bytes after the header.
 */
void
batch_stamp(char *batch, uint64 base_seq, uint64 generation, TimestampTz ts)
{
	FelixBatchHeader h;
	FelixBatchTrailer t;

	memcpy(&h, batch, sizeof(h));
	h.magic = FELIX_BATCH_MAGIC;
	h.base_seq = base_seq;
	h.generation = generation;
	h.timestamp = ts;
	h.header_crc = batch_header_crc(&h);
	memcpy(batch, &h, sizeof(h));

	batch_trailer_make(&h, &t);
	memcpy(batch + HDR_SIZE + h.body_len, &t, sizeof(t));
}

void
batch_trailer_make(const FelixBatchHeader *h, FelixBatchTrailer *t)
{
	t->magic = FELIX_BATCH_TRAILER_MAGIC;
	t->header_crc = h->header_crc;
}

/*
 * Compare a trailer with its header.  PARTIAL (one field right) is kept
 * apart from ABSENT (neither) because recovery treats a single damaged
 * byte of a written trailer as "written", never as "unfinished".
 */
FelixTrailerCheck
batch_trailer_check(const FelixBatchHeader *h, const char *trailer)
{
	FelixBatchTrailer t;
	bool		magic_ok;
	bool		crc_ok;

	memcpy(&t, trailer, sizeof(t));
	/* zeros are what unwritten (preallocated) space reads as, never a trailer */
	if (t.magic == 0 && t.header_crc == 0)
		return FELIX_TRAILER_ABSENT;
	magic_ok = (t.magic == FELIX_BATCH_TRAILER_MAGIC);
	crc_ok = (t.header_crc == h->header_crc);
	if (magic_ok && crc_ok)
		return FELIX_TRAILER_OK;
	if (magic_ok || crc_ok)
		return FELIX_TRAILER_PARTIAL;
	return FELIX_TRAILER_ABSENT;
}

uint32
batch_count(const char *batch)
{
	uint32		count;

	memcpy(&count, batch + offsetof(FelixBatchHeader, count), sizeof(count));
	return count;
}

/*
 * Verify a batch header.  Order matters: zero test, magic, CRC, and only
 * then the fields (kind, flags, lengths), because before the CRC matched a
 * length may be whatever a torn write or a flipped bit left there.
 */
FelixHeaderCheck
batch_header_check(const FelixBatchHeader *h)
{
	const char *p = (const char *) h;
	bool		all_zero = true;

	for (int i = 0; i < (int) sizeof(FelixBatchHeader); i++)
	{
		if (p[i] != 0)
		{
			all_zero = false;
			break;
		}
	}
	if (all_zero)
		return FELIX_HDR_ZERO;
	if (h->magic != FELIX_BATCH_MAGIC)
		return FELIX_HDR_BAD_MAGIC;
	if (h->header_crc != batch_header_crc(h))
		return FELIX_HDR_BAD_CRC;

	/* The CRC matched: the fields are what a writer wrote; are they possible? */
	if (h->flags != 0 || h->body_len > MAX_BODY_LEN)
		return FELIX_HDR_BAD_FIELDS;
	switch (h->kind)
	{
		case FELIX_BATCH_RECORDS:
			/* at least one record, and each needs its 8 length bytes */
			if (h->count == 0 ||
				(uint64) h->count * FELIX_RECORD_OVERHEAD > h->body_len)
				return FELIX_HDR_BAD_FIELDS;
			/* the seqs it holds must not wrap */
			if (h->base_seq > PG_UINT64_MAX - h->count)
				return FELIX_HDR_BAD_FIELDS;
			break;
		case FELIX_BATCH_SEAL:
			if (h->count != 0 || h->body_len != sizeof(uint32))
				return FELIX_HDR_BAD_FIELDS;
			break;
		default:
			return FELIX_HDR_BAD_FIELDS;
	}
	return FELIX_HDR_OK;
}

/*
 * Verify a body against a header that passed batch_header_check: the CRC
 * first, then (RECORDS) that exactly `count` records fill body_len.
 */
bool
batch_body_check(const FelixBatchHeader *h, const char *body)
{
	pg_crc32c	crc;
	uint64		off = 0;

	INIT_CRC32C(crc);
	crc = felix_crc32c_update(crc, body, h->body_len);
	FIN_CRC32C(crc);
	if (crc != h->body_crc)
		return false;

	if (h->kind != FELIX_BATCH_RECORDS)
		return h->kind == FELIX_BATCH_SEAL && h->body_len == sizeof(uint32);

	for (uint32 i = 0; i < h->count; i++)
	{
		uint32		lens[2];
		uint64		need;

		if (off + FELIX_RECORD_OVERHEAD > h->body_len)
			return false;
		memcpy(lens, body + off, sizeof(lens));
		need = (uint64) lens[1];
		if (lens[0] != FELIX_NULL_KEY)
			need += lens[0];
		off += FELIX_RECORD_OVERHEAD;
		if (need > h->body_len - off)
			return false;
		off += need;
	}
	return off == h->body_len;
}

void
batch_iter_init(FelixBatchIter *it, const FelixBatchHeader *h, const char *body)
{
	it->header = h;
	it->body = body;
	it->offset = 0;
	it->index = 0;
}

/* Next record of a body that passed batch_body_check. */
bool
batch_iter_next(FelixBatchIter *it, FelixRecord *rec)
{
	const FelixBatchHeader *h = it->header;
	uint32		lens[2];
	const char *p;

	if (it->index >= h->count)
		return false;

	p = it->body + it->offset;
	memcpy(lens, p, sizeof(lens));
	p += FELIX_RECORD_OVERHEAD;

	rec->seq = h->base_seq + it->index;
	rec->generation = h->generation;
	rec->published_at = h->timestamp;
	if (lens[0] == FELIX_NULL_KEY)
	{
		rec->key = NULL;
		rec->key_len = 0;
	}
	else
	{
		rec->key = p;
		rec->key_len = lens[0];
		p += lens[0];
	}
	rec->payload = p;
	rec->payload_len = lens[1];
	p += lens[1];

	it->offset = (uint32) (p - it->body);
	it->index++;
	return true;
}

static pg_crc32c
segment_header_crc(const FelixSegmentHeader *h)
{
	pg_crc32c	crc;

	INIT_CRC32C(crc);
	COMP_CRC32C(crc, h, offsetof(FelixSegmentHeader, crc));
	FIN_CRC32C(crc);
	return crc;
}

void
segment_header_init(FelixSegmentHeader *h, uint64 base_seq, uint64 generation)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, FELIX_SEGMENT_MAGIC, sizeof(h->magic));
	h->version = FELIX_SEGMENT_VERSION;
	h->header_size = sizeof(FelixSegmentHeader);
	h->base_seq = base_seq;
	h->created_at = GetCurrentTimestamp();
	h->generation = generation;
	h->crc = segment_header_crc(h);
}

/* Magic, CRC, then version and size; the caller compares base_seq. */
bool
segment_header_check(const FelixSegmentHeader *h)
{
	if (memcmp(h->magic, FELIX_SEGMENT_MAGIC, sizeof(h->magic)) != 0)
		return false;
	if (h->crc != segment_header_crc(h))
		return false;
	return h->version == FELIX_SEGMENT_VERSION &&
		h->header_size == sizeof(FelixSegmentHeader);
}
