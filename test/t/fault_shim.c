/*
 * fault_shim.c: an LD_PRELOAD library for felix's TAP tests that makes
 * fsync() and fdatasync() fail with EIO for chosen files, so that a test can
 * see what a server does when the kernel reports a failed sync -- or makes
 * pwrite() fail with ENOSPC for them instead, a disk that is full.
 *
 * PostgreSQL's pg_fsync() and pg_fdatasync() (which felix calls) end in
 * the C library's fsync() and fdatasync(), which the postgres binary imports
 * dynamically; a library preloaded into the server therefore stands in for
 * them.  Note that both return 0 without calling anything when the server
 * runs with fsync = off, as PostgreSQL::Test::Cluster sets by default: a
 * test using this shim must set fsync = on.
 *
 * Configuration, read from the environment at each call:
 *
 *	 FELIX_FAULT_DIR	  only files under this directory fail (nothing fails
 *						  when it is unset or empty)
 *	 FELIX_FAULT_TRIGGER  only while this file exists; if its content begins
 *						  with "once", the first failure removes it (claimed
 *						  by unlink, so exactly one call in one process fails);
 *						  if it begins with "slow N", calls do not fail but
 *						  each sleeps N milliseconds first (a slow disk); if
 *						  it begins with "enospc", syncs go through and
 *						  pwrite() fails with ENOSPC instead (a full disk)
 *	 FELIX_FAULT_SUFFIX	  optional: only files whose name ends with this,
 *						  such as ".seg"
 *	 FELIX_FAULT_LOG	  optional: a line is appended here for every failure
 *						  injected ("<pid> <function> <path>")
 *
 * The file a descriptor names is found through /proc/self/fd.  Calls on
 * any other file, and every call while the trigger file is absent, go to
 * the real functions.
 *
 * Build: cc -shared -fPIC -o fault_shim.so fault_shim.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int	(*real_fsync) (int) = NULL;
static int	(*real_fdatasync) (int) = NULL;
static ssize_t (*real_pwrite) (int, const void *, size_t, off_t) = NULL;

static void
log_failure(const char *fn, const char *path)
{
	const char *log = getenv("FELIX_FAULT_LOG");
	char		line[PATH_MAX + 64];
	int			fd;
	int			len;

	if (log == NULL || log[0] == '\0')
		return;
	len = snprintf(line, sizeof(line), "%d %s %s\n", (int) getpid(), fn, path);
	if (len <= 0)
		return;
	if (len >= (int) sizeof(line))
		len = sizeof(line) - 1;
	fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	/* one write with O_APPEND: lines from several processes do not mix */
	if (write(fd, line, len) < 0)
	{
		/* nothing to do: the log is only for the test's information */
	}
	close(fd);
}

/*
 * Whether this call on fd must fail; errno is left as it was.  A write
 * (is_write) fails only under an "enospc" trigger, a sync under any other.
 */
static int
should_fail(int fd, const char *fn, int is_write)
{
	int			saved_errno = errno;
	const char *dir = getenv("FELIX_FAULT_DIR");
	const char *trigger = getenv("FELIX_FAULT_TRIGGER");
	const char *suffix = getenv("FELIX_FAULT_SUFFIX");
	char		link[64];
	char		path[PATH_MAX];
	char		canon_dir[PATH_MAX];
	ssize_t		n;
	size_t		dlen;
	int			fail = 0;

	if (dir == NULL || dir[0] == '\0' || trigger == NULL || trigger[0] == '\0')
		goto out;
	if (access(trigger, F_OK) != 0)
		goto out;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, path, sizeof(path) - 1);
	if (n <= 0)
		goto out;
	path[n] = '\0';

	/* compare with the directory's canonical name, as /proc shows paths */
	if (realpath(dir, canon_dir) == NULL)
		goto out;
	dlen = strlen(canon_dir);
	while (dlen > 1 && canon_dir[dlen - 1] == '/')
		canon_dir[--dlen] = '\0';
	if (strncmp(path, canon_dir, dlen) != 0 || path[dlen] != '/')
		goto out;

	if (suffix != NULL && suffix[0] != '\0')
	{
		size_t		slen = strlen(suffix);
		size_t		plen = strlen(path);

		if (plen < slen || strcmp(path + plen - slen, suffix) != 0)
			goto out;
	}

	/* a one-shot trigger: whoever removes it gets the failure */
	{
		char		buf[32];
		int			tfd = open(trigger, O_RDONLY | O_CLOEXEC);
		ssize_t		got = -1;

		if (tfd >= 0)
		{
			got = read(tfd, buf, sizeof(buf) - 1);
			close(tfd);
		}
		if ((got >= 6 && memcmp(buf, "enospc", 6) == 0) != (is_write != 0))
			goto out;
		if (got >= 4 && memcmp(buf, "once", 4) == 0 && unlink(trigger) != 0)
			goto out;
		if (got >= 5 && memcmp(buf, "slow ", 5) == 0)
		{
			/* a slow disk: the call goes through, late */
			long		ms;
			struct timespec ts;

			buf[got] = '\0';
			ms = strtol(buf + 5, NULL, 10);
			ts.tv_sec = ms / 1000;
			ts.tv_nsec = (ms % 1000) * 1000000L;
			while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
				;
			goto out;
		}
	}

	log_failure(fn, path);
	fail = 1;

out:
	errno = saved_errno;
	return fail;
}

int
fsync(int fd)
{
	if (should_fail(fd, "fsync", 0))
	{
		errno = EIO;
		return -1;
	}
	if (real_fsync == NULL)
		real_fsync = (int (*) (int)) dlsym(RTLD_NEXT, "fsync");
	if (real_fsync == NULL)
	{
		errno = ENOSYS;
		return -1;
	}
	return real_fsync(fd);
}

int
fdatasync(int fd)
{
	if (should_fail(fd, "fdatasync", 0))
	{
		errno = EIO;
		return -1;
	}
	if (real_fdatasync == NULL)
		real_fdatasync = (int (*) (int)) dlsym(RTLD_NEXT, "fdatasync");
	if (real_fdatasync == NULL)
	{
		errno = ENOSYS;
		return -1;
	}
	return real_fdatasync(fd);
}

ssize_t
pwrite(int fd, const void *buf, size_t count, off_t offset)
{
	if (should_fail(fd, "pwrite", 1))
	{
		errno = ENOSPC;
		return -1;
	}
	if (real_pwrite == NULL)
		real_pwrite = (ssize_t (*) (int, const void *, size_t, off_t)) dlsym(RTLD_NEXT, "pwrite");
	if (real_pwrite == NULL)
	{
		errno = ENOSYS;
		return -1;
	}
	return real_pwrite(fd, buf, count, offset);
}
