/*-------------------------------------------------------------------------
 *
 * json.c
 *	  JSON in and out of the control plane.  Parsing goes through jsonb_in
 *	  inside PG_TRY: jsonb_in allocates and raises nothing else, so an
 *	  error it raises is caught, its message kept, and the error state
 *	  flushed -- a malformed answer from a peer never aborts the caller.
 *	  Integers are read from JSON numbers and from strings of digits (the
 *	  etcd gateway writes int64 fields as strings).
 *
 * Locking rule: none.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "control/json.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

/*
 * jsonb_in's working memory: the tree it builds before the binary form is
 * several times the text, and a control-plane host decoding thousands of
 * records into a long-lived copy of the state (cpstate.c) kept all of it.
 * Only the result is copied out; the rest is reset after each parse.
 */
static MemoryContext parse_cxt = NULL;

JsonbContainer *
felix_json_parse(const char *text, int len, char *err, Size errlen)
{
	MemoryContext cxt = CurrentMemoryContext;
	Jsonb	   *jb = NULL;
	Jsonb	   *out = NULL;

	if (parse_cxt == NULL)
		parse_cxt = AllocSetContextCreate(TopMemoryContext, "felix JSON parse",
										  ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(parse_cxt);
	PG_TRY();
	{
		jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in,
												CStringGetDatum(pnstrdup(text, len))));
		MemoryContextSwitchTo(cxt);
		out = palloc(VARSIZE(jb));
		memcpy(out, jb, VARSIZE(jb));
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		strlcpy(err, edata->message ? edata->message : "not JSON", errlen);
		FreeErrorData(edata);
		out = NULL;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	MemoryContextReset(parse_cxt);
	return out ? &out->root : NULL;
}

/*
 * The readers below leave nothing behind but what they return: the state's
 * copy a control-plane process keeps is decoded with them, thousands of
 * records into one long-lived context.
 */
static JsonbValue *
field(JsonbContainer *obj, const char *name, JsonbValue *res)
{
	if (obj == NULL || !JsonContainerIsObject(obj))
		return NULL;
	return getKeyJsonValueFromContainer(obj, name, strlen(name), res);
}

static bool
value_string(JsonbValue *v, char **out)
{
	if (v == NULL || v->type != jbvString)
		return false;
	*out = pnstrdup(v->val.string.val, v->val.string.len);
	return true;
}

/* s, a string of digits (and a sign), as an int64. */
static bool
digits_int64(const char *s, int64 *out)
{
	char	   *end;

	if (s[0] == '\0' || strspn(s, "-0123456789") != strlen(s))
		return false;
	errno = 0;
	*out = strtoi64(s, &end, 10);
	return errno == 0 && *end == '\0';
}

static bool
value_int64(JsonbValue *v, int64 *out)
{
	if (v == NULL)
		return false;
	if (v->type == jbvNumeric)
	{
		char	   *s = DatumGetCString(DirectFunctionCall1(numeric_out,
															NumericGetDatum(v->val.numeric)));
		bool		ok = digits_int64(s, out);

		pfree(s);
		return ok;
	}
	if (v->type == jbvString)
	{
		char	   *s = pnstrdup(v->val.string.val, v->val.string.len);
		bool		ok = digits_int64(s, out);

		pfree(s);
		return ok;
	}
	return false;
}

static JsonbContainer *
value_container(JsonbValue *v, bool array)
{
	if (v == NULL || v->type != jbvBinary)
		return NULL;
	if (array ? !JsonContainerIsArray(v->val.binary.data)
		: !JsonContainerIsObject(v->val.binary.data))
		return NULL;
	return v->val.binary.data;
}

bool
felix_json_string(JsonbContainer *obj, const char *name, char **out)
{
	JsonbValue	res;

	return value_string(field(obj, name, &res), out);
}

bool
felix_json_int64(JsonbContainer *obj, const char *name, int64 *out)
{
	JsonbValue	res;

	return value_int64(field(obj, name, &res), out);
}

bool
felix_json_bool(JsonbContainer *obj, const char *name, bool *out)
{
	JsonbValue	res;
	JsonbValue *v = field(obj, name, &res);

	if (v == NULL || v->type != jbvBool)
		return false;
	*out = v->val.boolean;
	return true;
}

JsonbContainer *
felix_json_object(JsonbContainer *obj, const char *name)
{
	JsonbValue	res;

	return value_container(field(obj, name, &res), false);
}

JsonbContainer *
felix_json_array(JsonbContainer *obj, const char *name)
{
	JsonbValue	res;

	return value_container(field(obj, name, &res), true);
}

int
felix_json_length(JsonbContainer *arr)
{
	if (arr == NULL || !JsonContainerIsArray(arr))
		return 0;
	return JsonContainerSize(arr);
}

static JsonbValue *
element(JsonbContainer *arr, int i)
{
	if (arr == NULL || !JsonContainerIsArray(arr) || i < 0 || i >= JsonContainerSize(arr))
		return NULL;
	return getIthJsonbValueFromContainer(arr, i);
}

/* (a container points into arr, not into the element's JsonbValue) */
JsonbContainer *
felix_json_elem_object(JsonbContainer *arr, int i)
{
	JsonbValue *v = element(arr, i);
	JsonbContainer *c = value_container(v, false);

	if (v)
		pfree(v);
	return c;
}

bool
felix_json_elem_string(JsonbContainer *arr, int i, char **out)
{
	JsonbValue *v = element(arr, i);
	bool		ok = value_string(v, out);

	if (v)
		pfree(v);
	return ok;
}

bool
felix_json_elem_int64(JsonbContainer *arr, int i, int64 *out)
{
	JsonbValue *v = element(arr, i);
	bool		ok = value_int64(v, out);

	if (v)
		pfree(v);
	return ok;
}

static void
put_name(StringInfo buf, const char *name)
{
	if (buf->len > 0 && buf->data[buf->len - 1] != '{' && buf->data[buf->len - 1] != '[')
		appendStringInfoChar(buf, ',');
	escape_json(buf, name);
	appendStringInfoChar(buf, ':');
}

void
felix_json_put_string(StringInfo buf, const char *name, const char *value)
{
	put_name(buf, name);
	if (value == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, value);
}

void
felix_json_put_int64(StringInfo buf, const char *name, int64 value)
{
	put_name(buf, name);
	appendStringInfo(buf, INT64_FORMAT, value);
}

void
felix_json_put_bool(StringInfo buf, const char *name, bool value)
{
	put_name(buf, name);
	appendStringInfoString(buf, value ? "true" : "false");
}
