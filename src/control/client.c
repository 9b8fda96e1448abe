/*-------------------------------------------------------------------------
 *
 * client.c
 *	  felix's libpq client.  Every connection felix makes -- to the
 *	  control plane, to a peer, to itself -- goes through here, so the
 *	  rules for talking to a remote server inside a PostgreSQL process are
 *	  kept in one place.  Two ways to use it: a call that waits for its
 *	  answer (felix_conn_open/felix_conn_exec: the heartbeat worker, the
 *	  node worker's probes, backends), and non-blocking connections that a
 *	  worker's event loop drives (async_*: the ship worker's peers and its
 *	  replica reports).  Either way:
 *
 *	  - nothing blocks inside libpq: the connection is started with
 *		PQconnectStartParams and driven with PQconnectPoll, queries are sent
 *		with PQsendQueryParams (or, for a call a session makes again and
 *		again, prepared once and sent with PQsendQueryPrepared) on a
 *		non-blocking connection and collected
 *		with PQconsumeInput/PQisBusy; every wait is a WaitLatchOrSocket on
 *		the process latch with WL_EXIT_ON_PM_DEATH, and interrupts are
 *		serviced (CHECK_FOR_INTERRUPTS) whenever the latch is set, so a
 *		cancel or a shutdown is never held up by the network;
 *	  - every wait has a deadline; running out of it reports 08006 and
 *		leaves the connection unusable (felix_conn_usable says so), so the
 *		caller reconnects rather than reading a stale answer later.  The
 *		remote session gets the same deadline as its statement_timeout
 *		(felix_conn_set_statement_timeout), so a call abandoned here does
 *		not keep running, or waiting for a lock, over there;
 *	  - a remote error is re-reported here with its own SQLSTATE, message,
 *		detail and hint at the level the caller chose: ERROR in a backend (a
 *		user sees the control plane's 22023 and its hint), LOG in a worker,
 *		which must carry on.  Nothing here raises FATAL;
 *	  - each connection holds one external file descriptor of fd.c's
 *		budget (AcquireExternalFD) for its lifetime.
 *
 *	  The heartbeat worker (worker/heartbeat.c) keeps one connection open
 *	  for the process's life; backends open one per call and close it in
 *	  PG_FINALLY.  Every session felix opens runs with search_path pinned
 *	  to pg_catalog, pg_temp, as felix's own queries do (privilege.c), and
 *	  logs in as this node's own role (conninfo.c).
 *
 * Locking rule: none.  A connection is private to the process that opened
 * it; nothing here touches shared memory.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "libpq-fe.h"

#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "storage/fd.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "core/catalog.h"
#include "control/client.h"
#include "control/conninfo.h"
#include "control/nodes.h"
#include "felix.h"
#include "storage/incarnation.h"


/* ---------------------------------------------------------------------
 * Waiting
 * ---------------------------------------------------------------------
 */

/* Milliseconds left until deadline_ns (felix_monotonic_ns), at least 0. */
static long
remaining_ms(int64 deadline_ns)
{
	int64		now = felix_monotonic_ns();

	if (now >= deadline_ns)
		return 0;
	return (long) ((deadline_ns - now + 999999) / 1000000);
}

/*
 * Wait until the socket is ready for io_flags, the latch is set or the
 * deadline passes; interrupts are serviced when the latch was set.
 * Returns the events that fired (WL_TIMEOUT once the deadline is past).
 */
