/*-------------------------------------------------------------------------
 *
 * conninfo.h
 *	  What a libpq connection string says, split into where a server is
 *	  (host, hostaddr, port, dbname) and who connects (user, password and
 *	  the other credentials), and how felix shows one without its secrets.
 *	  See conninfo.c.
 *
 * Locking rule: none; pure functions of their arguments and the settings.
 *
 *-------------------------------------------------------------------------
 */
#ifndef FELIX_CONTROL_CONNINFO_H
#define FELIX_CONTROL_CONNINFO_H

#include "postgres.h"

/* The role a node connects to peers and the control plane as. */
#define FELIX_NODE_ROLE_PREFIX	"felix_node_"
/* The longest node name: its role name must fit in NAMEDATALEN - 1. */
#define FELIX_MAX_NODE_NAME_LEN	(NAMEDATALEN - 1 - (int) sizeof(FELIX_NODE_ROLE_PREFIX) + 1)

/* felix_node_<name> for a node name (palloc'd). */
extern char *felix_node_role(const char *node);

/* This node's name: felix.node_name, or node_<port>. */
extern const char *felix_node_name_resolved(void);

/*
 * This node's conninfo: felix.node_conninfo, or this server's first Unix
 * socket directory, port and felix.database; with user=felix_node_<name>
 * added when it names no user.  Its address part is what peers use to
 * reach this node; its credentials are what this node logs in with.
 */
extern const char *felix_node_conninfo_resolved(void);

/* True when this node hosts the control plane (felix.control_conninfo empty). */
extern bool felix_cp_embedded(void);

/*
 * How this node reaches the control plane: felix.control_conninfo's
 * address and options with this node's credentials, or this node's own
 * conninfo when it hosts the control plane.  Holds secrets: never log it.
 */
extern char *felix_cp_conninfo(void);

/*
 * How this node reaches a peer whose registered (address-only) conninfo is
 * `peer`: the peer's address, this node's credentials and options.  Holds
 * secrets: never log it.
 */
extern char *felix_peer_conninfo(const char *peer);

/* Only the address keywords of a conninfo: what a node registers. */
extern char *felix_conninfo_address(const char *conninfo);

/*
 * A copy of conninfo with the value of every secret keyword (password,
 * sslpassword, and any libpq shows as a password field) replaced by
 * ********; "(invalid connection string)" when it does not parse.
 */
extern char *felix_conninfo_mask(const char *conninfo);

/*
 * At start (from _PG_init): refuse, with a FATAL that does not repeat the
 * value, a conninfo setting that does not parse, holds a secret (those
 * belong in a password file), or -- for felix.control_conninfo -- says
 * who logs in rather than only where the control plane is.
 */
extern void felix_conninfo_check_settings(void);

#endif							/* FELIX_CONTROL_CONNINFO_H */
