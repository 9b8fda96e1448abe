/*-------------------------------------------------------------------------
 *
 * crc.c
 *	  CRC-32C over long buffers, three streams at a time.
 *
 *	  Every read of a batch checks its body CRC, and startup checks whole
 *	  sealed segments, so the CRC of large buffers is on the read path.
 *	  PostgreSQL's COMP_CRC32C feeds the SSE 4.2 crc32 instruction one
 *	  8-byte word after another; each step waits for the previous one's
 *	  result (about three cycles), while the processor could start one
 *	  every cycle.  Here a long buffer is cut into rounds of three equal
 *	  stripes whose CRCs are computed in one interleaved loop, then joined:
 *	  the CRC register is linear in its input, so the register after
 *	  stripes A, B, C equals shift(shift(crc(A)) ^ crc0(B)) ^ crc0(C), where
 *	  crc0 starts from a zero register and shift() is the effect of
 *	  FELIX_CRC_STRIPE zero bytes -- a fixed linear map, applied through
 *	  four byte-indexed tables built once per process from 32 basis vectors
 *	  run through COMP_CRC32C itself.
 *
 *	  The result is the same value COMP_CRC32C computes (the tests rely on
 *	  it: every stored CRC was written by one and is checked by the other).
 *	  Without SSE 4.2, or off x86-64, it simply is COMP_CRC32C.
 *
 * Locking rule: none; the tables are this process's, built on first use.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/crc.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FELIX_CRC_3WAY 1
#include <nmmintrin.h>
#endif

#ifdef FELIX_CRC_3WAY

/* Bytes per stripe; a round is three stripes. */
#define FELIX_CRC_STRIPE	1024

static uint32 shift_tab[4][256];
static int	crc_mode = 0;		/* 0: not decided yet, 1: three-way, -1: plain */

static void
crc_decide(void)
{
	static const char zeros[FELIX_CRC_STRIPE];
	uint32		basis[32];

	if (!__builtin_cpu_supports("sse4.2"))
	{
		crc_mode = -1;
		return;
	}
	/* where FELIX_CRC_STRIPE zero bytes take each single-bit register */
	for (int j = 0; j < 32; j++)
	{
		pg_crc32c	r = ((uint32) 1) << j;

		COMP_CRC32C(r, zeros, FELIX_CRC_STRIPE);
		basis[j] = r;
	}
	for (int k = 0; k < 4; k++)
		for (int b = 0; b < 256; b++)
		{
			uint32		v = 0;

			for (int bit = 0; bit < 8; bit++)
				if (b & (1 << bit))
					v ^= basis[8 * k + bit];
			shift_tab[k][b] = v;
		}
	crc_mode = 1;

	/* never trust it without proof: one long buffer, both ways */
	{
		char		probe[3 * FELIX_CRC_STRIPE + 13];
		pg_crc32c	fast = 0xFFFFFFFF;
		pg_crc32c	plain = 0xFFFFFFFF;

		for (int i = 0; i < (int) sizeof(probe); i++)
			probe[i] = (char) (i * 131 + (i >> 7));
		fast = felix_crc32c_update(fast, probe, sizeof(probe));
		COMP_CRC32C(plain, probe, sizeof(probe));
		if (fast != plain)
		{
			crc_mode = -1;
			elog(WARNING, "felix: the three-way CRC-32C disagrees with PostgreSQL's; using PostgreSQL's");
		}
	}
}

static inline uint32
crc_shift(uint32 r)
{
	return shift_tab[0][r & 0xff] ^ shift_tab[1][(r >> 8) & 0xff] ^
		shift_tab[2][(r >> 16) & 0xff] ^ shift_tab[3][r >> 24];
}

__attribute__((target("sse4.2")))
static uint32
crc_rounds(uint32 crc, const char *p, Size rounds)
{
	for (Size n = 0; n < rounds; n++)
	{
		const char *a = p;
		const char *b = p + FELIX_CRC_STRIPE;
		const char *c = p + 2 * FELIX_CRC_STRIPE;
		uint64		ra = crc,
					rb = 0,
					rc = 0;

		for (int off = 0; off < FELIX_CRC_STRIPE; off += 8)
		{
			uint64		wa,
						wb,
						wc;

			memcpy(&wa, a + off, 8);
			memcpy(&wb, b + off, 8);
			memcpy(&wc, c + off, 8);
			ra = _mm_crc32_u64(ra, wa);
			rb = _mm_crc32_u64(rb, wb);
			rc = _mm_crc32_u64(rc, wc);
		}
		crc = crc_shift(crc_shift((uint32) ra) ^ (uint32) rb) ^ (uint32) rc;
		p += 3 * FELIX_CRC_STRIPE;
	}
	return crc;
}

#endif							/* FELIX_CRC_3WAY */

pg_crc32c
felix_crc32c_update(pg_crc32c crc, const void *data, Size len)
{
	const char *p = data;

#ifdef FELIX_CRC_3WAY
	if (len >= 3 * FELIX_CRC_STRIPE)
	{
		if (crc_mode == 0)
			crc_decide();
		if (crc_mode > 0)
		{
			Size		rounds = len / (3 * FELIX_CRC_STRIPE);

			crc = crc_rounds(crc, p, rounds);
			p += rounds * 3 * FELIX_CRC_STRIPE;
			len -= rounds * 3 * FELIX_CRC_STRIPE;
		}
	}
#endif
	COMP_CRC32C(crc, p, len);
	return crc;
}