static int
wait_socket(PGconn *conn, int io_flags, int64 deadline_ns)
{
	long		timeout = remaining_ms(deadline_ns);
	int			rc;

	if (timeout <= 0)
		return WL_TIMEOUT;
	/* No socket (a broken connection): let libpq say so at once. */
	if (PQsocket(conn) == PGINVALID_SOCKET)
		return io_flags;
	rc = WaitLatchOrSocket(MyLatch,
						   WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH | io_flags,
						   PQsocket(conn), timeout, PG_WAIT_EXTENSION);
	if (rc & WL_LATCH_SET)
	{
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	return rc;
}

/* Remote NOTICEs and WARNINGs are not the user's business: log quietly. */
static void
notice_receiver(void *arg, const PGresult *res)
{
	const char *msg = PQresultErrorMessage(res);

	ereport(DEBUG1,
			(errmsg_internal("felix: remote notice: %s", msg ? msg : "")));
}

/* ---------------------------------------------------------------------
 * Connections
 * ---------------------------------------------------------------------
 */

void
felix_conn_close(PGconn *conn)
{
	if (conn == NULL)
		return;
	PQfinish(conn);
	ReleaseExternalFD();
}

bool
felix_conn_usable(PGconn *conn)
{
	return conn != NULL &&
		PQstatus(conn) == CONNECTION_OK &&
		PQtransactionStatus(conn) == PQTRANS_IDLE;
}

/* The last failure this process reported (a connection or a call), for
 * the views: its message without any secret (libpq never repeats a
 * password, and conninfos are masked). */
static char last_error[256];

const char *
felix_conn_last_error(void)
{
	return last_error;
}

/*
 * What to do about a failed connection, from libpq's reason: a password
 * that is missing or refused is named as such, since that is the usual
 * cause on a cluster being set up (the README's cluster steps).
 */
const char *
felix_conn_hint(const char *why)
{
	if (strstr(why, "no password supplied") != NULL)
		return "The server asks for a password and this node has none for it: put the password of this node's role in the password file its conninfo names (passfile=...); scripts/felix-node-credentials sets the role's password on every server and writes that file.";
	if (strstr(why, "password authentication failed") != NULL)
		return "The server refused the password: the role's password there differs from the one in this node's password file.  Set it on every server (scripts/felix-node-credentials does).";
	if (strstr(why, "role \"") != NULL && strstr(why, "does not exist") != NULL)
		return "The role this node logs in as does not exist on that server: run SELECT felix_create_node_role('<node>') there for every node of the cluster.";
	if (strstr(why, "no pg_hba.conf entry") != NULL)
		return "That server's pg_hba.conf has no line for this node's role and address: add the line scripts/felix-node-config prints (README, \"A replicated cluster\").";
	return "Check that the server this conninfo names is running and that its pg_hba.conf lets this node connect as the conninfo's user.";
}

/* Report a failed connection attempt at elevel; conn is already closed. */
static void
report_connect_failure(int elevel, const char *purpose, const char *conninfo,
					   const char *why)
{
	snprintf(last_error, sizeof(last_error), "could not connect to %s: %s", purpose, why);
	ereport(elevel,
			(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
			 errmsg("could not connect to %s: %s", purpose, why),
			 errdetail_internal("conninfo \"%s\"", felix_conninfo_mask(conninfo)),
			 errhint("%s", felix_conn_hint(why))));
}

/*
 * One connection attempt with the given keywords, driven by PQconnectPoll
 * until it succeeds, fails or deadline_ns passes.  Returns the connection
 * (non-blocking) or NULL with *why set; holds an external FD only while
 * it returns a connection.
 */
static PGconn *
connect_one(const char *const *keywords, const char *const *values,
			int64 deadline_ns, char **why_out)
{
	PGconn	   *volatile conn = NULL;
	char	   *volatile why = NULL;

	if (!AcquireExternalFD())
	{
		*why_out = pstrdup("this server has no file descriptor to spare; raise "
						   "max_files_per_process or the process's \"ulimit -n\"");
		return NULL;
	}
	conn = PQconnectStartParams(keywords, values, 0);
	if (conn == NULL)
	{
		ReleaseExternalFD();
		*why_out = pstrdup("out of memory");
		return NULL;
	}

	PG_TRY();
	{
		PostgresPollingStatusType status = PGRES_POLLING_WRITING;

		if (PQstatus(conn) == CONNECTION_BAD)
			status = PGRES_POLLING_FAILED;

		/* Per PQconnectPoll's contract: first wait until writable. */
		while (status != PGRES_POLLING_OK && status != PGRES_POLLING_FAILED)
		{
			int			io = (status == PGRES_POLLING_READING) ?
				WL_SOCKET_READABLE : WL_SOCKET_WRITEABLE;
			int			rc = wait_socket(conn, io, deadline_ns);

			if (rc & io)
				status = PQconnectPoll(conn);
			else if (rc & WL_TIMEOUT)
			{
				const char *h = PQhost(conn);

				why = psprintf("timed out connecting to %s%s%s",
							   h && h[0] ? "\"" : "", h && h[0] ? h : "the server",
							   h && h[0] ? "\"" : "");
				break;
			}
		}
		if (why == NULL && status == PGRES_POLLING_FAILED)
			why = pchomp(PQerrorMessage(conn));
		if (why == NULL && PQsetnonblocking(conn, 1) != 0)
			why = pchomp(PQerrorMessage(conn));
	}
	PG_CATCH();
	{
		felix_conn_close(conn);
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (why != NULL)
	{
		felix_conn_close(conn);
		*why_out = why;
		return NULL;
	}
	PQsetNoticeReceiver(conn, notice_receiver, NULL);
	return conn;
}

/* Split a comma-separated libpq list ("a,b,,c"); NIL for NULL. */
static List *
split_list(const char *value)
{
	List	   *items = NIL;
	const char *p = value;

	if (value == NULL)
		return NIL;
	for (;;)
	{
		const char *comma = strchr(p, ',');

		if (comma == NULL)
		{
			items = lappend(items, pstrdup(p));
			break;
		}
		items = lappend(items, pnstrdup(p, comma - p));
		p = comma + 1;
	}
	return items;
}

/*
 * The entry of a libpq host/hostaddr/port list for host i of n: lists of
 * one entry serve every host; any other length is passed whole, for libpq
 * to refuse with its own message.
 */
static const char *
list_entry(List *items, const char *whole, int i, int n)
{
	if (whole == NULL)
		return NULL;
	if (list_length(items) == 1)
		return whole;
	if (list_length(items) == n)
		return (const char *) list_nth(items, i);
	return whole;
}

/*
 * Connect, trying each host of a multi-host conninfo in turn ("host=a,b
 * target_session_attrs=read-write": the control plane's primary among its
 * standbys).  libpq would move on to the next host by itself, but only
 * once a host has refused or failed: a host that silently drops packets
 * would hold the whole deadline.  So each host gets its own attempt, with
 * connect_timeout (per host, as in libpq) when set, else an equal share of
 * what is left of the deadline.
 */
PGconn *
felix_conn_open(const char *conninfo, const char *purpose,
				const char *application_name, int timeout_ms, int elevel)
{
	PQconninfoOption *opts;
	char	   *err = NULL;
	int64		deadline = felix_monotonic_ns() + (int64) timeout_ms * 1000000;
	const char *host = NULL,
			   *hostaddr = NULL,
			   *port = NULL;
	List	   *hosts,
			   *hostaddrs,
			   *ports;
	int			nopts = 0;
	int			nhosts;
	int64		per_host_ns = 0;
	const char **keywords;
	const char **values;
	StringInfoData failures;

	opts = PQconninfoParse(conninfo, &err);
	if (opts == NULL)
	{
		char	   *why = err ? pchomp(err) : pstrdup("out of memory");

		if (err)
			PQfreemem(err);
		report_connect_failure(elevel, purpose, conninfo,
							   psprintf("invalid connection string: %s", why));
		return NULL;
	}

	for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
	{
		if (o->val == NULL)
			continue;
		nopts++;
		if (strcmp(o->keyword, "host") == 0)
			host = o->val;
		else if (strcmp(o->keyword, "hostaddr") == 0)
			hostaddr = o->val;
		else if (strcmp(o->keyword, "port") == 0)
			port = o->val;
		else if (strcmp(o->keyword, "connect_timeout") == 0 && atoi(o->val) > 0)
			per_host_ns = (int64) Max(atoi(o->val), 2) * INT64CONST(1000000000);
	}
	hosts = split_list(host);
	hostaddrs = split_list(hostaddr);
	ports = split_list(port);
	nhosts = Max(1, Max(list_length(hosts), list_length(hostaddrs)));

	/* The user's options, then ours (later keywords win in libpq). */
	keywords = palloc0(sizeof(char *) * (nopts + 4));
	values = palloc0(sizeof(char *) * (nopts + 4));
	initStringInfo(&failures);

	for (int i = 0; i < nhosts; i++)
	{
		int			k = 0;
		int64		now = felix_monotonic_ns();
		int64		host_deadline;
		PGconn	   *conn;
		char	   *why = NULL;

		if (now >= deadline)
		{
			appendStringInfo(&failures, "%sno time left to try the remaining %d host%s",
							 failures.len ? "; " : "", nhosts - i, nhosts - i == 1 ? "" : "s");
			break;
		}
		host_deadline = per_host_ns > 0 ? now + per_host_ns : now + (deadline - now) / (nhosts - i);
		host_deadline = Min(host_deadline, deadline);

		for (PQconninfoOption *o = opts; o->keyword != NULL; o++)
		{
			const char *v = o->val;

			if (v == NULL)
				continue;
			if (strcmp(o->keyword, "host") == 0)
				v = list_entry(hosts, host, i, nhosts);
			else if (strcmp(o->keyword, "hostaddr") == 0)
				v = list_entry(hostaddrs, hostaddr, i, nhosts);
			else if (strcmp(o->keyword, "port") == 0)
				v = list_entry(ports, port, i, nhosts);
			keywords[k] = o->keyword;
			values[k] = v;
			k++;
		}
		keywords[k] = "fallback_application_name";
		values[k++] = application_name;
		keywords[k] = "client_encoding";
		values[k++] = GetDatabaseEncodingName();
		keywords[k] = "options";
		values[k++] = "-c search_path=pg_catalog,pg_temp";
		keywords[k] = NULL;
		values[k] = NULL;

		conn = connect_one(keywords, values, host_deadline, &why);
		if (conn != NULL)
		{
			PQconninfoFree(opts);
			return conn;
		}
		appendStringInfo(&failures, "%s%s", failures.len ? "; " : "", why);
	}

	PQconninfoFree(opts);
	report_connect_failure(elevel, purpose, conninfo, failures.data);
	return NULL;
}

/* ---------------------------------------------------------------------
 * Queries
 * ---------------------------------------------------------------------
 */

/* A failure of the connection itself (not an error result): 08006. */
static void
report_conn_failure(int elevel, PGconn *conn, const char *call, const char *what)
{
	char	   *msg = pchomp(PQerrorMessage(conn));

	snprintf(last_error, sizeof(last_error), "%s: %s", call, what);
	ereport(elevel,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("remote call to %s failed: %s", call, what),
			 msg[0] ? errdetail_internal("%s", msg) : 0,
			 errhint("The call may or may not have taken effect there; it is retried "
					 "or can be repeated once the server is reachable.")));
}

/*
 * Re-report an error result at elevel with the remote SQLSTATE, message,
 * detail and hint.  The remote context (where in the control plane's
 * PL/pgSQL it was raised) goes to the log only: a user sees the message
 * and the call it came from.  Frees res first: an ERROR leaves from here.
 */
static char last_sqlstate[6];

const char *
felix_conn_last_sqlstate(void)
{
	return last_sqlstate;
}

void
felix_conn_report_result(int elevel, PGresult *res, PGconn *conn, const char *call)
{
	const char *f_sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *f_primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	const char *f_detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
	const char *f_hint = PQresultErrorField(res, PG_DIAG_MESSAGE_HINT);
	const char *f_context = PQresultErrorField(res, PG_DIAG_CONTEXT);
	int			code = ERRCODE_CONNECTION_FAILURE;
	char	   *primary;
	char	   *detail = f_detail ? pstrdup(f_detail) : NULL;
	char	   *hint = f_hint ? pstrdup(f_hint) : NULL;
	char	   *context = f_context ? pstrdup(f_context) : NULL;

	strlcpy(last_sqlstate, f_sqlstate ? f_sqlstate : "", sizeof(last_sqlstate));
	snprintf(last_error, sizeof(last_error), "%s: %s", call,
			 f_primary ? f_primary : "error");
	if (f_sqlstate && strlen(f_sqlstate) == 5)
		code = MAKE_SQLSTATE(f_sqlstate[0], f_sqlstate[1], f_sqlstate[2],
							 f_sqlstate[3], f_sqlstate[4]);
	if (f_primary)
		primary = pstrdup(f_primary);
	else
	{
		const char *m = PQresultErrorMessage(res);

		primary = (m && m[0]) ? pchomp(m) : pchomp(PQerrorMessage(conn));
		if (primary[0] == '\0')
			primary = pstrdup("unknown error");
	}
	PQclear(res);

	ereport(elevel,
			(errcode(code),
			 errmsg_internal("%s", primary),
			 detail ? errdetail_internal("%s", detail) : 0,
			 hint ? errhint("%s", hint) : 0,
			 (context && elevel < ERROR) ? errcontext("%s", context) : 0,
			 errcontext("remote call to %s", call)));
}

/* How send_query's statement goes out. */
typedef enum SendKind
{
	SEND_TEXT,					/* sql, parsed and planned there each time */
	SEND_PREPARE,				/* sql, prepared there as stmt */
	SEND_PREPARED				/* stmt, prepared there earlier */
} SendKind;

static bool
send_query(PGconn *conn, const char *call, SendKind kind, const char *stmt,
		   const char *sql, int nparams, const char *const *values,
		   int64 deadline_ns, int elevel)
{
	const char *failure = NULL;
	int			sent;

	last_sqlstate[0] = '\0';

	/* idle, or inside a transaction its caller began (and no call running) */
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK ||
		(PQtransactionStatus(conn) != PQTRANS_IDLE &&
		 PQtransactionStatus(conn) != PQTRANS_INTRANS))
	{
		ereport(elevel,
				(errcode(ERRCODE_CONNECTION_DOES_NOT_EXIST),
				 errmsg("no usable connection for the remote call to %s", call),
				 errhint("Reconnect and repeat the call.")));
		return false;
	}

	if (kind == SEND_PREPARE)
		sent = PQsendPrepare(conn, stmt, sql, nparams, NULL);
	else if (kind == SEND_PREPARED)
		sent = PQsendQueryPrepared(conn, stmt, nparams, values, NULL, NULL, 0);
	else
		sent = PQsendQueryParams(conn, sql, nparams, NULL, values, NULL, NULL, 0);
	if (!sent)
	{
		report_conn_failure(elevel, conn, call, "could not send the query");
		return false;
	}

	/* Send what libpq buffered; read meanwhile so the peer never stalls. */
	for (;;)
	{
		int			f = PQflush(conn);
		int			rc;

		if (f == 0)
			break;
		if (f < 0)
		{
			failure = "could not send the query";
			break;
		}
		rc = wait_socket(conn, WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE, deadline_ns);
		if (rc & WL_TIMEOUT)
		{
			failure = "timed out sending the query";
			break;
		}
		if ((rc & WL_SOCKET_READABLE) && !PQconsumeInput(conn))
		{
			failure = "could not read the reply";
			break;
		}
	}
	if (failure != NULL)
	{
		report_conn_failure(elevel, conn, call, failure);
		return false;
	}
	return true;
}

