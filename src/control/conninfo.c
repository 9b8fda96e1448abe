/*-------------------------------------------------------------------------
 *
 * conninfo.c
 *	  What felix makes of a libpq connection string.  A connection string
 *	  says two things at once: where a server is (host, hostaddr, port,
 *	  dbname) and who logs in (user, password, passfile, the client
 *	  certificate and its key).  felix keeps them apart:
 *
 *	  - felix.node_conninfo says where this node is AND who it is: peers
 *	    and the control plane learn only its address part (the node
 *	    registers nothing else), while its credentials are what this node
 *	    itself logs in with, to its peers and to the control plane.  A
 *	    node's secret therefore never leaves it;
 *	  - felix.control_conninfo says only where the control plane is (its
 *	    credentials keywords are refused at start);
 *	  - a peer's registered conninfo is a peer's word: only its address
 *	    keywords are used, never an option it might carry.
 *
 *	  Every node logs in as its own role, felix_node_<name>: the control
 *	  plane accepts a node's heartbeats and reports only from that role,
 *	  and a follower takes shipments only from its leader's.
 *
 *	  Connection strings are shown (views, messages, SHOW) only through
 *	  felix_conninfo_mask, which hides the value of every secret keyword.
 *
 * Locking rule: none.  The settings are PGC_POSTMASTER; what is derived
 * from them is computed once per process.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "libpq-fe.h"

#include "fmgr.h"
#include "funcapi.h"
#include "lib/stringinfo.h"
#include "postmaster/postmaster.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "control/conninfo.h"
#include "felix.h"
#include "base/privilege.h"
#include "storage/incarnation.h"

/* ---------------------------------------------------------------------
 * Keywords
 * ---------------------------------------------------------------------
 */

/* Where the server is. */
static bool
is_address_keyword(const char *kw)
{
	return strcmp(kw, "host") == 0 || strcmp(kw, "hostaddr") == 0 ||
		strcmp(kw, "port") == 0 || strcmp(kw, "dbname") == 0;
}

/* Who logs in. */
static bool
is_identity_keyword(const char *kw)
{
	return strcmp(kw, "user") == 0 || strcmp(kw, "password") == 0 ||
		strcmp(kw, "passfile") == 0 || strcmp(kw, "sslcert") == 0 ||
		strcmp(kw, "sslkey") == 0 || strcmp(kw, "sslpassword") == 0;
}

/* A value never shown: libpq marks password fields with dispchar "*". */
static bool
is_secret(const PQconninfoOption *o)
{
	return (o->dispchar != NULL && o->dispchar[0] == '*') ||
		strcmp(o->keyword, "password") == 0 ||
		strcmp(o->keyword, "sslpassword") == 0;
}

/* Append "kw=value" to buf, quoting the value when it needs it. */
static void
append_option(StringInfo buf, const char *kw, const char *value)
{
	bool		plain = value[0] != '\0';

	for (const char *p = value; *p && plain; p++)
		if (*p == ' ' || *p == '\'' || *p == '\\' || *p == '=' ||
			*p == '\t' || *p == '\n' || *p == '\r')
			plain = false;
	if (buf->len > 0)
		appendStringInfoChar(buf, ' ');
	appendStringInfo(buf, "%s=", kw);
	if (plain)
	{
		appendStringInfoString(buf, value);
		return;
	}
	appendStringInfoChar(buf, '\'');
	for (const char *p = value; *p; p++)
	{
		if (*p == '\'' || *p == '\\')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, *p);
	}
	appendStringInfoChar(buf, '\'');
}

/* The parsed options of conninfo, or NULL when it does not parse. */
static PQconninfoOption *
parse(const char *conninfo)
{
	char	   *err = NULL;
	PQconninfoOption *opts;

	if (conninfo == NULL)
		return NULL;
	opts = PQconninfoParse(conninfo, &err);
	if (err != NULL)
		PQfreemem(err);
	return opts;
}

