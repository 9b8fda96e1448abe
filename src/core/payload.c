/*-------------------------------------------------------------------------
 *
 * payload.c
 *	  Decide whether a byte string is the stored form of a valid value of a
 *	  stream's payload type (jsonb, text or bytea), or of a key (text).
 *
 *	  felix stores a record's key and payload as the contents of the
 *	  value's varlena (VARDATA_ANY bytes, no header).  A follower stores
 *	  what its leader ships; bytes forged or damaged on the way would be
 *	  read later by jsonb_out, the jsonb operators or the text functions,
 *	  which trust their input and may crash or read out of bounds on it.
 *	  So every record is checked here before it is stored, and refused with
 *	  a reason if it is not one PostgreSQL itself could have written:
 *
 *	  - bytea: any bytes.
 *	  - text: valid in the database encoding, with no NUL byte.
 *	  - jsonb: exactly a JsonbContainer as PostgreSQL 15 lays it out
 *		(utils/jsonb.h, jsonb_util.c's convertJsonb*), nothing more or less:
 *		header flags and count; the JEntry array inside the value; an end
 *		offset in every JB_OFFSET_STRIDE'th JEntry and a length in the
 *		others; entries contiguous, inside the data area and filling it;
 *		entry types; strings valid in the database encoding without NUL;
 *		numerics (after zero INTALIGN padding) in make_result's normal
 *		form; booleans and nulls without data; nested containers (after
 *		zero INTALIGN padding) checked the same way, the raw-scalar flag
 *		only on a top-level one-element array holding a scalar; object keys
 *		strings, strictly increasing in jsonb key order (shorter first, then
 *		bytewise).  Such a value is byte-identical to
 *		jsonb_in(jsonb_out(value)), so nothing that reads it can tell it
 *		from one made by jsonb_in.
 *
 *	  Every length and offset is bounds-checked before it is used, and the
 *	  bytes are read with memcpy: felix's buffers are not aligned.  The
 *	  work is linear in the length of the value.  Nested containers are
 *	  walked by recursion, one small frame per level, bounded by
 *	  check_stack_depth(): its ERROR (like out-of-memory) is the only one
 *	  raised here.  The frame is kept smaller than what jsonb_in and
 *	  convertToJsonb need per level, so that a value PostgreSQL managed to
 *	  build does not hit the limit here first.
 *
 * Locking rule: none (pure function).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "core/payload.h"

/*
 * jsonb_util.c's limits on the elements of an array and the pairs of an
 * object (private there): jsonb_in refuses to build more.
 */
#define PAYLOAD_JSONB_MAX_ELEMS (Min(MaxAllocSize / sizeof(JsonbValue), JB_CMASK))
#define PAYLOAD_JSONB_MAX_PAIRS (Min(MaxAllocSize / sizeof(JsonbPair), JB_CMASK))

/*
 * The numeric storage format, as numeric.c lays it out (private there): a
 * 4-byte varlena header, a uint16 header word, in the long form an int16
 * weight, then the base-NBASE digits, an int16 each.  The top two bits of
 * the header word tell the form: long positive, long negative, short, or
 * special (NaN and the infinities).  The short form packs the sign, the
 * display scale and the weight into the header word; the long form has the
 * sign and the display scale there.
 */
#define NUM_SIGN_MASK			0xC000
#define NUM_POS					0x0000
#define NUM_NEG					0x4000
#define NUM_SHORT				0x8000
#define NUM_SPECIAL				0xC000

#define NUM_SHORT_SIGN_MASK		0x2000
#define NUM_SHORT_DSCALE_MASK	0x1F80
#define NUM_SHORT_DSCALE_SHIFT	7
#define NUM_SHORT_DSCALE_MAX	(NUM_SHORT_DSCALE_MASK >> NUM_SHORT_DSCALE_SHIFT)
#define NUM_SHORT_WEIGHT_SIGN_MASK	0x0040
#define NUM_SHORT_WEIGHT_MASK	0x003F
#define NUM_SHORT_WEIGHT_MAX	NUM_SHORT_WEIGHT_MASK
#define NUM_SHORT_WEIGHT_MIN	(-(NUM_SHORT_WEIGHT_MASK + 1))

#define NUM_DSCALE_MASK			0x3FFF

#define NUM_HDRSZ_SHORT			(VARHDRSZ + sizeof(uint16))
#define NUM_HDRSZ				(VARHDRSZ + sizeof(uint16) + sizeof(int16))