bool
felix_conn_send(PGconn *conn, const char *call, const char *sql,
				int nparams, const char *const *values, int64 deadline_ns, int elevel)
{
	return send_query(conn, call, SEND_TEXT, NULL, sql, nparams, values,
					  deadline_ns, elevel);
}

PGresult *
felix_conn_receive(PGconn *conn, const char *call, int64 deadline_ns, int elevel)
{
	PGresult   *volatile result = NULL;
	const char *volatile failure = NULL;

	PG_TRY();
	{
		/* Collect every result; keep the first error, else the last. */
		for (;;)
		{
			PGresult   *res;

			while (failure == NULL && PQisBusy(conn))
			{
				int			rc = wait_socket(conn, WL_SOCKET_READABLE, deadline_ns);

				if (rc & WL_TIMEOUT)
					failure = "timed out waiting for the reply";
				else if ((rc & WL_SOCKET_READABLE) && !PQconsumeInput(conn))
					failure = "could not read the reply";
			}
			if (failure != NULL)
				break;
			res = PQgetResult(conn);
			if (res == NULL)
				break;
			if (result == NULL ||
				(PQresultStatus(res) == PGRES_FATAL_ERROR &&
				 PQresultStatus(result) != PGRES_FATAL_ERROR))
			{
				PQclear(result);
				result = res;
			}
			else
				PQclear(res);
		}
	}
	PG_CATCH();
	{
		PQclear(result);
		PG_RE_THROW();
	}
	PG_END_TRY();

	if (failure != NULL)
	{
		PQclear(result);
		report_conn_failure(elevel, conn, call, failure);
		return NULL;
	}
	if (result == NULL)
	{
		report_conn_failure(elevel, conn, call, "no reply to the query");
		return NULL;
	}
	if (PQresultStatus(result) != PGRES_TUPLES_OK &&
		PQresultStatus(result) != PGRES_COMMAND_OK)
	{
		felix_conn_report_result(elevel, result, conn, call);
		return NULL;
	}
	return result;
}

