/*-------------------------------------------------------------------------
 *
 * log_internal.h
 *	  Private interface between the files of the storage layer (segment.c,
 *	  index.c, recovery.c, reader.c, retention.c, truncate.c, genmap.c).
 *	  Nothing outside src/storage/ includes this; log.h is the public face.
 *
 * Locking rule: as in log.h.  Functions taking a FelixLogState * run under
 * the shard's append lock; the buffered file reader (FelixSegFile), the
 * index lookup and the directory listing take no lock and only read.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_STORAGE_LOG_INTERNAL_H
#define FELIX_STORAGE_LOG_INTERNAL_H

#include "postgres.h"
#include "storage/format.h"
#include "storage/log.h"
#include "utils/wait_event.h"

#define SEG_HEADER_SIZE		((uint64) sizeof(FelixSegmentHeader))
#define BATCH_HEADER_SIZE	((uint64) sizeof(FelixBatchHeader))
#define BATCH_TRAILER_SIZE	((uint64) sizeof(FelixBatchTrailer))
/* a whole stored seal batch: header, 4-byte body, trailer */
#define SEAL_BATCH_SIZE		(BATCH_HEADER_SIZE + sizeof(uint32) + BATCH_TRAILER_SIZE)
#define INDEX_HEADER_SIZE	((uint64) sizeof(FelixIndexHeader))

/* Read sizes: readers stream in 256 kB chunks, whole-file checks in 1 MB. */
#define FELIX_READ_CHUNK	(256 * 1024)
#define FELIX_VERIFY_CHUNK	(1024 * 1024)

#define FELIX_GENMAP_FILE	"generations"

/* ---- paths and directory (segment.c) ---- */
extern void felix_segment_path(char *buf, const char *dir, uint64 base);
extern void felix_index_path(char *buf, const char *dir, uint64 base);
/* Sorted bases of the *.seg files; 0 (and *bases NULL) if dir is missing. */
extern int	felix_list_segments(const char *dir, const char *what, uint64 **bases);
/* mkdir -p, making each new level durable in its parent. */
extern void felix_ensure_dir(const char *dir, const char *what);

/* ---- plain I/O with retries on short transfers (segment.c) ---- */
extern bool felix_pwrite_all(int fd, const void *buf, Size len, uint64 off);
/* Bytes read (short only at end of file); -1 with errno on error. */
extern ssize_t felix_pread_all(int fd, void *buf, Size len, uint64 off);
extern uint64 felix_fd_size(int fd, const char *path);
extern void felix_fdatasync(int fd, const char *path, const char *what);
/* Unlink a file (ENOENT is fine); errors are raised. */
extern void felix_unlink(const char *path, const char *what);

/* Create the segment beginning at st->next_seq and make it the active one. */
extern void segment_create(const char *dir, const char *what, FelixLogState *st,
						   uint64 generation);

/* Drop this backend's cached descriptors for a shard directory. */
extern void felix_fd_cache_forget(const char *dir);

/* ---- errors (recovery.c) ---- */
extern void felix_report_corruption(const char *what, const char *path,
									uint64 offset, const char *detail)
			pg_attribute_noreturn();
extern const char *felix_header_problem(FelixHeaderCheck c);

/* ---- buffered sequential reader over one file (reader.c) ---- */
typedef struct FelixSegFile
{
	int			fd;				/* -1 when closed */
	char		path[MAXPGPATH];
	const char *what;
	char	   *buf;
	Size		cap;			/* allocated bytes of buf */
	Size		chunk;			/* preferred read size */
	uint64		buf_off;		/* file offset of buf[0] */
	Size		buf_len;		/* valid bytes in buf */
} FelixSegFile;

/* Open path read-only; returns false on ENOENT when missing_ok. */
extern bool segfile_open(FelixSegFile *sf, const char *path, const char *what,
						 Size chunk, bool missing_ok);
extern void segfile_close(FelixSegFile *sf);
/* Pointer to bytes [off, off+len), or NULL if the file ends first. */
extern const char *segfile_get(FelixSegFile *sf, uint64 off, Size len);
/* Copy a batch header at off into *h; false if fewer than 48 bytes remain. */
extern bool segfile_header(FelixSegFile *sf, uint64 off, FelixBatchHeader *h);