#define NUM_NBASE				10000
#define NUM_DEC_DIGITS			4

/* What a jsonb walk carries from container to container. */
typedef struct JsonbWalk
{
	int			encoding;		/* the database encoding */
	char	  **why;			/* where to put the reason, or NULL */
} JsonbWalk;

/*
 * One container being checked.  container_is_valid keeps one of these per
 * level of nesting and little else, so that its stack frame is small: a
 * value nested as deep as jsonb_in can build must not run into the stack
 * depth limit here.
 */
typedef struct ContainerWalk
{
	const char *area;			/* the data area, after the JEntry array */
	uint32		area_len;
	uint32		count;			/* elements, or pairs */
	uint32		nentries;		/* JEntries: count, or 2 * count */
	uint32		index;			/* the entry being checked */
	uint32		offset;			/* where its data begins in the data area */
	uint32		key_offset;		/* the last object key checked, if any */
	uint32		key_len;
	uint32		child_offset;	/* entry_next: a nested container ... */
	uint32		child_len;		/* ... of this many bytes, or 0 if none */
	int			depth;			/* 0 for the top-level container */
	bool		is_object;
	bool		is_scalar;
} ContainerWalk;

static bool refuse(char **why, const char *fmt,...) pg_attribute_printf(2, 3);
static bool refuse_container(JsonbWalk *w, int depth,
							 const char *fmt,...) pg_attribute_printf(3, 4);
static bool refuse_entry(JsonbWalk *w, const ContainerWalk *c,
						 const char *fmt,...) pg_attribute_printf(3, 4);

/* Set *why to the formatted reason (if wanted); return false. */
static pg_noinline bool
refuse(char **why, const char *fmt,...)
{
	char		buf[256];
	va_list		args;

	if (why == NULL)
		return false;
	va_start(args, fmt);
	vsnprintf(buf, sizeof(buf), fmt, args);
	va_end(args);
	*why = pstrdup(buf);
	return false;
}

/* refuse(), the reason prefixed with the name of a container. */
static pg_noinline bool
refuse_container(JsonbWalk *w, int depth, const char *fmt,...)
{
	char		what[256];
	va_list		args;

	if (w->why == NULL)
		return false;
	va_start(args, fmt);
	vsnprintf(what, sizeof(what), fmt, args);
	va_end(args);
	if (depth > 0)
		return refuse(w->why, "jsonb container at depth %d %s", depth, what);
	return refuse(w->why, "jsonb value %s", what);
}

/* refuse(), the reason prefixed with the name of the entry c->index. */
static pg_noinline bool
refuse_entry(JsonbWalk *w, const ContainerWalk *c, const char *fmt,...)
{
	char		what[256];
	char		depth[32] = "";
	va_list		args;

	if (w->why == NULL)
		return false;
	va_start(args, fmt);
	vsnprintf(what, sizeof(what), fmt, args);
	va_end(args);
	if (c->depth > 0)
		snprintf(depth, sizeof(depth), " at depth %d", c->depth);
	if (!c->is_object)
		return refuse(w->why, "jsonb element %u%s %s",
					  c->index, depth, what);
	if (c->index < c->count)
		return refuse(w->why, "jsonb object key %u%s %s",
					  c->index, depth, what);
	return refuse(w->why, "jsonb object value %u%s %s",
				  c->index - c->count, depth, what);
}