PGresult *
felix_conn_exec(PGconn *conn, const char *call, const char *sql,
				int nparams, const char *const *values, int timeout_ms, int elevel)
{
	int64		deadline = felix_monotonic_ns() + (int64) timeout_ms * 1000000;

	if (!felix_conn_send(conn, call, sql, nparams, values, deadline, elevel))
		return NULL;
	return felix_conn_receive(conn, call, deadline, elevel);
}

PGresult *
felix_conn_exec_prepared(PGconn *conn, const char *call, const char *stmt,
						 const char *sql, int nparams, const char *const *values,
						 bool *prepared, int timeout_ms, int elevel)
{
	int64		deadline = felix_monotonic_ns() + (int64) timeout_ms * 1000000;

	if (!*prepared)
	{
		PGresult   *res;

		if (!send_query(conn, call, SEND_PREPARE, stmt, sql, nparams, NULL, deadline, elevel))
			return NULL;
		res = felix_conn_receive(conn, call, deadline, elevel);
		if (res == NULL)
			return NULL;
		PQclear(res);
		*prepared = true;
	}
	if (!send_query(conn, call, SEND_PREPARED, stmt, NULL, nparams, values, deadline, elevel))
		return NULL;
	return felix_conn_receive(conn, call, deadline, elevel);
}