static const char *
option_value(const PQconninfoOption *opts, const char *kw)
{
	for (const PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (o->val != NULL && strcmp(o->keyword, kw) == 0)
			return o->val;
	return NULL;
}

/* ---------------------------------------------------------------------
 * Showing a conninfo
 * ---------------------------------------------------------------------
 */
char *
felix_conninfo_mask(const char *conninfo)
{
	PQconninfoOption *opts;
	StringInfoData buf;

	if (conninfo == NULL || conninfo[0] == '\0')
		return pstrdup(conninfo ? conninfo : "");
	opts = parse(conninfo);
	if (opts == NULL)
		return pstrdup("(invalid connection string)");	/* might hold anything */
	initStringInfo(&buf);
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (o->val != NULL)
			append_option(&buf, o->keyword, is_secret(o) ? "********" : o->val);
	PQconninfoFree(opts);
	return buf.data;
}

char *
felix_conninfo_address(const char *conninfo)
{
	PQconninfoOption *opts = parse(conninfo);
	StringInfoData buf;

	initStringInfo(&buf);
	if (opts == NULL)
		return buf.data;
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		if (o->val != NULL && is_address_keyword(o->keyword))
			append_option(&buf, o->keyword, o->val);
	PQconninfoFree(opts);
	return buf.data;
}

/* ---------------------------------------------------------------------
 * This node, its peers and the control plane
 * ---------------------------------------------------------------------
 */
char *
felix_node_role(const char *node)
{
	return psprintf(FELIX_NODE_ROLE_PREFIX "%s", node);
}

const char *
felix_node_name_resolved(void)
{
	static char name[NAMEDATALEN];

	if (felix_node_name != NULL && felix_node_name[0] != '\0')
		return felix_node_name;
	if (name[0] == '\0')
		snprintf(name, sizeof(name), "node_%d", PostPortNumber);
	return name;
}

const char *
felix_node_conninfo_resolved(void)
{
	static char *resolved = NULL;

	if (resolved == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);
		StringInfoData buf;
		PQconninfoOption *opts;

		initStringInfo(&buf);
		if (felix_node_conninfo != NULL && felix_node_conninfo[0] != '\0')
			appendStringInfoString(&buf, felix_node_conninfo);
		else
		{
			char	   *dirs = pstrdup(Unix_socket_directories ? Unix_socket_directories : "");
			char	   *comma = strchr(dirs, ',');
			char		port[16];

			if (comma)
				*comma = '\0';
			snprintf(port, sizeof(port), "%d", PostPortNumber);
			append_option(&buf, "host", dirs[0] ? dirs : "/var/run/postgresql");
			append_option(&buf, "port", port);
			append_option(&buf, "dbname", felix_database);
		}
		opts = parse(buf.data);
		if (opts == NULL || option_value(opts, "user") == NULL)
		{
			char	   *role = felix_node_role(felix_node_name_resolved());

			append_option(&buf, "user", role);
		}
		if (opts != NULL)
			PQconninfoFree(opts);
		resolved = buf.data;
		MemoryContextSwitchTo(old);
	}
	return resolved;
}

PG_FUNCTION_INFO_V1(felix_node_name_sql);
Datum
felix_node_name_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(cstring_to_text(felix_node_name_resolved()));
}

/* felix.node_identity(): this node's name and incarnation. */
PG_FUNCTION_INFO_V1(felix_node_identity);
Datum
felix_node_identity(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	char		incarnation[FELIX_INCARNATION_LEN];

	felix_require_preload();
	felix_require_replication_role("felix.node_identity");
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "felix.node_identity: return type must be a row type");
	felix_incarnation(incarnation, NULL);
	values[0] = CStringGetTextDatum(felix_node_name_resolved());
	values[1] = CStringGetTextDatum(incarnation);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}

bool
felix_cp_embedded(void)
{
	return felix_control_conninfo == NULL || felix_control_conninfo[0] == '\0';
}

/*
 * The options of `where` (all of them, or with only_address only its
 * address keywords), then this node's credentials and whatever other
 * option `where` leaves unset.
 */
