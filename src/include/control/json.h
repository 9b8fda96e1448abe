/*-------------------------------------------------------------------------
 *
 * json.h
 *	  Reading JSON that came from elsewhere (an etcd answer, a value in the
 *	  control-plane store): parse without raising, then look fields up by
 *	  name with their type checked.  A field that is missing or of another
 *	  type reads as absent; callers decide whether that is malformed.
 *	  See json.c.
 *
 * Locking rule: none; pure functions over palloc'd memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_JSON_H
#define FELIX_CONTROL_JSON_H

#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/jsonb.h"

/* Parse text as JSON; NULL (with why in err) if it is not. */
extern JsonbContainer *felix_json_parse(const char *text, int len,
										char *err, Size errlen);

/* Object fields by name; false when absent or of another type. */
extern bool felix_json_string(JsonbContainer *obj, const char *name, char **out);
extern bool felix_json_int64(JsonbContainer *obj, const char *name, int64 *out);
extern bool felix_json_bool(JsonbContainer *obj, const char *name, bool *out);
extern JsonbContainer *felix_json_object(JsonbContainer *obj, const char *name);
extern JsonbContainer *felix_json_array(JsonbContainer *obj, const char *name);

/* Arrays: length, and element i as an object / string / int64. */
extern int	felix_json_length(JsonbContainer *arr);
extern JsonbContainer *felix_json_elem_object(JsonbContainer *arr, int i);
extern bool felix_json_elem_string(JsonbContainer *arr, int i, char **out);
extern bool felix_json_elem_int64(JsonbContainer *arr, int i, int64 *out);

/* Writing: "name": value pairs into an object being built in buf. */
extern void felix_json_put_string(StringInfo buf, const char *name, const char *value);
extern void felix_json_put_int64(StringInfo buf, const char *name, int64 value);
extern void felix_json_put_bool(StringInfo buf, const char *name, bool value);

#endif							/* FELIX_CONTROL_JSON_H */