bool
felix_conn_set_statement_timeout(PGconn *conn, int timeout_ms, int elevel)
{
	char		value[32];
	const char *values[1] = {value};
	PGresult   *res;

	snprintf(value, sizeof(value), "%dms", timeout_ms);
	res = felix_conn_exec(conn, "set_config",
						  "SELECT pg_catalog.set_config('statement_timeout', $1, false)",
						  1, values, timeout_ms, elevel);
	if (res == NULL)
		return false;
	PQclear(res);
	return true;
}

/* ---------------------------------------------------------------------
 * Other nodes
 * ---------------------------------------------------------------------
 */

PGconn *
felix_node_connect(const char *name, const char *application_name, int timeout_ms)
{
	char		address[FELIX_NODE_CONNINFO_LEN];

	if (!felix_node_conninfo_of(name, address, sizeof(address)))
		return NULL;
	return felix_conn_open(felix_peer_conninfo(address), psprintf("node \"%s\"", name),
						   application_name, timeout_ms, DEBUG1);
}

void
felix_node_wake_heartbeat(PGconn *conn, int timeout_ms)
{
	if (conn != NULL)
		PQclear(felix_conn_exec(conn, "felix.heartbeat_now", "SELECT felix.heartbeat_now()",
								0, NULL, timeout_ms, DEBUG1));
}