static inline uint32
read_uint32(const char *p)
{
	uint32		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline uint16
read_uint16(const char *p)
{
	uint16		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static inline int16
read_int16(const char *p)
{
	int16		v;

	memcpy(&v, p, sizeof(v));
	return v;
}

/* Is s[0..len) a string of the database encoding without NUL? */
static inline bool
string_is_valid(const char *s, uint32 len, int encoding)
{
	return len == 0 ||
		(memchr(s, '\0', len) == NULL &&
		 pg_verify_mbstr(encoding, s, (int) len, true));
}

/*
 * Say what is wrong with s[0..len), which string_is_valid refused, as the
 * end of a clause: "has a NUL byte at offset 3".  Out of line, so that
 * container_is_valid's frame, one per level of nesting, stays small.
 */
static pg_noinline void
string_problem(char *problem, size_t size, const char *s, uint32 len,
			   int encoding)
{
	const char *nul = memchr(s, '\0', len);

	if (nul != NULL)
		snprintf(problem, size, "has a NUL byte at offset %u",
				 (uint32) (nul - s));
	else
		snprintf(problem, size, "is not valid %s from offset %d",
				 pg_encoding_to_char(encoding),
				 pg_encoding_verifymbstr(encoding, s, (int) len));
}

/* refuse_entry() for a string that string_is_valid refused. */
static pg_noinline bool
refuse_string(JsonbWalk *w, const ContainerWalk *c, const char *s, uint32 len)
{
	char		problem[128];

	if (w->why == NULL)
		return false;
	string_problem(problem, sizeof(problem), s, len, w->encoding);
	return refuse_entry(w, c, "is a string that %s", problem);
}

/*
 * Is p[0..len) a numeric as make_result writes it, one that jsonb_in could
 * have stored: plain 4-byte varlena header giving exactly len, not NaN nor
 * an infinity, digits in [0, NBASE), no leading or trailing zero digit,
 * zero positive with weight 0, no digit beyond the display scale, and the
 * short form exactly when the value fits it?
 */
static pg_noinline bool
numeric_is_valid(JsonbWalk *w, const ContainerWalk *c, const char *p, uint32 len)
{
	union
	{
		uint32		word;
		char		bytes[VARHDRSZ];
	}			vl;
	uint16		head;
	int			sign;
	int			dscale;
	int			weight;
	uint32		hdrsz;
	uint32		ndigits;
	int16		first = 0;
	int16		last = 0;
	bool		can_be_short;

	if (len < NUM_HDRSZ_SHORT)
		return refuse_entry(w, c, "is a numeric shorter than a numeric header");
	memcpy(vl.bytes, p, VARHDRSZ);
	if (!VARATT_IS_4B_U(&vl))
		return refuse_entry(w, c, "is a numeric without a plain 4-byte varlena header");
	if (VARSIZE_4B(&vl) != len)
		return refuse_entry(w, c, "is a numeric whose varlena size %u is not its %u bytes",
							(uint32) VARSIZE_4B(&vl), len);

	head = read_uint16(p + VARHDRSZ);
	switch (head & NUM_SIGN_MASK)
	{
		case NUM_SPECIAL:
			return refuse_entry(w, c, "is a numeric NaN or infinity, which jsonb never holds");
		case NUM_SHORT:
			hdrsz = NUM_HDRSZ_SHORT;
			sign = (head & NUM_SHORT_SIGN_MASK) ? NUM_NEG : NUM_POS;
			dscale = (head & NUM_SHORT_DSCALE_MASK) >> NUM_SHORT_DSCALE_SHIFT;
			weight = head & NUM_SHORT_WEIGHT_MASK;
			if (head & NUM_SHORT_WEIGHT_SIGN_MASK)
				weight -= NUM_SHORT_WEIGHT_MASK + 1;
			break;
		default:
			if (len < NUM_HDRSZ)
				return refuse_entry(w, c, "is a numeric shorter than a long numeric header");
			hdrsz = NUM_HDRSZ;
			sign = head & NUM_SIGN_MASK;
			dscale = head & NUM_DSCALE_MASK;
			weight = read_int16(p + VARHDRSZ + sizeof(uint16));
			break;
	}

	if ((len - hdrsz) % sizeof(int16) != 0)
		return refuse_entry(w, c, "is a numeric with an odd byte after its digits");
	ndigits = (len - hdrsz) / sizeof(int16);
	for (uint32 i = 0; i < ndigits; i++)
	{
		int16		d = read_int16(p + hdrsz + i * sizeof(int16));

		if (d < 0 || d >= NUM_NBASE)
			return refuse_entry(w, c, "is a numeric whose digit %u is out of range", i);
		if (i == 0)
			first = d;
		last = d;
	}

	if (ndigits == 0)
	{
		if (sign != NUM_POS || weight != 0)
			return refuse_entry(w, c, "is a numeric zero not stored as positive with weight 0");
	}
	else
	{
		int64		last_weight = (int64) weight - (int64) (ndigits - 1);

		if (first == 0)
			return refuse_entry(w, c, "is a numeric with a leading zero digit");
		if (last == 0)
			return refuse_entry(w, c, "is a numeric with a trailing zero digit");

		/*
		 * numeric_out prints dscale decimals and drops the rest: the last
		 * digit must not reach past them except by decimal zeros.
		 */
		if (last_weight < 0 && -last_weight * NUM_DEC_DIGITS > dscale)
		{
			static const int16 powers[NUM_DEC_DIGITS] = {1, 10, 100, 1000};
			int64		hidden = -last_weight * NUM_DEC_DIGITS - dscale;

			if (hidden >= NUM_DEC_DIGITS || last % powers[hidden] != 0)
				return refuse_entry(w, c, "is a numeric with digits beyond its display scale");
		}
	}

	can_be_short = dscale <= NUM_SHORT_DSCALE_MAX &&
		weight <= NUM_SHORT_WEIGHT_MAX && weight >= NUM_SHORT_WEIGHT_MIN;
	if (can_be_short && hdrsz != NUM_HDRSZ_SHORT)
		return refuse_entry(w, c, "is a numeric in the long form though it fits the short one");
	return true;
}

/* Are the pad bytes at p zero? */
static bool
padding_is_zero(const char *p, uint32 pad)
{
	for (uint32 i = 0; i < pad; i++)
		if (p[i] != 0)
			return false;
	return true;
}

/*
 * Start checking base[0..len) as a JsonbContainer depth levels below the
 * top: its header, and that its JEntry array fits.  base is 4-byte aligned
 * relative to the start of the value, as every container's is.
 *
 * Called once per level of nesting, so this is where the recursion of
 * container_is_valid meets the stack depth check (here rather than there,
 * to keep container_is_valid's frame small).
 */
static pg_noinline bool
container_open(JsonbWalk *w, ContainerWalk *c, const char *base, uint32 len,
			   int depth)
{
	uint32		header;
	uint64		entries_end;

	check_stack_depth();

	if (len < sizeof(uint32))
		return refuse_container(w, depth, "is shorter than a container header");
	header = read_uint32(base);
	if ((header & ~(JB_CMASK | JB_FSCALAR | JB_FOBJECT | JB_FARRAY)) != 0)
		return refuse_container(w, depth, "has unknown header flags");
	switch (header & (JB_FOBJECT | JB_FARRAY))
	{
		case JB_FOBJECT:
			c->is_object = true;
			break;
		case JB_FARRAY:
			c->is_object = false;
			break;
		default:
			return refuse_container(w, depth, "is not exactly one of an object and an array");
	}
	c->count = header & JB_CMASK;
	c->is_scalar = (header & JB_FSCALAR) != 0;
	if (c->is_scalar && (c->is_object || depth > 0 || c->count != 1))
		return refuse_container(w, depth, "has the scalar flag but is not a top-level array of one element");
	if (c->count > (c->is_object ? PAYLOAD_JSONB_MAX_PAIRS : PAYLOAD_JSONB_MAX_ELEMS))
		return refuse_container(w, depth, "has more members than jsonb allows");

	c->nentries = c->is_object ? c->count * 2 : c->count;
	entries_end = sizeof(uint32) + (uint64) c->nentries * sizeof(JEntry);
	if (entries_end > len)
		return refuse_container(w, depth, "has %u entries, more than fit in its %u bytes",
								c->nentries, len);
	c->area = base + entries_end;
	c->area_len = len - (uint32) entries_end;
	c->key_offset = 0;
	c->key_len = 0;
	c->index = 0;
	c->offset = 0;
	c->depth = depth;
	return true;
}

/*
 * Check entry c->index of the container and step past it.  A nested
 * container is only located (c->child_offset and c->child_len, after its
 * padding), for the caller to check; c->child_len is 0 for a scalar.
 */
static pg_noinline bool
entry_next(JsonbWalk *w, ContainerWalk *c)
{
	JEntry		je = read_uint32(c->area - (c->nentries - c->index) * sizeof(JEntry));
	uint32		field = JBE_OFFLENFLD(je);
	uint32		type = je & JENTRY_TYPEMASK;
	const char *p = c->area + c->offset;
	uint64		end;
	uint32		elen;
	uint32		pad;

	c->child_len = 0;

	/* convertJsonbArray/Object put an end offset at every stride */
	if (JBE_HAS_OFF(je) != (c->index % JB_OFFSET_STRIDE == 0))
		return refuse_entry(w, c, JBE_HAS_OFF(je) ?
							"has an offset where a length belongs" :
							"has a length where an offset belongs");
	if (JBE_HAS_OFF(je))
	{
		if (field < c->offset)
			return refuse_entry(w, c, "ends before it begins");
		end = field;
	}
	else
		end = (uint64) c->offset + field;
	if (end > c->area_len)
		return refuse_entry(w, c, "runs past the end of the value");
	elen = (uint32) end - c->offset;

	/* numerics and containers begin with padding to a 4-byte boundary */
	pad = INTALIGN(c->offset) - c->offset;

	if (c->is_object && c->index < c->count && type != JENTRY_ISSTRING)
		return refuse_entry(w, c, "is not a string");

	switch (type)
	{
		case JENTRY_ISSTRING:
			if (!string_is_valid(p, elen, w->encoding))
				return refuse_string(w, c, p, elen);
			if (c->is_object && c->index < c->count)
			{
				/* keys strictly increase: shorter first, then memcmp */
				if (c->index > 0 &&
					(elen < c->key_len ||
					 (elen == c->key_len &&
					  memcmp(c->area + c->key_offset, p, elen) >= 0)))
					return refuse_entry(w, c, "does not sort strictly after the key before it");
				c->key_offset = c->offset;
				c->key_len = elen;
			}
			break;
		case JENTRY_ISNUMERIC:
		case JENTRY_ISCONTAINER:
			if (elen < pad)
				return refuse_entry(w, c, "is shorter than its alignment padding");
			if (!padding_is_zero(p, pad))
				return refuse_entry(w, c, "has nonzero alignment padding");
			if (type == JENTRY_ISNUMERIC)
			{
				if (!numeric_is_valid(w, c, p + pad, elen - pad))
					return false;
			}
			else
			{
				if (c->is_scalar)
					return refuse_entry(w, c, "is a container in a scalar");
				/* a container is at least its header: child_len > 0 */
				if (elen - pad < sizeof(uint32))
					return refuse_entry(w, c, "is a container shorter than a container header");
				c->child_offset = c->offset + pad;
				c->child_len = elen - pad;
			}
			break;
		case JENTRY_ISBOOL_FALSE:
		case JENTRY_ISBOOL_TRUE:
		case JENTRY_ISNULL:
			if (elen != 0)
				return refuse_entry(w, c, "is a boolean or null with %u bytes of data",
									elen);
			break;
		default:
			return refuse_entry(w, c, "has unknown type %u", type >> 28);
	}
	c->index++;
	c->offset = (uint32) end;
	return true;
}

/*
 * Is base[0..len) exactly a JsonbContainer, depth levels below the top?
 * The only recursion here: one small frame per level of nesting.
 */
static bool
container_is_valid(JsonbWalk *w, const char *base, uint32 len, int depth)
{
	ContainerWalk c;

	if (!container_open(w, &c, base, len, depth))
		return false;
	while (c.index < c.nentries)
	{
		if (!entry_next(w, &c))
			return false;
		if (c.child_len > 0 &&
			!container_is_valid(w, c.area + c.child_offset, c.child_len,
								c.depth + 1))
			return false;
	}
	if (c.offset != c.area_len)
		return refuse_container(w, c.depth, "has %u bytes after its last entry",
								c.area_len - c.offset);
	return true;
}

const char *
felix_payload_type_name(Oid typid)
{
	switch (typid)
	{
		case JSONBOID:
			return "jsonb";
		case TEXTOID:
			return "text";
		case BYTEAOID:
			return "bytea";
		default:
			return NULL;
	}
}

bool
payload_is_valid(Oid typid, const char *data, uint32 len, char **why)
{
	if (why != NULL)
		*why = NULL;

	switch (typid)
	{
		case BYTEAOID:
			return true;

		case TEXTOID:
			{
				int			encoding = GetDatabaseEncoding();
				char		problem[128];

				if (len > MaxAllocSize - VARHDRSZ)
					return refuse(why, "text of %u bytes is longer than any text value",
								  len);
				if (string_is_valid(data, len, encoding))
					return true;
				if (why == NULL)
					return false;
				string_problem(problem, sizeof(problem), data, len, encoding);
				return refuse(why, "text %s", problem);
			}

		case JSONBOID:
			{
				JsonbWalk	w;

				/* convertJsonbArray/Object refuse a larger root container */
				if (len > JENTRY_OFFLENMASK)
					return refuse(why, "jsonb value of %u bytes is longer than any jsonb value",
								  len);
				w.encoding = GetDatabaseEncoding();
				w.why = why;
				return container_is_valid(&w, data, len, 0);
			}

		default:
			return refuse(why, "type %u is not a payload type", typid);
	}
}