/* ---- sparse index (index.c) ---- */
typedef struct FelixIndexBuild
{
	FelixIndexEntry *entries;
	int			n;
	int			cap;
	uint64		mark;			/* offset of the last entry's batch */
} FelixIndexBuild;

extern void fxidx_build_init(FelixIndexBuild *b);
/* Consider the batch at off (seq); adds an entry by the interval rule. */
extern void fxidx_build_note(FelixIndexBuild *b, uint64 seq, uint64 off);
extern void fxidx_build_free(FelixIndexBuild *b);
/* The interval rule itself, shared with log_append. */
extern bool fxidx_wants_entry(uint64 off, uint64 mark);

/* Read the index file; false if missing or its header/size is wrong. */
extern bool fxidx_read(const char *dir, uint64 base,
					   FelixIndexEntry **entries, int *n);
/* Entries ordered, inside [header, data_end), last one at a real batch. */
extern bool fxidx_entries_valid(FelixSegFile *sf, uint64 base,
								const FelixIndexEntry *entries, int n,
								uint64 data_end);
/* Replace the index file's contents in place (O_TRUNC); sync if asked. */
extern void fxidx_write(const char *dir, const char *what, uint64 base,
						const FelixIndexEntry *entries, int n, bool sync);
/* Create an index file holding only its header; returns an O_APPEND fd. */
extern int	fxidx_create(const char *dir, const char *what, uint64 base);
/* Open an existing index file for appending (creating it if missing). */
extern int	fxidx_open_append(const char *dir, const char *what, uint64 base);
/* Append one entry through an O_APPEND fd; failures only LOG (a hint). */
extern void fxidx_append_entry(int fd, const char *dir, uint64 base,
							   uint64 seq, uint64 offset);
/* Walk a segment from its first batch and rewrite its index. */
extern void fxidx_rebuild(FelixSegFile *sf, const char *dir, const char *what,
						  uint64 base, bool sync);
/* Make a just-sealed segment's index whole and durable. */
extern void fxidx_finish_sealed(const char *dir, const char *what,
								uint64 base, uint64 seal_offset);
/*
 * Best verified (seq, offset) with seq <= target for segment `base`, read
 * through sf (already open on the segment).  A wrong index is rebuilt when
 * rebuild_ok (sealed segments), else the segment start is returned.
 */
extern void fxidx_seek(FelixSegFile *sf, const char *dir, const char *what,
					   uint64 base, uint64 target, bool rebuild_ok,
					   uint64 *seq, uint64 *offset);

/* ---- strict walk over a segment believed intact (index.c) ---- */
typedef struct FelixWalk
{
	uint64		end_offset;		/* end of the last batch walked */
	uint64		end_seq;		/* seq after the last record */
	bool		sealed;			/* ended with a seal batch */
	uint32		seal_crc;		/* the seal body, when sealed */
	uint64		last_generation;	/* of the last RECORDS batch; 0 if none */
	TimestampTz last_timestamp; /* of the last RECORDS batch; 0 if none */
	uint64		last_batch_offset;	/* of the last RECORDS batch; 0 if none */
	int			batches;		/* RECORDS batches walked */
} FelixWalk;

/*
 * Walk batches from (off, seq) to end of file or the seal, checking every
 * header (and body when check_bodies; the trailer whenever the batch is
 * read, i.e. with check_bodies or crc, and for the seal) and seq
 * continuity; any defect is reported as corruption.  The file must end at
 * its last batch (sealed segments and freshly truncated ones do): zero
 * bytes after it are reported as stray bytes.  Adds index entries to ib and
 * extends *crc over the walked bytes when given.
 */
extern void segment_walk(FelixSegFile *sf, const char *what, uint64 off,
						 uint64 seq, bool check_bodies, FelixIndexBuild *ib,
						 pg_crc32c *crc, FelixWalk *w);
/* Newest RECORDS batch of a sealed segment, found via its index. */
extern void segment_last_batch(const char *dir, const char *what, uint64 base,
							   FelixWalk *w);

/* ---- generation map (genmap.c) ---- */
/* Drop entries whose first_seq >= cut (log truncated to [start, cut)). */
extern void genmap_truncate(const char *dir, const char *what, uint64 cut);

#endif							/* FELIX_STORAGE_LOG_INTERNAL_H */