/* ---------------------------------------------------------------------
 * This node's own address
 * ---------------------------------------------------------------------
 */

int
felix_verify_own_conninfo(int timeout_ms, int elevel)
{
	PGconn	   *conn;
	PGresult   *res;
	char		incarnation[FELIX_INCARNATION_LEN];
	int			verdict = 0;

	conn = felix_conn_open(felix_node_conninfo_resolved(),
						   "this node itself (felix.node_conninfo)", "felix self-check",
						   timeout_ms, elevel);
	if (conn == NULL)
		return felix_conninfo_verified();
	res = felix_conn_exec(conn, "felix.node_identity",
						  "SELECT name, incarnation FROM felix.node_identity()", 0, NULL,
						  timeout_ms, elevel);
	felix_incarnation(incarnation, NULL);
	if (res != NULL && PQntuples(res) == 1 && PQnfields(res) == 2)
	{
		const char *name = PQgetvalue(res, 0, 0);
		const char *inc = PQgetvalue(res, 0, 1);

		if (strcmp(name, felix_node_name_resolved()) == 0 && strcmp(inc, incarnation) == 0)
			verdict = 1;
		else
		{
			verdict = -1;
			if (felix_conninfo_verified() != -1)
				ereport(WARNING,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("felix.node_conninfo of node \"%s\" reaches node \"%s\" (incarnation %s), not this node (incarnation %s)",
								felix_node_name_resolved(), name, inc, incarnation),
						 errdetail("Peers would reach that node when they mean this one; this node does not join the cluster."),
						 errhint("Set felix.node_conninfo to an address of this server and restart it.")));
		}
	}
	PQclear(res);
	felix_conn_close(conn);
	if (verdict != 0)
		felix_set_conninfo_verified(verdict);
	return verdict;
}

