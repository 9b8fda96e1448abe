# felix — PGXS build.  `make && make install`, then see README.md for tests.
MODULE_big = felix
EXTENSION  = felix
# Install scripts: 1.0 as released (never edited), and 1.1 and the update
# from 1.0 built from shared parts (src/sql/*.sql) so that both paths
# create the same objects.
DATA       = src/sql/felix--1.0.sql
DATA_built = src/sql/felix--1.1.sql src/sql/felix--1.0--1.1.sql
PGFILEDESC = "felix - replicated log streams for PostgreSQL"

OBJS = \
	src/felix.o \
	src/shmem.o \
	src/base/settings.o \
	src/base/common.o \
	src/base/metrics.o \
	src/base/isolate.o \
	src/base/privilege.o \
	src/base/http.o \
	src/base/wake.o \
	src/storage/crc.o \
	src/storage/format.o \
	src/storage/segment.o \
	src/storage/index.o \
	src/storage/recovery.o \
	src/storage/reader.o \
	src/storage/retention.o \
	src/storage/truncate.o \
	src/storage/genmap.o \
	src/storage/hwm.o \
	src/storage/incarnation.o \
	src/storage/shard.o \
	src/am/tableam.o \
	src/am/scan.o \
	src/am/refuse.o \
	src/am/remote.o \
	src/core/catalog.o \
	src/api/stream.o \
	src/api/agent.o \
	src/api/seclabel.o \
	src/api/publish.o \
	src/api/forward.o \
	src/api/forward_commit.o \
	src/api/pending.o \
	src/api/views.o \
	src/api/operations.o \
	src/core/payload.o \
	src/worker/node.o \
	src/worker/heartbeat.o \
	src/worker/duties.o \
	src/worker/cp_session.o \
	src/worker/reporter.o \
	src/control/client.o \
	src/control/conninfo.o \
	src/control/nodes.o \
	src/control/halts.o \
	src/control/json.o \
	src/control/store.o \
	src/control/store_view.o \
	src/control/store_table.o \
	src/control/store_etcd.o \
	src/control/cpstate.o \
	src/control/cp_heartbeat.o \
	src/control/cp_report.o \
	src/control/cp_duty.o \
	src/control/cp_streams.o \
	src/control/cp_promote.o \
	src/control/cp_sql.o \
	src/control/cpcall.o \
	src/replication/state.o \
	src/replication/rules.o \
	src/replication/lease.o \
	src/replication/quorum.o \
	src/replication/leader.o \
	src/replication/ship.o \
	src/replication/report.o \
	src/replication/report_queue.o \
	src/replication/append.o

PG_CPPFLAGS = -I$(srcdir)/src/include -I$(libpq_srcdir)
# libpq: the node agent and replication talk to peers and the control plane.
SHLIB_LINK_INTERNAL = $(libpq)
# libcurl: the etcd control-plane store (and, later, object storage).
SHLIB_LINK = -lcurl
PG_CFLAGS   = -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare

REGRESS      = setup api refusals views control_plane truncate hostile security utility_matrix quota
REGRESS_OPTS = --temp-instance=./tmp_regress --temp-config=$(srcdir)/test/regress.conf

ISOLATION      = publish_contiguous insert_abort copy_visibility publish_acl_first
ISOLATION_OPTS = --temp-instance=./tmp_isolation --temp-config=$(srcdir)/test/regress.conf \
                 --temp-config=$(srcdir)/test/isolation/isolation.conf \
                 --inputdir=$(srcdir)/test/isolation --outputdir=./output_iso

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# Unit tests of the pure rules (no server): `make unit` builds and runs
# them, each printing TAP.
UNIT_TESTS = test/unit/rules_test

EXTRA_CLEAN = tmp_regress tmp_isolation output_iso results regression.diffs regression.out \
              $(UNIT_TESTS)

PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

src/sql/felix--1.1.sql: src/sql/base.sql src/sql/objects.sql
	cat $^ > $@

src/sql/felix--1.0--1.1.sql: src/sql/update-1.0-1.1.pre.sql src/sql/objects.sql src/sql/update-1.0-1.1.post.sql
	cat $^ > $@

test/unit/rules_test: test/unit/rules_test.c src/replication/rules.c src/include/replication/rules.h
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ test/unit/rules_test.c src/replication/rules.c \
		-L$(pkglibdir) -lpgport

.PHONY: unit
unit: $(UNIT_TESTS)
	@for t in $(UNIT_TESTS); do echo "# $$t"; ./$$t || exit 1; done