static char *
merge(const char *where, bool only_address)
{
	PQconninfoOption *w = parse(where);
	PQconninfoOption *me = parse(felix_node_conninfo_resolved());
	StringInfoData buf;

	initStringInfo(&buf);
	if (w == NULL || me == NULL)
	{
		if (w)
			PQconninfoFree(w);
		if (me)
			PQconninfoFree(me);
		return buf.data;
	}
	for (PQconninfoOption *o = w; o->keyword != NULL; o++)
	{
		if (o->val == NULL || is_identity_keyword(o->keyword))
			continue;
		if (only_address && !is_address_keyword(o->keyword))
			continue;
		append_option(&buf, o->keyword, o->val);
	}
	for (PQconninfoOption *o = me; o->keyword != NULL; o++)
	{
		const char *there;

		/* address keywords all came from `where`; identity ones never do */
		if (o->val == NULL || is_address_keyword(o->keyword))
			continue;
		there = option_value(w, o->keyword);
		if (is_identity_keyword(o->keyword) || only_address || there == NULL)
			append_option(&buf, o->keyword, o->val);
	}
	PQconninfoFree(w);
	PQconninfoFree(me);
	return buf.data;
}

char *
felix_cp_conninfo(void)
{
	if (felix_cp_embedded())
		return pstrdup(felix_node_conninfo_resolved());
	return merge(felix_control_conninfo, false);
}

/*
 * The ship worker asks for the same few peers' conninfo for every
 * follower it ships to, each heartbeat interval: what merge made of each
 * address is kept.  It depends on the address alone, as this node's own
 * conninfo (felix.node_conninfo) is fixed at server start.
 */
#define PEER_CONNINFO_KEPT	64

char *
felix_peer_conninfo(const char *peer)
{
	static char *address[PEER_CONNINFO_KEPT];
	static char *merged[PEER_CONNINFO_KEPT];
	static int	next = 0;
	int			i;

	for (i = 0; i < PEER_CONNINFO_KEPT && address[i] != NULL; i++)
		if (strcmp(address[i], peer) == 0)
			return pstrdup(merged[i]);
	if (i == PEER_CONNINFO_KEPT)
	{
		/* full: the oldest entry makes room */
		i = next;
		next = (next + 1) % PEER_CONNINFO_KEPT;
		pfree(address[i]);
		pfree(merged[i]);
		address[i] = NULL;
	}
	merged[i] = MemoryContextStrdup(TopMemoryContext, merge(peer, true));
	address[i] = MemoryContextStrdup(TopMemoryContext, peer);
	return pstrdup(merged[i]);
}

/* ---------------------------------------------------------------------
 * The settings, checked at start
 * ---------------------------------------------------------------------
 */

/*
 * Refuse to start with a conninfo setting felix cannot use safely.  Done
 * here rather than in a GUC check hook: a custom setting whose check fails
 * while the library loads is reported with its value (which could hold a
 * secret) and then silently replaced by its default -- an empty
 * felix.control_conninfo would make the node host a control plane of its
 * own.  A secret may not be written into either setting at all: settings
 * are shown to superusers and pg_read_all_settings (reset_val included),
 * while a password file (passfile=, or ~/.pgpass of the server's OS user)
 * is read by this server alone.  No message repeats the value.
 */
static void
check_setting(const char *value, const char *setting, bool where_only)
{
	PQconninfoOption *opts;

	if (value == NULL || value[0] == '\0')
		return;
	opts = parse(value);
	if (opts == NULL)
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is not a valid libpq connection string", setting),
				 errhint("Write it as keyword=value pairs, e.g. host=10.0.0.1 port=5432 dbname=postgres.")));
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL)
			continue;
		if (is_secret(o))
			ereport(FATAL,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not contain \"%s\"", setting, o->keyword),
					 errdetail("Settings can be read by superusers and members of pg_read_all_settings; a secret in one would not stay secret."),
					 errhint("Put the password in a password file: passfile=/path/to/file in felix.node_conninfo, or ~/.pgpass of the server's operating-system user.")));
		if (where_only && is_identity_keyword(o->keyword))
			ereport(FATAL,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s sets \"%s\"; it must say only where the control plane is", setting, o->keyword),
					 errhint("A node logs in to the control plane as itself: put its user (and passfile or client certificate) in felix.node_conninfo.")));
	}
	PQconninfoFree(opts);
}

void
felix_conninfo_check_settings(void)
{
	check_setting(felix_node_conninfo, "felix.node_conninfo", false);
	check_setting(felix_control_conninfo, "felix.control_conninfo", true);
}