/* ---------------------------------------------------------------------
 * Non-blocking connections, driven by a worker's event loop
 * (the ship worker's peers and its replica reports)
 * ---------------------------------------------------------------------
 */

/* Bumped whenever a connection opens or closes: a wait set built on the
 * old sockets must be rebuilt. */
static uint64 async_epoch = 0;

uint64
felix_async_epoch(void)
{
	return async_epoch;
}
void
async_init(FelixAsyncConn *c, const char *what, bool pipeline)
{
	memset(c, 0, sizeof(*c));
	c->state = FELIX_ASYNC_DOWN;
	c->pipeline = pipeline;
	c->backoff_ms = FELIX_ASYNC_BACKOFF_MIN_MS;
	strlcpy(c->what, what, sizeof(c->what));
}

void
async_close(FelixAsyncConn *c)
{
	if (c->conn != NULL)
	{
		PQfinish(c->conn);
		ReleaseExternalFD();
		c->conn = NULL;
		async_epoch++;
	}
	c->state = FELIX_ASYNC_DOWN;
	c->want_read = c->want_write = false;
}

void
async_fail(FelixAsyncConn *c, const char *problem, int64 now_ns)
{
	char		clean[256];
	int			len;

	/* libpq messages span lines; keep ours on one */
	strlcpy(clean, problem, sizeof(clean));
	for (char *q = clean; *q; q++)
		if (*q == '\n' || *q == '\t')
			*q = ' ';
	len = strlen(clean);
	while (len > 0 && (clean[len - 1] == '\n' || clean[len - 1] == ' '))
		clean[--len] = '\0';

	if (strcmp(clean, c->problem) != 0)
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("felix ship: connection to %s failed: %s", c->what, clean),
				 errdetail("Retrying with backoff."),
				 errhint("%s", felix_conn_hint(clean))));
		strlcpy(c->problem, clean, sizeof(c->problem));
	}
	async_close(c);
	c->next_attempt_ns = now_ns + c->backoff_ms * NS_PER_MS;
	c->backoff_ms = Min(c->backoff_ms * 2, FELIX_ASYNC_BACKOFF_MAX_MS);
}

void
async_begin(FelixAsyncConn *c, int64 now_ns)
{
	const char *keywords[4];
	const char *values[4];

	if (c->state != FELIX_ASYNC_DOWN || now_ns < c->next_attempt_ns ||
		c->conninfo[0] == '\0')
		return;

	/* One long-lived descriptor per connection, within fd.c's budget. */
	if (!AcquireExternalFD())
	{
		async_fail(c, "too many open files for another connection", now_ns);
		return;
	}
	/* the conninfo comes last so that it may override the defaults */
	keywords[0] = "application_name";
	values[0] = "felix ship";
	keywords[1] = "options";
	values[1] = "-c search_path=pg_catalog,pg_temp";
	keywords[2] = "dbname";
	values[2] = c->conninfo;
	keywords[3] = NULL;
	values[3] = NULL;
	c->conn = PQconnectStartParams(keywords, values, 1);
	if (c->conn == NULL)
	{
		ReleaseExternalFD();
		async_fail(c, "out of memory", now_ns);
		return;
	}
	if (PQstatus(c->conn) == CONNECTION_BAD)
	{
		async_fail(c, PQerrorMessage(c->conn), now_ns);
		return;
	}
	c->state = FELIX_ASYNC_CONNECTING;
	c->started_ns = now_ns;
	c->serial = ++async_epoch;
	/* PQconnectStart behaves as if PQconnectPoll had said "writing" */
	c->want_read = false;
	c->want_write = true;
}

void
async_connect_poll(FelixAsyncConn *c, int64 now_ns)
{
	if (c->state != FELIX_ASYNC_CONNECTING)
		return;
	switch (PQconnectPoll(c->conn))
	{
		case PGRES_POLLING_READING:
			c->want_read = true;
			c->want_write = false;
			break;
		case PGRES_POLLING_WRITING:
			c->want_read = false;
			c->want_write = true;
			break;
		case PGRES_POLLING_OK:
			if (PQsetnonblocking(c->conn, 1) != 0 ||
				(c->pipeline && PQenterPipelineMode(c->conn) != 1))
			{
				async_fail(c, PQerrorMessage(c->conn), now_ns);
				return;
			}
			c->state = FELIX_ASYNC_READY;
			c->want_read = true;
			c->want_write = false;
			c->backoff_ms = FELIX_ASYNC_BACKOFF_MIN_MS;
			if (c->problem[0] != '\0')
			{
				ereport(LOG,
						(errmsg("felix ship: connected to %s again", c->what)));
				c->problem[0] = '\0';
			}
			break;
		default:
			async_fail(c, PQerrorMessage(c->conn), now_ns);
			return;
	}
	async_check_timeout(c, now_ns);
}

void
async_check_timeout(FelixAsyncConn *c, int64 now_ns)
{
	if (c->state == FELIX_ASYNC_CONNECTING &&
		now_ns - c->started_ns > FELIX_ASYNC_CONNECT_TIMEOUT_MS * NS_PER_MS)
		async_fail(c, psprintf("no connection within %d ms",
							   FELIX_ASYNC_CONNECT_TIMEOUT_MS), now_ns);
}

bool
async_flush(FelixAsyncConn *c, int64 now_ns)
{
	int			rc;

	if (c->state != FELIX_ASYNC_READY)
		return false;
	rc = PQflush(c->conn);
	if (rc < 0)
	{
		async_fail(c, PQerrorMessage(c->conn), now_ns);
		return false;
	}
	c->want_write = (rc == 1);
	return true;
}

int64
async_deadline(FelixAsyncConn *c)
{
	switch (c->state)
	{
		case FELIX_ASYNC_DOWN:
			return c->conninfo[0] != '\0' ? c->next_attempt_ns : PG_INT64_MAX;
		case FELIX_ASYNC_CONNECTING:
			return c->started_ns + FELIX_ASYNC_CONNECT_TIMEOUT_MS * NS_PER_MS;
		case FELIX_ASYNC_READY:
			break;
	}
	return PG_INT64_MAX;
}
